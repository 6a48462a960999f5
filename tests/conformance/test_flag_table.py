"""The toolkit's flag table and the emulator's flags against TFServing's own, kept as data.

tfserving-flags.json holds what scripts/tfserving-flags read from tensorflow/serving: the
flags main.cc declares at every final release tag and at HEAD (each with its commit), and for
the newest release and HEAD each flag's type and default as the source writes them.
src/tfsdeploy/core/render/flags.py is generated from that data (``--write``); here the
script's ``--check`` recomputes the table from the data, and the emulator's flags (names,
order, types, defaults: testbed/emulator/tfserving_emulator/flags.py) are compared with
HEAD's. No clone of tensorflow/serving is needed: ``--read GIT_DIR`` refreshes the data.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from tfsdeploy.core.render import flags

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "tfserving-flags"
DATA_FILE = pathlib.Path(__file__).with_name("tfserving-flags.json")
DATA: dict[str, Any] = json.loads(DATA_FILE.read_text())
# the emulator's kinds for the C++ types main.cc's targets are declared with
KINDS = {"bool": "bool", "float": "float", "tensorflow::int32": "int32", "int64_t": "int64",
         "tensorflow::string": "string", "string": "string"}
# tensorflow/cc/saved_model/tag_constants.h: constexpr char kSavedModelTagServe[] = "serve";
CONSTANTS = {"tensorflow::kSavedModelTagServe": "serve"}


def check(data: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--check"],
                          capture_output=True, text=True, timeout=60)


def test_the_table_is_the_one_the_data_gives() -> None:
    proc = check(DATA_FILE)
    assert proc.returncode == 0, proc.stderr
    assert f"# 48 flags in release {DATA['newest_release']['tag']}" in proc.stderr


def test_the_check_fails_when_the_data_says_otherwise(tmp_path: pathlib.Path) -> None:
    # --version missing from 1.10.0's main.cc would make it a flag of 1.11.0
    data = json.loads(DATA_FILE.read_text())
    release = next(r for r in data["releases"] if r["tag"] == "1.10.0")
    release["flags"].remove("version")
    changed = tmp_path / "flags.json"
    changed.write_text(json.dumps(data))
    proc = check(changed)
    assert proc.returncode == 1 and "differs from the table" in proc.stderr, proc.stderr


def test_the_data_names_its_source_commits() -> None:
    refs = [DATA["head"], DATA["newest_release"], *DATA["releases"]]
    assert all(len(ref["commit"]) == 40 for ref in refs)
    assert DATA["head"]["commit"] == "9d981c5c2708d23c5407c7c1e30309e6f9798874"
    assert (DATA["newest_release"]["tag"], DATA["newest_release"]["commit"]) == (
        "2.20.0", "bc7e9d2b9a419294c4526e293c2df8727b0d3116")


def test_head_declares_the_newest_release_s_flags() -> None:
    # flags.py dates the flags from release tags; 2.21 has none: HEAD stands for it
    def names(ref: str) -> list[str]:
        return [f["name"] for f in DATA[ref]["flags"]]

    assert names("head") == names("newest_release") == list(flags.FLAG_SINCE)


def test_version_flag_is_known_and_exits() -> None:
    # main.cc declares Flag("version", &display_version, ...) from 1.10.0 (absent in 1.9.1)
    tags = {r["tag"]: r["flags"] for r in DATA["releases"]}
    assert "version" in tags["1.10.0"] and "version" not in tags["1.9.1"]
    assert flags.FLAG_SINCE["version"] == (1, 10, 0)
    assert "version" in flags.BOOL_FLAGS
    assert "version" in flags.EXIT_FLAGS


def test_flush_filesystem_caches_came_in_1_6() -> None:
    tags = {r["tag"]: r["flags"] for r in DATA["releases"]}
    assert "flush_filesystem_caches" not in tags["1.5.0"]
    assert "flush_filesystem_caches" in tags["1.6.0"]
    assert flags.FLAG_SINCE["flush_filesystem_caches"] == (1, 6, 0)
    assert not flags.known_in("flush_filesystem_caches", (1, 5, 0))


def test_flags_dropped_before_2_20_are_not_in_the_table() -> None:
    every = {name for r in DATA["releases"] for name in r["flags"]}
    for dropped in ("use_saved_model", "model_version_policy", "use_tflite_model"):
        assert dropped in every and dropped not in flags.FLAG_SINCE


def tfserving_default(flag: dict[str, Any], cpus: int) -> Any:
    """The value a flag's default expression (as main.cc/server.h/server.cc write it) gives,
    with ``cpus`` schedulable CPUs; none written: C++'s value-initialisation."""
    kind, text = KINDS[flag["type"]], flag["default"]
    if text is None:
        return {"bool": False, "string": "", "float": 0.0}.get(kind, 0)
    if kind == "bool":
        return {"true": True, "false": False}[text]
    if kind == "string":
        return CONSTANTS[text] if text in CONSTANTS else json.loads(text)
    factors = text.replace("port::NumSchedulableCPUs()", str(cpus)).replace("LL", "")
    value = math.prod(float(f) for f in factors.split("*"))
    return value if kind == "float" else int(value)  # an int32 field truncates 4.0 * n


@pytest.fixture(scope="module")
def emulator_flags() -> Any:
    sys.path.insert(0, str(REPO / "testbed" / "emulator"))
    try:
        from tfserving_emulator import flags as emulated
    finally:
        sys.path.remove(str(REPO / "testbed" / "emulator"))
    return emulated


def test_the_emulator_declares_tfserving_s_flags_in_its_order(emulator_flags: Any) -> None:
    expected = [(f["name"], KINDS[f["type"]]) for f in DATA["head"]["flags"]]
    assert [(f.name, f.kind) for f in emulator_flags.FLAGS] == expected


def test_the_emulator_s_defaults_are_tfserving_s(emulator_flags: Any) -> None:
    cpus = emulator_flags._NCPU
    expected = {f["name"]: tfserving_default(f, cpus) for f in DATA["head"]["flags"]}
    assert emulator_flags.defaults() == expected
