"""One test per validation rule: the bad input and the message that names it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.catalog import Batching, Rollout, Threads
from tfsdeploy.core.inventory.versions import choose_version
from tfsdeploy.core.render.files import (
    BATCHING_CONFIG,
    FLAGS,
    MODEL_CONFIG,
    MONITORING_CONFIG,
    HostRender,
    RenderedFile,
    render_fleet,
)
from tfsdeploy.core.render.validate import validate_model, validate_render

from .helpers import inventory, model


def _render(**model_changes: object) -> HostRender:
    m = model(**model_changes)
    inv = inventory(models=[m])
    return render_fleet(inv, m, 3, inv.select("h1"))[0]


def _problems(render: HostRender) -> list[Problem]:
    return validate_render(render, "inv.py")


def _with_file(render: HostRender, name: str, text: str) -> HostRender:
    files = tuple(RenderedFile(f.name, text if f.name == name else f.text) for f in render.files)
    return replace(render, files=files)


def _messages(problems: list[Problem]) -> str:
    return "\n".join(p.render() for p in problems)


def test_valid_render_has_no_problem() -> None:
    assert _problems(_render()) == []


@pytest.mark.parametrize("text, expected", [
    ("max_batch_size { value: 8 }\nmax_batch_sise { value: 8 }\n", "max_batch_sise"),
    ('{"max_batch_size": {"value": 8}}', "TFServing would reject this file"),
    ("max_batch_size: 8\n", 'Expected "{"'),
])
def test_batching_file_rejected_like_tfserving(text: str, expected: str) -> None:
    problems = _problems(_with_file(_render(), BATCHING_CONFIG, text))
    assert any(expected in p.message and p.file and p.file.startswith(BATCHING_CONFIG)
               for p in problems), _messages(problems)


def test_unknown_field_in_model_and_monitoring_config() -> None:
    render = _with_file(_render(), MONITORING_CONFIG, "prometheus_config { enabled: true }\n")
    render = _with_file(render, MODEL_CONFIG, 'model_config_list { config { nam: "m" } }\n')
    text = _messages(_problems(render))
    assert "MonitoringConfig" in text and "enabled" in text
    assert "ModelServerConfig" in text and "nam" in text


def test_batch_timeout_above_a_third_of_slo() -> None:
    problems = _problems(_render(latency_slo_ms=30, batching=Batching(
        max_batch_size=8, batch_timeout_micros=20000, allowed_batch_sizes=(8,))))
    text = _messages(problems)
    assert "batch_timeout_micros 20000 exceeds a third of the 30 ms latency SLO (10000 us)" in text
    assert "at most 10000" in text


def test_allowed_batch_sizes_must_increase_and_end_at_max() -> None:
    problems = validate_model(model(batching=Batching(
        max_batch_size=16, allowed_batch_sizes=(8, 4, 12))), "inv.py")
    text = _messages(problems)
    assert "are not strictly increasing" in text
    assert "last allowed_batch_sizes entry 12 must equal max_batch_size 16" in text
    assert {p.field for p in problems} == {"models.m.batching.allowed_batch_sizes"}
    # the same rules on a rendered file (a custom template)
    text = _messages(_problems(_with_file(_render(), BATCHING_CONFIG, (
        "max_batch_size { value: 16 }\nallowed_batch_sizes: 8\nallowed_batch_sizes: 4\n"
        "allowed_batch_sizes: 12\n"))))
    assert "are not strictly increasing" in text
    assert "last allowed_batch_sizes entry 12 must equal max_batch_size 16" in text


@pytest.mark.parametrize("field", ["num_batch_threads", "max_enqueued_batches"])
def test_batch_threads_and_queue_at_least_one(field: str) -> None:
    batching = replace(Batching(max_batch_size=8, allowed_batch_sizes=(8,)), **{field: 0})
    problems = validate_model(model(batching=batching), "inv.py")
    assert [(p.field, p.message) for p in problems] == [
        (f"models.m.batching.{field}", f"{field} is 0: must be at least 1")]


@pytest.mark.parametrize("text, expected", [
    # the server's own checks (shared_batch_scheduler.h, bundle_factory_util.cc)
    ("batch_timeout_micros { value: -5 }", "batch_timeout_micros is -5; TFServing fails the load"),
    ("max_batch_size { value: 0 }", "max_batch_size is 0; TFServing fails the load"),
    ("num_batch_threads { value: 0 }", "num_batch_threads is 0; TFServing fails at start-up"),
    ("max_enqueued_batches { value: 0 }",
     "max_enqueued_batches is 0; TFServing replaces 0 with 1"),
    ("enable_large_batch_splitting { value: true }\nmax_enqueued_batches { value: 0 }",
     "max_enqueued_batches is 0; TFServing fails the load"),
    ("enable_large_batch_splitting { value: true }\nmax_execution_batch_size { value: 16 }",
     "max_execution_batch_size 16 > max_batch_size 8 with enable_large_batch_splitting"),
    ("allowed_batch_sizes: 4", "last allowed_batch_sizes entry 4 must equal max_batch_size 8"),
])
def test_rendered_batching_follows_the_server(text: str, expected: str) -> None:
    body = f"max_batch_size {{ value: 8 }}\n{text}\n" if "max_batch_size {" not in text \
        else text + "\n"
    problems = _problems(_with_file(_render(), BATCHING_CONFIG, body))
    assert any(expected in p.message and p.file == BATCHING_CONFIG and p.host == "h1"
               for p in problems), _messages(problems)


def test_rendered_batching_the_server_accepts_passes() -> None:
    # max_execution_batch_size is read only with splitting; 0 enqueued batches is refused on
    # purpose (the server would run 1), so it is not in this file
    body = ("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 0 }\n"
            "max_execution_batch_size { value: 16 }\nallowed_batch_sizes: 8\n")
    assert _problems(_with_file(_render(), BATCHING_CONFIG, body)) == []


@pytest.mark.parametrize("threads, batching, concurrency, ok", [
    (0, Batching(max_batch_size=64, allowed_batch_sizes=(64,)), 0, True),  # server default
    (65, Batching(max_batch_size=64, allowed_batch_sizes=(64,)), 0, True),
    (64, Batching(max_batch_size=64, allowed_batch_sizes=(64,)), 0, False),
    (2, Batching(enabled=False), 0, True),
    (1, Batching(enabled=False), 0, False),  # the only thread polls: every call refused
    (33, Batching(max_batch_size=8, allowed_batch_sizes=(8,)), 32, True),
    (32, Batching(max_batch_size=8, allowed_batch_sizes=(8,)), 32, False),
])
def test_grpc_max_threads_holds_the_expected_concurrency(
        threads: int, batching: Batching, concurrency: int, ok: bool) -> None:
    problems = validate_model(model(threads=Threads(grpc_max_threads=threads),
                                    batching=batching, expected_concurrency=concurrency),
                              "inv.py")
    assert (problems == []) == ok, _messages(problems)
    if not ok:
        assert problems[0].field == "models.m.threads.grpc_max_threads"
        assert "RESOURCE_EXHAUSTED" in problems[0].message
        need = concurrency or (batching.max_batch_size if batching.enabled else 1)
        assert f"at least {need + 1}" in problems[0].fix


def test_relative_base_path_refused() -> None:
    render = _render()
    text = render.file(MODEL_CONFIG).text.replace('"/models/m"', '"models/m"')
    problems = _problems(_with_file(render, MODEL_CONFIG, text))
    assert any("base_path 'models/m' is not absolute" in p.message for p in problems)


@pytest.mark.parametrize("name", ["res net", "../etc", "a/b", "..", "m$"])
def test_model_names_restricted(name: str) -> None:
    problems = validate_model(model(name=name), "inv.py")
    assert problems and problems[0].field == f"models.{name}.name", problems


@pytest.mark.parametrize("version", ["0", "-3", "abc", "1.5"])
def test_version_must_be_positive_integer(version: str) -> None:
    with pytest.raises(ConfigError, match="must be a positive integer"):
        choose_version(model(), version, "inv.py")


def test_newest_version_from_source(tmp_path: object) -> None:
    from pathlib import Path
    root = Path(str(tmp_path))
    for name in ("1", "7", "0012", "v9", "0"):
        (root / name).mkdir()
    assert choose_version(model(source=str(root)), None, "inv.py") == 12
    with pytest.raises(ConfigError, match="no numeric version directory"):
        choose_version(model(source=str(root / "missing")), None, "inv.py")


def test_label_on_version_not_loaded() -> None:
    problems = _problems(_render(labels={"stable": 2, "canary": "release"}))
    text = _messages(problems)
    assert "label 'stable' points at version 2, which this config does not load (loads [3])" in text
    assert "canary" not in text


def test_labels_need_allow_unavailable_flag() -> None:
    render = _render(labels={"stable": "release"})
    flags = "\n".join(line for line in render.file(FLAGS).text.splitlines()
                      if "allow_version_labels" not in line)
    text = _messages(_problems(_with_file(render, FLAGS, flags)))
    assert "emit --allow_version_labels_for_unavailable_models=true" in text


def test_label_names_restricted() -> None:
    problems = validate_model(model(labels={"to-day": "release"}), "inv.py")
    assert "labels key 'to-day' is not 1-64 of [A-Za-z0-9_]" in _messages(problems)
    assert problems[0].field == "models.m.labels.to-day"


def test_model_name_with_model_config_file_refused() -> None:
    render = _render()
    flags = render.file(FLAGS).text + "--model_name=m\n"
    text = _messages(_problems(_with_file(render, FLAGS, flags)))
    assert "silently ignored with --model_config_file" in text


def test_batching_file_without_enable_batching_refused() -> None:
    render = _render()
    flags = render.file(FLAGS).text.replace("--enable_batching=true\n", "")
    text = _messages(_problems(_with_file(render, FLAGS, flags)))
    assert "--batching_parameters_file without --enable_batching=true" in text


def test_all_three_parallelism_flags_refused() -> None:
    render = _render(threads=Threads(intra_op=2, inter_op=2))
    flags = render.file(FLAGS).text + "--tensorflow_session_parallelism=4\n"
    text = _messages(_problems(_with_file(render, FLAGS, flags)))
    assert "all three parallelism flags set" in text
    # the template itself never emits the third one
    assert "session_parallelism" not in _render(
        threads=Threads(intra_op=2, inter_op=2, session=4)).file(FLAGS).text


def test_flag_syntax_and_unknown_flag_for_release() -> None:
    render = _render()
    flags = render.file(FLAGS).text + "--port 9000\n--enable_profilr=true\n"
    text = _messages(_problems(_with_file(render, FLAGS, flags)))
    assert "'--port 9000' is not of the form --name=value" in text
    assert "--enable_profilr is unknown to TFServing 2.21.0" in text


def test_flag_newer_than_target_release() -> None:
    m = model(threads=Threads(grpc_max_threads=16))
    inv = inventory(models=[m], defaults={"tfserving_version": "2.4.1"})
    render = render_fleet(inv, m, 1, inv.select("h1"))[0]
    text = _messages(_problems(render))
    assert "--grpc_max_threads is unknown to TFServing 2.4.1" in text


def test_gpu_fraction_too_large_for_two_releases_names_numbers() -> None:
    m = model(memory_mib=5500)
    inv = inventory(models=[m], gpu_mib=16384, defaults={"gpu_context_mib": 512})
    render = render_fleet(inv, m, 1, inv.select("h1"))[0]
    assert _problems(render) == []  # fits: 2 x 0.403 + 2 x 512 MiB context = 0.869 <= 0.9
    assert render.gpu is not None
    arithmetic = render.gpu.arithmetic()
    assert "fraction = ceil(5500 MiB x 1.2 / 16384 MiB, 3 places) = 0.403" in arithmetic
    assert ("window = 0.000 (other models) + 2 x 0.403 + 2 x 512 MiB beside each pool / "
            "16384 MiB = 0.806 + 0.063 = 0.869") in arithmetic
    m = model(memory_mib=6000)  # fitted before the CUDA contexts were counted: 0.880
    inv = inventory(models=[m], gpu_mib=16384, defaults={"gpu_context_mib": 512})
    text = _messages(_problems(render_fleet(inv, m, 1, inv.select("h1"))[0]))
    assert ("window = 0.000 (other models) + 2 x 0.440 + 2 x 512 MiB beside each pool / "
            "16384 MiB = 0.880 + 0.063 = 0.943, limit 1 - 0.1 = 0.900") in text
    assert "strategy 'recreate'" in text


def test_gpu_context_is_a_host_var() -> None:
    m = model(memory_mib=6000)
    inv = inventory(models=[m], gpu_mib=16384, defaults={"gpu_context_mib": 0})
    render = render_fleet(inv, m, 1, inv.select("h1"))[0]
    assert _problems(render) == [] and render.gpu is not None
    assert "window = 0.000 (other models) + 2 x 0.440 = 0.880, limit" in render.gpu.arithmetic()
    inv = inventory(models=[m], gpu_mib=16384, defaults={"gpu_context_mib": 2048})
    render = render_fleet(inv, m, 1, inv.select("h1"))[0]
    assert "+ 2 x 2048 MiB beside each pool / 16384 MiB = 0.880 + 0.250 = 1.130" in \
        _messages(_problems(render))
    # the printed arithmetic is in the flags file the host receives
    assert "2 x 2048 MiB beside each pool" in render.file(FLAGS).text


def test_one_process_alone_must_fit() -> None:
    m = model(memory_mib=12000, rollout=Rollout(strategy="recreate"))
    inv = inventory(models=[m], gpu_mib=16384, defaults={"gpu_context_mib": 2048,
                                                         "gpu_headroom": 0.0})
    text = _messages(_problems(render_fleet(inv, m, 1, inv.select("h1"))[0]))
    assert "does not fit this GPU (1 release(s) at once)" in text  # 0.879 + 0.125 > 1


def test_recreate_strategy_needs_room_for_one_release_only() -> None:
    m = model(memory_mib=6500, rollout=Rollout(strategy="recreate"))
    inv = inventory(models=[m])
    assert _problems(render_fleet(inv, m, 1, inv.select("h1"))[0]) == []


def test_gpu_host_needs_explicit_fraction() -> None:
    render = _render()
    flags = "\n".join(line for line in render.file(FLAGS).text.splitlines()
                      if "gpu_memory_fraction" not in line)
    text = _messages(_problems(_with_file(render, FLAGS, flags)))
    assert "fraction 0 takes nearly all GPU memory" in text


def test_co_located_models_share_the_gpu() -> None:
    a, b = model(name="a", memory_mib=3500), model(name="b", memory_mib=3500, port_offset=100)
    small = {"gpu_context_mib": 512}
    inv = inventory(models=[a, b], defaults=small)
    assert _problems(render_fleet(inv, a, 1, inv.select("h1"))[0]) == []  # 0.865 fits
    a, b = model(name="a", memory_mib=5000), model(name="b", memory_mib=5000, port_offset=100)
    inv = inventory(models=[a, b], defaults=small)
    text = _messages(_problems(render_fleet(inv, a, 1, inv.select("h1"))[0]))
    # three processes: b's release, and a's old and new
    assert ("0.367 (other models) + 2 x 0.367 + 3 x 512 MiB beside each pool / 16384 MiB = "
            "1.101 + 0.094 = 1.195") in text


def test_serial_and_rollout_rules() -> None:
    problems = validate_model(model(rollout=Rollout(serial=(0, "150%", "x"),
                                                    keep_releases=1,
                                                    max_fail_percentage=120)), "inv.py")
    text = _messages(problems)
    assert text.count("serial step") == 3
    assert "keep_releases is 1: must be at least 2" in text
    assert "max_fail_percentage is 120: must be at most 100" in text
    assert {p.field for p in problems} == {
        "models.m.rollout.serial[0]", "models.m.rollout.serial[1]", "models.m.rollout.serial[2]",
        "models.m.rollout.keep_releases", "models.m.rollout.max_fail_percentage"}


def test_slot_ports_must_differ() -> None:
    with pytest.raises(ConfigError) as err:
        inventory(defaults={"slot_ports": {"blue": (8510, 8510), "green": (8500, 8521)}})
    text = str(err.value)
    assert "slot_ports.blue[0] and slot_ports.blue[1] are both 8510" in text
    assert "serves no REST and no metrics" in text
    assert "grpc_port and slot_ports.green[0] are both 8500" in text


def test_template_with_undefined_variable(tmp_path: object, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    from pathlib import Path
    folder = Path(str(tmp_path))
    for name in ("models.config", "batching.config", "monitoring.config", "tfserving.flags"):
        (folder / f"{name}.j2").write_text("x\n")
    (folder / "batching.config.j2").write_text("line\nmax_batch_size { value: {{ nope }} }\n")
    monkeypatch.setenv("TFSDEPLOY_TEMPLATES", str(folder))
    with pytest.raises(ConfigError, match=r"batching.config.j2:2.*'nope' is undefined"):
        _render()


def test_co_located_models_need_distinct_ports() -> None:
    from tfsdeploy.core.render.validate import check_port_clashes

    a, b = model(name="a"), model(name="b", memory_mib=100)
    with pytest.raises(ConfigError) as err:
        inventory(models=[a, b])
    (problem,) = err.value.problems
    assert problem.message == "models 'a' and 'b' both use port 8500"
    assert problem.host == "h1, h2" and problem.field == "models.b.port_offset"
    assert check_port_clashes(inventory(models=[a, model(name="b", port_offset=100)])) == []


def test_port_offset_beyond_the_last_port() -> None:
    with pytest.raises(ConfigError, match="moves the ports of model 'm' up to 65621, beyond 65535"):
        inventory(models=[model(port_offset=57100)])


def test_negative_batch_timeout_is_refused_before_rendering() -> None:
    with pytest.raises(ConfigError) as err:
        inventory(models=[model(batching=Batching(batch_timeout_micros=-5))])
    (problem,) = err.value.problems
    assert problem.field == "models.m.batching.batch_timeout_micros"
    assert problem.message == "batch_timeout_micros is -5: must be at least 0"


def test_max_unavailable_above_one_is_refused_with_the_reason() -> None:
    assert validate_model(model(rollout=Rollout(max_unavailable=1)), "inv.py") == []
    (problem,) = validate_model(model(rollout=Rollout(max_unavailable=2)), "inv.py")
    assert problem.field == "models.m.rollout.max_unavailable"
    assert "one at a time" in problem.message and "max_unavailable=1" in problem.fix
