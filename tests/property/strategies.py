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

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from tfsdeploy.catalog import (
    Batching,
    Model,
    Rollout,
    Signature,
    TensorSpec,
    Threads,
    Warmup,
)
from tfsdeploy.inventory import Gpu, Group, Host

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
