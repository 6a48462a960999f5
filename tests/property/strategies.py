"""Hypothesis strategies for hostile input, reusable by every property test.

Building blocks (any input the toolkit reads):
- ``hostile_text``, ``hostile_numbers``, ``hostile_scalars``: strings and numbers that broke
  or fooled parsers before (quoted numbers, nan/inf, 10**400, non-ASCII digits, option-like
  and path-escaping names, control characters, text-format and shell metacharacters);
- ``hostile_json``: nested dicts and lists of those (playbooks, manifests, records);
- ``mostly(good, bad)``: usually a valid value, sometimes a hostile one, so that generated
  inputs reach the deep rules instead of all failing at the first field.

Inventory parts (``build_inventory`` keyword arguments): ``hosts``, ``groups``,
``host_vars``, ``models`` and ``inventory_parts``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tfsdeploy.core.inventory.catalog import (
    Batching,
    Model,
    Rollout,
    Signature,
    TensorSpec,
    Threads,
    Warmup,
)
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host

HOSTILE_STRINGS = (
    "", " ", "-", "-rf", "--privileged", "-oProxyCommand=touch /tmp/x", ".", "..", "../etc",
    "a/../b", "/", "//", "a/b", "~", "*", "?", "[a]", "a,b", "all", "models", "lock",
    "releases", "current", "proxy", "audit.log", "²", "٣", "\uff11\uff12", "8", "1.5", "1e308",
    "nan", "inf", "-1", "0", "9" * 40, "true", "None", "%", "0%", "150%", "100.0%",
    "a\nb", "a\x00b", "a\tb", 'a"b', "a\\b", "a'b", "{}", "}", "{", "#", "$(id)", "`id`",
    "; rm -rf /", "é", "\u202e", "\ufeff", "x" * 300, "Haproxy:2.6", "registry:5000/",
    "DT_FLOT", "revrt", "canary", "serving_default",
)


def hostile_text() -> st.SearchStrategy[str]:
    """Strings that are wrong in some place the toolkit reads one."""
    return st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=12))


def hostile_numbers() -> st.SearchStrategy[Any]:
    """Numbers out of every range, non-finite, huge, negative, bool, or quoted."""
    return st.one_of(
        st.sampled_from([0, -1, 1, -5, 65535, 65536, 70000, 2**31, 2**63, 2**64, 10**6,
                         10**9, 10**400, -(10**400), 1e308, -1e308, 1e-308, float("nan"),
                         float("inf"), float("-inf"), -0.0, 0.5, True, False]),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(["8", "16384", "1.5", "50", "-1", "1e3", "nan"]),
    )


def hostile_scalars() -> st.SearchStrategy[Any]:
    """Any hostile scalar, or None."""
    return st.one_of(hostile_text(), hostile_numbers(), st.none())


_HOSTILE_SCALARS = hostile_scalars()


def hostile_json(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """JSON-like values (dicts, lists) of hostile scalars: playbooks, records, manifests."""
    return st.recursive(
        hostile_scalars(),
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(hostile_text(), inner, max_size=4)),
        max_leaves=max_leaves)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] | None = None,
           one_in: int = 40) -> st.SearchStrategy[Any]:
    """``good`` usually; ``bad`` (default: any hostile scalar) about once in ``one_in``
    (an inventory has about 40 values: most generated ones then have a hostile value or
    two, and a good share has none and goes on to rendering)."""
    bad = bad if bad is not None else _HOSTILE_SCALARS
    return _roll(one_in).flatmap(lambda hostile: bad if hostile else good)


def _roll(one_in: int) -> st.SearchStrategy[bool]:
    # hypothesis favours the ends of a range: the hostile choice sits in the middle
    half = [False] * (one_in // 2)
    return st.sampled_from([*half, True, *half])


# -- valid values (module-level strategies: building one costs hypothesis more than drawing)

HOST_NAMES = ("h1", "h2", "h3", "gpu-a01", "web.1")
MODEL_NAMES = st.one_of(st.sampled_from(["m", "resnet50", "half_plus_two", "ranker.v2"]),
                        st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True))
ADDRESSES = st.one_of(
    st.tuples(st.integers(1, 254), st.integers(0, 255), st.integers(0, 255),
              st.integers(1, 254)).map(lambda t: ".".join(map(str, t))),
    st.sampled_from(["gpu-a01.example", "::1", "fd00::11", "localhost"]))
HOSTILE_NUMBERS = hostile_numbers()
HOSTILE_TEXT = hostile_text()
HOSTILE_JSON = hostile_json(3)
PORTS = mostly(st.integers(min_value=1, max_value=65535), HOSTILE_NUMBERS)
GPU = st.builds(Gpu, mostly(st.integers(0, 3), HOSTILE_NUMBERS),
                mostly(st.sampled_from([16384, 24576, 40960]), HOSTILE_NUMBERS),
                mostly(st.just("NVIDIA T4"), HOSTILE_TEXT))
GPUS = mostly(st.lists(GPU, max_size=2, unique_by=lambda g: g.index), HOSTILE_JSON)

VAR_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "ssh_user": mostly(st.sampled_from(["root", "deploy"]), HOSTILE_TEXT),
    "ssh_port": PORTS,
    "ssh_key": mostly(st.sampled_from([None, "/root/.ssh/id_ed25519"])),
    "data_root": mostly(st.sampled_from(["/srv/tfsdeploy", "/data/tfs", "/srv/a.b_c-d/"]),
                        HOSTILE_TEXT),
    "image": mostly(st.sampled_from(["tensorflow/serving:2.21.0-gpu",
                                     "10.87.0.1:5000/tfserving-emulator:2.21.0",
                                     "registry.example:5000/tfs@sha256:" + "a" * 64]),
                    HOSTILE_TEXT),
    "tfserving_version": mostly(st.sampled_from(["2.21.0", "2.4.1", "2.21.0-gpu"]),
                                HOSTILE_TEXT),
    "grpc_port": PORTS,
    "rest_port": PORTS,
    "slot_ports": mostly(st.fixed_dictionaries({"blue": st.tuples(PORTS, PORTS),
                                                "green": st.tuples(PORTS, PORTS)}),
                         hostile_json(4)),
    "gpu_safety_margin": mostly(st.floats(1.0, 2.0), HOSTILE_NUMBERS),
    "gpu_headroom": mostly(st.floats(0.0, 0.5), HOSTILE_NUMBERS),
    "gpu_context_mib": mostly(st.sampled_from([0, 256, 512, 1024]), HOSTILE_NUMBERS),
    "monitoring_path": mostly(st.just("/monitoring/prometheus/metrics"), HOSTILE_TEXT),
    "file_system_poll_wait_seconds": mostly(st.integers(0, 5), HOSTILE_NUMBERS),
    "grpc_max_connection_age_ms": mostly(st.sampled_from([0, 300000]), HOSTILE_NUMBERS),
    "enable_model_warmup": mostly(st.booleans()),
    "max_num_load_retries": mostly(st.integers(0, 3), HOSTILE_NUMBERS),
    "docker_gpus": mostly(st.sampled_from([None, "all", "1", "device=0,1"]), HOSTILE_TEXT),
}
HOST_VARS = st.lists(
    mostly(st.sampled_from(sorted(VAR_VALUES)).flatmap(
        lambda key: st.tuples(st.just(key), VAR_VALUES[key])),
        st.tuples(st.sampled_from(["ssh_prot", "gpus", "", "x y"]), _HOSTILE_SCALARS)),
    max_size=3).map(dict)


def host_vars() -> st.SearchStrategy[dict[str, Any]]:
    """A few vars, mostly valid, sometimes an unknown key or a hostile value."""
    return HOST_VARS


HOST = st.builds(Host, mostly(st.sampled_from(HOST_NAMES), HOSTILE_TEXT),
                 mostly(ADDRESSES, HOSTILE_TEXT), gpus=GPUS,
                 vars=mostly(HOST_VARS, HOSTILE_JSON))
HOSTS = mostly(st.lists(HOST, min_size=1, max_size=4, unique_by=lambda h: h.name),
               HOSTILE_JSON)


def hosts() -> st.SearchStrategy[Any]:
    """A list of Host, mostly valid (or, rarely, something that is not a list of hosts)."""
    return HOSTS


@st.composite
def groups(draw: st.DrawFn, names: list[str]) -> Any:
    """Groups of the hosts ``names``, mostly valid."""
    members = st.lists(st.sampled_from(names), max_size=3) if names else st.just([])
    group = st.builds(Group, mostly(members, HOSTILE_JSON), vars=mostly(HOST_VARS, HOSTILE_JSON))
    return draw(mostly(st.dictionaries(mostly(st.sampled_from(["g", "canary", "main"]),
                                              HOSTILE_TEXT), group, max_size=2),
                       HOSTILE_JSON))


DIMS = st.tuples(st.just(-1), mostly(st.integers(1, 8), HOSTILE_NUMBERS))
TENSORS = st.dictionaries(mostly(st.sampled_from(["x", "y", "input_1"]), HOSTILE_TEXT),
                          st.builds(TensorSpec,
                                    mostly(st.sampled_from(["DT_FLOAT", "DT_INT64"]),
                                           HOSTILE_TEXT),
                                    mostly(DIMS, HOSTILE_JSON)),
                          min_size=1, max_size=2)


@st.composite
def batching(draw: st.DrawFn) -> Any:
    """Batching parameters whose allowed sizes end at max_batch_size (when valid)."""
    size = draw(mostly(st.sampled_from([1, 8, 32]), HOSTILE_NUMBERS))
    sizes = (size,) if isinstance(size, int) and not isinstance(size, bool) else ()
    return draw(st.builds(
        Batching, enabled=mostly(st.booleans()), max_batch_size=st.just(size),
        batch_timeout_micros=mostly(st.sampled_from([0, 2000, 20000]), HOSTILE_NUMBERS),
        max_enqueued_batches=mostly(st.sampled_from([1, 8, 64]), HOSTILE_NUMBERS),
        num_batch_threads=mostly(st.sampled_from([1, 2, 4]), HOSTILE_NUMBERS),
        allowed_batch_sizes=mostly(st.just(sizes), HOSTILE_JSON),
        thread_pool_name=mostly(st.sampled_from([None, "pool_1"]), HOSTILE_TEXT)))


MODEL = st.builds(
    Model,
    name=mostly(MODEL_NAMES, HOSTILE_TEXT),
    source=mostly(st.just("/nonexistent/models"), HOSTILE_TEXT),
    signature=mostly(st.builds(Signature, TENSORS, TENSORS), HOSTILE_JSON),
    memory_mib=mostly(st.sampled_from([256, 1024, 2000]), HOSTILE_NUMBERS),
    latency_slo_ms=mostly(st.sampled_from([50, 100.5, 1500]), HOSTILE_NUMBERS),
    hosts=mostly(st.sampled_from(["all", "all", "h*", "h1,h2,h3,gpu-a01,web.1"]),
                 HOSTILE_TEXT),
    batching=mostly(batching(), HOSTILE_JSON),
    threads=mostly(st.builds(Threads, intra_op=mostly(st.integers(0, 4), HOSTILE_NUMBERS),
                             grpc_max_threads=mostly(st.sampled_from([0, 0, 2, 64]),
                                                     HOSTILE_NUMBERS)),
                   HOSTILE_JSON),
    warmup=mostly(st.builds(Warmup, samples=mostly(st.integers(1, 50), HOSTILE_NUMBERS),
                            p99_ms=mostly(st.sampled_from([None, 100.0]), HOSTILE_NUMBERS)),
                  HOSTILE_JSON),
    rollout=mostly(st.builds(
        Rollout, serial=mostly(st.sampled_from([(1, "100%"), (1, "25%", "100%")]),
                               HOSTILE_JSON),
        on_failure=mostly(st.sampled_from(["revert", "stay"]), HOSTILE_TEXT),
        strategy=mostly(st.sampled_from(["dual-slot", "recreate"]), HOSTILE_TEXT),
        keep_releases=mostly(st.integers(2, 5), HOSTILE_NUMBERS),
        load_timeout_s=mostly(st.sampled_from([30, 300.0]), HOSTILE_NUMBERS)),
        HOSTILE_JSON),
    labels=mostly(st.dictionaries(mostly(st.sampled_from(["stable", "canary"]), HOSTILE_TEXT),
                                  mostly(st.sampled_from(["release", "release", 3]),
                                         _HOSTILE_SCALARS),
                                  max_size=2),
                  HOSTILE_JSON),
    port_offset=mostly(st.just(0), HOSTILE_NUMBERS),  # models() spreads them out
    expected_concurrency=mostly(st.sampled_from([0, 16]), HOSTILE_NUMBERS),
)


def catalog_model() -> st.SearchStrategy[Any]:
    """A Model whose every field, nested ones included, is mostly valid."""
    return MODEL


def _spread_ports(models: list[Any]) -> list[Any]:
    """Give the i-th model port_offset 100 x i (unless it was drawn hostile)."""
    return [replace(m, port_offset=100 * i) if m.port_offset == 0 else m
            for i, m in enumerate(models)]


MODELS = mostly(st.lists(MODEL, min_size=1, max_size=3, unique_by=lambda m: m.name)
                .map(_spread_ports),
                HOSTILE_JSON)


def models() -> st.SearchStrategy[Any]:
    """A list of Model with distinct names and ports (or, rarely, something else)."""
    return MODELS


DEFAULTS = mostly(HOST_VARS, HOSTILE_JSON)


@st.composite
def inventory_parts(draw: st.DrawFn) -> dict[str, Any]:
    """Keyword arguments of ``build_inventory``: hosts, groups, defaults and models."""
    host_list = draw(HOSTS)
    names = [h.name for h in host_list if isinstance(h, Host) and isinstance(h.name, str)] \
        if isinstance(host_list, list) else []
    return {"hosts": host_list, "groups": draw(groups(names)), "defaults": draw(DEFAULTS),
            "models": draw(MODELS)}


# -- playbooks and task lists (playbooks/*.yml, tasks/*.yml) -------------------------------

PROJECT = Path(__file__).resolve().parents[2]
REAL_PLAYBOOKS = {p.name: yaml.safe_load(p.read_text())
                  for p in sorted((PROJECT / "playbooks").glob("*.yml"))}
REAL_TASK_LISTS = {p.name: p.read_bytes() for p in sorted((PROJECT / "tasks").glob("*.yml"))}
NAN, INF = float("nan"), float("inf")
HOSTILE_SCALARS = _HOSTILE_SCALARS

SERIAL_STEPS = st.one_of(
    st.sampled_from([1, 2, "25%", "100%", "ten", "150%", "100.5%", "0%", "0.5%", "-1", "1e3",
                     "%", "", " 25%", "25 %", "٣%", -1, 0, 10**30, 1.5, True, None, NAN]),
    st.integers(-3, 5), HOSTILE_TEXT)
SERIALS = st.one_of(
    st.lists(mostly(st.sampled_from([1, 2, "25%", "100%"]), SERIAL_STEPS, 3), max_size=4),
    st.sampled_from(["25%", 1, {}]), HOSTILE_JSON)
PERCENTS = st.one_of(st.sampled_from(["ten", "150%", "50%", -1, 150, 100.0001, NAN, INF, -0.0,
                                      0, 100, 25.5, "50"]), HOSTILE_NUMBERS)
ON_FAILURE = st.one_of(st.sampled_from(["revert", "stay", "revrt", "Revert", "REVERT", "stay ",
                                        "", "rollback", None, 1, True]), HOSTILE_TEXT)
MODES = st.one_of(st.sampled_from(["parallel", "batches", "serial", "Parallel", "", None]),
                  HOSTILE_TEXT)
# where a phase finds its task list: tasks/<name>; missing ones, names leaving tasks/, the
# playbook itself (an include cycle of sorts), names too long for the file system, NUL
TASK_FILES = st.one_of(
    st.sampled_from(sorted(REAL_TASK_LISTS)),
    st.sampled_from(["missing.yml", "", ".", "..", "../playbooks/custom.yml", "../tasks/stage.yml",
                     "x" * 300, "a\x00b.yml", "stage", "STAGE.yml", "/nonexistent/x.yml",
                     "custom0.yml", "custom1.yml", "sub/", "é.yml"]),
    HOSTILE_TEXT)
TIMEOUTS = st.one_of(st.sampled_from([NAN, INF, -INF, -1, -0.0, 0, 0.001, 1, 30, 60.0, 86400,
                                      86401, 1e308, 10**30, "30", "ten", True, None]),
                     HOSTILE_NUMBERS)
COUNTS = st.one_of(st.sampled_from([-5, -1, 0, 1, 20, 512, 2**31, 2**63, 10**30, 1.5, "20",
                                    True, NAN]), HOSTILE_NUMBERS)
ARGV_WORDS = st.one_of(st.sampled_from(["true", "echo", "", "\x00", "a\x00b", "-rf", "$(id)",
                                        "a b", "é", "x" * 300, "--", ";", "|", "\n"]),
                       st.text(max_size=8))
ARGVS = st.one_of(st.lists(ARGV_WORDS, min_size=1, max_size=4),
                  st.lists(ARGV_WORDS, max_size=3).map(lambda words: [*words, "a\x00b"]),
                  st.sampled_from(["echo hi", [], None]), HOSTILE_JSON)
STEP_PARAMETERS: dict[str, st.SearchStrategy[Any]] = {
    "argv": ARGVS,
    "shell": st.one_of(st.sampled_from(["true", "", "exit 3", "a\x00b", "echo \x00", "$(id)"]),
                       HOSTILE_SCALARS),
    "timeout_s": TIMEOUTS, "min_healthy_s": TIMEOUTS,
    "ignore_errors": st.one_of(st.booleans(), HOSTILE_SCALARS),
    "skip_if_warm": st.one_of(st.booleans(), HOSTILE_SCALARS),
    "rounds": COUNTS, "reserve_mib": COUNTS,
    "strategy": st.one_of(st.sampled_from(["dual-slot", "recreate", "blue-green", None]),
                          HOSTILE_TEXT),
    "to": st.one_of(st.sampled_from(["new", "old", "New", "blue", ""]), HOSTILE_TEXT),
    "job": HOSTILE_SCALARS,  # the operation's own first argument: never a task's parameter
}


def _actions() -> list[str]:
    from tfsdeploy.run.operations import registry

    return sorted(registry())


ACTIONS = st.one_of(st.sampled_from(_actions()),
                    st.sampled_from(["", "Local", "gate-available", "gate_availabel", "nope",
                                     "__init__", "registry", "check ssh"]),
                    HOSTILE_SCALARS)


# the custom steps and those taking numbers, drawn more often than the others
NUMBERED_ACTIONS = ["local", "local", "remote", "remote", "gate_rest", "gate_available",
                    "gate_warmup", "check_disk", "drain_old", "gate_health"] * 2
GOOD_STEP_PARAMETERS: dict[str, st.SearchStrategy[Any]] = {
    "argv": st.sampled_from([["true"], ["echo", "a b"]]), "shell": st.just("true"),
    "timeout_s": st.sampled_from([0.5, 1, 30, 60.0]),
    "min_healthy_s": st.sampled_from([0, 1, 5.0]), "ignore_errors": st.booleans(),
    "skip_if_warm": st.booleans(), "rounds": st.integers(1, 50),
    "reserve_mib": st.integers(0, 1024), "strategy": st.sampled_from(["dual-slot", "recreate"]),
    "to": st.sampled_from(["new", "old"]),
}


def _taken(action: Any) -> list[str]:
    """The parameters a step takes (none for an unknown action)."""
    from tfsdeploy.run.operations import registry
    from tfsdeploy.run.operations.step import parameters

    operation = registry().get(action) if isinstance(action, str) else None
    return sorted(parameters(operation)) if operation is not None else []


@st.composite
def task_entries(draw: st.DrawFn) -> Any:
    """One entry of a task list: mostly a known action with parameters it takes, mostly
    valid; sometimes one it does not take, an unknown key or something else entirely."""
    action = draw(mostly(st.sampled_from([*_actions(), *NUMBERED_ACTIONS]), ACTIONS, 16))
    params = [key for key in _taken(action) if draw(st.booleans())]
    if draw(_roll(8)):  # one it may not take
        params.append(draw(st.sampled_from(sorted(STEP_PARAMETERS))))
    if action == "local":
        params = ["argv", *params]
    if action == "remote":  # one of argv and shell (both is a refusal of its own)
        params = [draw(st.sampled_from(["argv", "shell"])),
                  *(p for p in params if p not in ("argv", "shell"))]
    task: dict[Any, Any] = {"name": draw(mostly(st.text(max_size=20), HOSTILE_SCALARS, 16)),
                            "action": action}
    with_ = {key: draw(mostly(GOOD_STEP_PARAMETERS[key], STEP_PARAMETERS[key], 4)
                       if key in GOOD_STEP_PARAMETERS else STEP_PARAMETERS[key])
             for key in dict.fromkeys(params)}
    if with_ or draw(st.booleans()):
        task["with"] = draw(mostly(st.just(with_), HOSTILE_JSON, 20))
    if draw(_roll(20)):
        task[draw(st.sampled_from(["when", "retries", "With", "args", "", "1"]))] = \
            draw(HOSTILE_SCALARS)
    return draw(mostly(st.just(task), HOSTILE_JSON, 30))


TASK_LIST = mostly(st.lists(task_entries(), min_size=1, max_size=4), HOSTILE_JSON, 20)


def _good_step(draw: st.DrawFn, action: str) -> dict[str, Any]:
    """``action`` with a valid value for every parameter it takes (remote: argv or shell)."""
    taken = _taken(action)
    if action == "remote":
        taken = [k for k in taken if k not in ("argv", "shell")] + \
            [draw(st.sampled_from(["argv", "shell"]))]
    return {"name": action, "action": action,
            "with": {key: draw(GOOD_STEP_PARAMETERS[key]) for key in taken}}


@st.composite
def mutated_task_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid task list of steps that take parameters, one parameter of one step set to a
    hostile value (or, now and then, removed, or one the step does not take added)."""
    steps = [_good_step(draw, action) for action in
             draw(st.lists(st.sampled_from(sorted(set(NUMBERED_ACTIONS))), min_size=1,
                           max_size=3))]
    target = draw(st.sampled_from(steps))["with"]
    move = draw(st.sampled_from(["value", "value", "value", "value", "drop", "add"]))
    if move == "value":
        key = draw(st.sampled_from(sorted(target)))
        target[key] = draw(STEP_PARAMETERS[key])
    elif move == "drop":
        target.pop(draw(st.sampled_from(sorted(target))))
    else:
        key = draw(st.sampled_from(sorted(STEP_PARAMETERS)))
        target[key] = draw(STEP_PARAMETERS[key])
    return steps
PLAYBOOK_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(st.text(max_size=10), HOSTILE_SCALARS), "serial": SERIALS,
    "max_fail_percentage": PERCENTS, "on_failure": ON_FAILURE, "forks": COUNTS,
    "phases": st.one_of(st.just([]), HOSTILE_JSON),
}
PHASE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(st.text(max_size=10), HOSTILE_SCALARS), "mode": MODES,
    "tasks": TASK_FILES, "rescue": st.one_of(TASK_FILES, st.none()),
}


@st.composite
def playbook_documents(draw: st.DrawFn, changes: int = 1) -> Any:
    """A project playbook changed in ``changes`` places: a field set to a hostile value
    (the playbook's or a phase's), a key removed or added, a phase pointed at a custom task
    list (``custom0.yml``, ``custom1.yml``), or the whole document replaced."""
    import copy

    doc = copy.deepcopy(draw(st.sampled_from([REAL_PLAYBOOKS[k] for k in sorted(REAL_PLAYBOOKS)])))
    for _ in range(changes):
        kind = draw(st.sampled_from(["field", "field", "field", "phase", "phase", "custom",
                                     "unknown", "drop", "shape"]))
        phases = doc.get("phases") if isinstance(doc, dict) else None
        phase = draw(st.sampled_from(phases)) if isinstance(phases, list) and phases else None
        if kind == "shape":
            doc = draw(st.one_of(HOSTILE_JSON, st.just([doc]), st.just(None)))
        elif not isinstance(doc, dict):
            continue
        elif kind == "field":  # the batch policy's fields the most
            key = draw(st.sampled_from([*PLAYBOOK_FIELDS, "serial", "max_fail_percentage"]))
            doc[key] = draw(PLAYBOOK_FIELDS[key])
        elif kind == "phase" and isinstance(phase, dict):
            key = draw(st.sampled_from(sorted(PHASE_FIELDS)))
            phase[key] = draw(PHASE_FIELDS[key])
        elif kind == "custom" and isinstance(phase, dict):
            phase[draw(st.sampled_from(["tasks", "tasks", "rescue"]))] = \
                draw(st.sampled_from(["custom0.yml", "custom1.yml"]))
        elif kind == "unknown":
            target = phase if isinstance(phase, dict) and draw(st.booleans()) else doc
            target[draw(st.sampled_from(["retries", "when", "hosts", "Serial", "", "tasks "]))] \
                = draw(HOSTILE_SCALARS)
        elif kind == "drop":
            target = phase if isinstance(phase, dict) and draw(st.booleans()) else doc
            if target:
                target.pop(draw(st.sampled_from(sorted(target, key=str))))
    return doc


@dataclass(frozen=True)
class PlaybookCase:
    """A playbook file and the task lists beside it (``tasks/*.yml``: the project's and two
    custom ones), as bytes; ``duplicated`` names the file given a duplicate key on purpose."""

    playbook: bytes
    task_lists: dict[str, bytes]
    duplicated: str | None = None

    def __repr__(self) -> str:
        # the project's task lists as they are would bury the generated part of a report
        changed = {name: data for name, data in self.task_lists.items()
                   if data != REAL_TASK_LISTS.get(name)}
        return (f"PlaybookCase(playbook={self.playbook!r}, changed_task_lists={changed!r}, "
                f"duplicated={self.duplicated!r})")


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000)


def bomb(levels: int, key: str = "argv") -> str:
    """A task list of a few hundred bytes whose ``with.<key>`` expands (through YAML aliases)
    to 10**levels strings."""
    lines = ["- action: check_ssh", "  name: &l0 [a, a, a, a, a, a, a, a, a, a]"]
    lines += [f"  k{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"- action: local\n  with: {{{key}: *l{levels - 1}}}\n"])


RAW_TEXTS = st.sampled_from([
    b"", b"   \n", b"---\n", b"null\n", b"[]\n", b"{}\n", b"- a\n- b\n", b"42\n", b"\xff\xfe",
    b"name: \xff\n", b"\x00", b"name: a\x00b\n", b"name: [\n", b"name: {a: 1\n", b": :\n",
    b"!!python/object/apply:os.system ['touch /tmp/battery-pwned']\n",
    b"phases: !!python/name:os.system\n", b"&a [*a]\n", b"&a {phases: [*a]}\n",
    b"[" * 3000 + b"]" * 3000, b"{a: " * 400 + b"1" + b"}" * 400,
    b"- " * 2000 + b"x\n", b"name: x\n\tphases: []\n", b"%YAML 9.9\n---\nname: x\n",
    b"--- a\n--- b\n", b"? [a, b]\n: c\n", b"name: !!binary aGVsbG8=\n",
    b"name: 2020-01-01\nphases: []\n", b"<<: {name: x}\nphases: []\n",
])


@st.composite
def damaged(draw: st.DrawFn, text: str) -> tuple[bytes, bool]:
    """``text`` as a damaged file holds it: not UTF-8, with a BOM, cut short, indented with
    tabs, a duplicate key, a YAML bomb, deep nesting or junk. Returns the bytes and whether
    a key was duplicated."""
    kind = draw(st.sampled_from(["latin1", "utf16", "bom", "cut", "tabs", "duplicate",
                                 "duplicate", "bomb", "raw", "raw", "junk"]))
    data = text.encode()
    if kind == "latin1":
        return ("é" + text).encode("latin-1", errors="replace"), False
    if kind == "utf16":
        return text.encode("utf-16"), False
    if kind == "bom":
        return b"\xef\xbb\xbf" + data, False
    if kind == "cut":
        return data[:draw(st.integers(0, len(data)))], False
    if kind == "tabs":
        return data.replace(b"  ", b"\t"), False
    if kind == "duplicate":
        return _duplicate_key(draw, text)
    if kind == "bomb":
        return bomb(draw(st.integers(3, 9)), draw(st.sampled_from(["argv", "unknown"]))
                    ).encode(), False
    if kind == "raw":
        return draw(RAW_TEXTS), False
    return draw(st.binary(max_size=40)), False  # junk


def _duplicate_key(draw: st.DrawFn, text: str) -> tuple[bytes, bool]:
    """A top-level key written twice (a playbook), or a task with two ``action`` keys."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        node = None
    keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)
            and k.style is None and k.value.isidentifier()] \
        if isinstance(node, yaml.MappingNode) else []
    if keys:
        key = draw(st.sampled_from(keys))
        value = draw(st.sampled_from(["null", "1", "x", "[]"]))
        return (text + f"\n{key}: {value}\n").encode(), True
    # the last action is the one PyYAML would keep: a valid task, were it taken
    return (text + "\n- action: local\n  action: check_ssh\n").encode(), True


@st.composite
def playbook_cases(draw: st.DrawFn) -> PlaybookCase:
    """A generated playbook beside the project's task lists and two generated ones, with one
    kind of trouble, so that each kind reaches the checks behind the others: the playbook
    changed (see ``playbook_documents``), a phase running a generated task list, one file
    the loader reads damaged (see ``damaged``), or nothing at all."""
    trouble = draw(st.sampled_from(["change", "change", "steps", "steps", "damage", "none"]))
    doc = draw(playbook_documents(changes=int(trouble == "change")))
    phases = doc.get("phases") if isinstance(doc, dict) else None
    if trouble == "steps" and isinstance(phases, list) and phases:
        phase = draw(st.sampled_from(phases))
        if isinstance(phase, dict):
            phase["tasks"] = draw(st.sampled_from(["custom0.yml", "custom1.yml"]))
    playbook = _dump(doc)
    files = dict(REAL_TASK_LISTS) | {f"custom{i}.yml": _dump(draw(TASK_LIST)).encode()
                                     for i in range(2)}
    if trouble != "damage":
        return PlaybookCase(playbook=playbook.encode(), task_lists=files)
    named = sorted(set(re.findall(r"^\s*(?:tasks|rescue): (\S+)$", playbook, re.MULTILINE))
                   & set(files))
    victim = draw(st.sampled_from(["custom.yml", *named]))
    data, duplicated = draw(damaged(playbook if victim == "custom.yml"
                                    else files[victim].decode()))
    if victim != "custom.yml":
        files[victim] = data
    return PlaybookCase(playbook=data if victim == "custom.yml" else playbook.encode(),
                        task_lists=files, duplicated=victim if duplicated else None)


# -- command-line arguments of the fab tasks (tasks.py) -------------------------------------

TMP = "{tmp}"  # a test's scratch directory, put in place by the test
NUMBER_ARGS = st.one_of(
    st.sampled_from(["0", "1", "-1", "-0", "0.5", "20", "1e308", "1e400", "-1e308", "nan",
                     "inf", "-inf", "NaN", "1_000", "0x10", "٣", "\uff11", "", " ", " 5", "5 ",
                     "ten", "1e-320", "2147483648", "9" * 40, "True", "1,5", "½"]),
    HOSTILE_NUMBERS.map(str), HOSTILE_TEXT)
TESTBED_MODELS = ("half_plus_two", "resnet50")  # inventory/testbed.py
MODEL_ARGS = st.one_of(st.sampled_from([
    *TESTBED_MODELS, "HALF_PLUS_TWO", "half_plus_two/..", "../x", "a/b", "", ".", "..",
    "half_plus_two ", "résnet", "half_plus_two\n", "m" * 200]), HOSTILE_TEXT)
# testbed hosts tb1..tb3, groups canary, main, loadgens
PATTERN_ARGS = st.one_of(st.sampled_from([
    "all", "tb1", "tb*", "canary", "main", "loadgens", "tb1,tb2", "nomatch", "*", "", " ", ",",
    " , ", "[", "[!", "tb[", "?b1", "tb1,nomatch", "\x00", "all,-tb1", "TB1", "tb1 ", "tb?",
    "gpu-a*"]), HOSTILE_TEXT)
VERSION_ARGS = st.one_of(st.sampled_from(["1", "2", "3", "0", "-1", "4", "0003", "1e3", "٣", "",
                                          " 2", "9" * 40, "nan", "2.0", "+2", "v2"]),
                         HOSTILE_TEXT)
RELEASE_ARGS = st.one_of(
    st.builds(lambda d, t, v: f"r{d:08d}-{t:09d}-v{v}", st.integers(20200101, 20991231),
              st.integers(0, 235959999), st.integers(1, 10**6)),
    st.sampled_from(["../../etc", "r20250101-000000000-v1/../..", "", "latest", "r1",
                     "r20250101-000000000-v0", "r20250101-000000000-v1\n", "*"]),
    HOSTILE_TEXT)
WEIGHT_ARGS = st.one_of(st.sampled_from(["5,25,50", "5", "50,25", "0", "100", "5,,25", "a,b",
                                         "", " 5 , 25 ", "5;25", "1e1", "-5", "5,25,50,75,99",
                                         "5,5", "\u0665"]), HOSTILE_TEXT)
SINCE_ARGS = st.one_of(st.sampled_from([
    "10m", "2h", "30s", "1h30m", "0s", "500ms", "2024-01-02T03:04:05Z",
    "2024-01-02T03:04:05+02:00", "2024-01-02T03:04:05.123456Z", "junk", "", "-10m", "1e400s",
    "10x", "yesterday", "1700000000", "1969-12-31T23:59:59Z", "9999-12-31T23:59:59Z", "10 m",
    "h", "m"]), HOSTILE_TEXT)
DURATION_ARGS = st.one_of(st.sampled_from([
    "10s", "500ms", "2m", "1.5h", "0", "0s", "-1s", "1e400s", "ten", "", "10 s", "5us", "25%",
    "150%", "1h30m", "nan", "inf", ".5s", "3"]), HOSTILE_TEXT)
OUTPUT_FILE_ARGS = st.sampled_from([
    f"{TMP}/out.json", TMP, f"{TMP}/missing/dir/x.json", f"{TMP}/a\x00b", f"{TMP}/{'x' * 300}",
    "", f"{TMP}/file.txt/x", f"{TMP}/file.txt"])
OUTPUT_DIR_ARGS = st.sampled_from([f"{TMP}/render", TMP, f"{TMP}/file.txt", f"{TMP}/a\x00b", "",
                                   f"{TMP}/file.txt/sub", f"{TMP}/{'x' * 300}", " "])
INPUT_FILE_ARGS = st.sampled_from([f"{TMP}/missing.json", TMP, f"{TMP}/a\x00b", "",
                                   f"{TMP}/{'x' * 300}", f"{TMP}/file.txt", f"{TMP}/sweep.json"])
INVENTORY_ARGS = st.sampled_from(["{project}/inventory/testbed.py", f"{TMP}/missing.py", TMP,
                                  f"{TMP}/a\x00b", f"{TMP}/{'x' * 300}", "", f"{TMP}/file.txt"])
PLAYBOOK_ARGS = st.sampled_from(["{project}/playbooks/deploy.yml",
                                 "{project}/playbooks/rollback.yml",
                                 "{project}/playbooks/prune.yml", f"{TMP}/missing.yml", TMP,
                                 f"{TMP}/file.txt", f"{TMP}/a\x00b", f"{TMP}/{'x' * 300}", ""])
HOOKS_ARGS = st.sampled_from([f"{TMP}/nohooks", f"{TMP}/file.txt", "", f"{TMP}/a\x00b"])
NOTIFY_ARGS = st.lists(st.sampled_from(["junk", "http://127.0.0.1:1/x", "file:///etc/passwd",
                                        "http://", "https://[::1", "", "ftp://127.0.0.1/",
                                        "http://127.0.0.1:1/a b", "http://\x00/"]),
                       min_size=1, max_size=2)
EXEC_ARGS = st.lists(st.one_of(st.sampled_from(["true", "", "\x00", "-rf", "$(id)", "a b"]),
                               HOSTILE_TEXT), max_size=3)

# what each option of the tasks is given, by its Python name
OPTION_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "model": MODEL_ARGS, "hosts": PATTERN_ARGS, "limit": PATTERN_ARGS, "loadgens": PATTERN_ARGS,
    "version": VERSION_ARGS, "release": VERSION_ARGS, "data_version": VERSION_ARGS,
    "to": RELEASE_ARGS, "canary_weights": WEIGHT_ARGS, "since": SINCE_ARGS,
    "duration": DURATION_ARGS, "interval": DURATION_ARGS, "release_at": DURATION_ARGS,
    "start_margin": DURATION_ARGS, "timeout": DURATION_ARGS,
    "json_file": OUTPUT_FILE_ARGS, "log_file": OUTPUT_FILE_ARGS,
    "metrics_file": OUTPUT_FILE_ARGS, "report": OUTPUT_FILE_ARGS,
    "sweep_plot": OUTPUT_FILE_ARGS, "out": OUTPUT_DIR_ARGS, "sweep_report": INPUT_FILE_ARGS,
    "inventory": INVENTORY_ARGS, "playbook": PLAYBOOK_ARGS, "hooks": HOOKS_ARGS,
    "notify": NOTIFY_ARGS, "write": OUTPUT_FILE_ARGS, "budget": DURATION_ARGS,
    "step": DURATION_ARGS, "for_": DURATION_ARGS, "tune_report": INPUT_FILE_ARGS,
    "host": PATTERN_ARGS,
}
_OUT = st.sampled_from([f"{TMP}/out.json", f"{TMP}/new/dir/out.json"])
# values each option takes, so that a hostile one reaches the checks behind the others
GOOD_OPTION_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(TESTBED_MODELS),
    "hosts": st.sampled_from(["all", "tb1", "tb*", "canary", "main", "tb1,tb2"]),
    "limit": st.sampled_from(["all", "tb1", "tb*", "tb1,tb2,tb3"]),
    "loadgens": st.sampled_from(["loadgens", "tb1"]),
    "version": st.sampled_from(["1", "2", "3"]), "release": st.sampled_from(["2", "3"]),
    "data_version": st.sampled_from(["1", "2"]),
    "to": RELEASE_ARGS.filter(lambda v: re.fullmatch(r"r\d{8}-\d{9}-v[1-9]\d*", v) is not None),
    "canary_weights": st.sampled_from(["5,25,50", "5", "10,50"]),
    "since": st.sampled_from(["10m", "2h", "1h30m", "2025-01-31T08:00:00Z"]),
    "duration": st.sampled_from(["10s", "500ms", "2m"]), "interval": st.just("1s"),
    "release_at": st.sampled_from(["25%", "20s"]), "start_margin": st.just("15s"),
    "timeout": st.just("10s"), "json_file": _OUT, "log_file": _OUT, "metrics_file": _OUT,
    "report": _OUT, "sweep_plot": st.just(f"{TMP}/plot.png"), "out": st.just(f"{TMP}/render"),
    "sweep_report": st.just(f"{TMP}/sweep.json"),
    "inventory": st.just("{project}/inventory/testbed.py"),
    "playbook": st.sampled_from(["{project}/playbooks/deploy.yml",
                                 "{project}/playbooks/rollback.yml"]),
    "hooks": st.just(f"{TMP}/hooks"), "notify": st.just(["http://127.0.0.1:1/x"]),
    "write": _OUT, "budget": st.sampled_from(["10m", "90s"]), "step": st.just("5s"),
    "for_": st.just("2s"), "tune_report": st.just(f"{TMP}/sweep.json"),
    "host": st.sampled_from(["tb1", "tb2"]),
}
GOOD_NUMBER_ARGS = st.sampled_from(["1", "0.5", "2", "30"])
# every other option that takes a value is a number
FLAGS = ("check", "diff", "pause", "json", "follow", "force", "sweep", "break_",
         "count_client_errors", "targets")


@dataclass(frozen=True)
class CliCase:
    """One `fab` command line: the task, its options as given (Python names; None for a
    flag given), and the words after ``--`` (``fab exec``)."""

    command: str
    options: dict[str, Any]
    after: tuple[str, ...] = ()


@st.composite
def cli_cases(draw: st.DrawFn, commands: dict[str, tuple[str, ...]]) -> CliCase:
    """One option (drawn evenly among all the tasks' options, then a task taking it) given
    a generated value, hostile three times in four; the task's required options and up to
    two more given valid values (mostly). ``commands`` maps each task to the options it
    takes (from tasks.py)."""
    names = sorted({name for takes in commands.values() for name in takes
                    if name not in FLAGS and name != "model"} | {"model"})
    name = draw(st.sampled_from(names))
    command = draw(st.sampled_from(sorted(c for c, takes in commands.items() if name in takes)))
    takes = commands[command]
    options: dict[str, Any] = {}
    if "model" in takes:
        options["model"] = draw(GOOD_OPTION_ARGS["model"])
    if command == "plan-capacity":
        options |= {"target_qps": "100", "per_instance_qps": "10"}
    for other in draw(st.lists(st.sampled_from(takes), max_size=2, unique=True)):
        options[other] = None if other in FLAGS else draw(mostly(
            GOOD_OPTION_ARGS.get(other, GOOD_NUMBER_ARGS), OPTION_ARGS.get(other, NUMBER_ARGS),
            8))
    options[name] = draw(mostly(OPTION_ARGS.get(name, NUMBER_ARGS),
                                GOOD_OPTION_ARGS.get(name, GOOD_NUMBER_ARGS), 4))
    after = tuple(draw(mostly(st.just(["true"]), EXEC_ARGS, 4))) if command == "exec" else ()
    return CliCase(command, options, after)
