"""Command-line options on the values the hostile-input battery (tests/property) found
mishandled: each is refused before anything is read from a host, naming the option, or typed
into what the command needs. Arguments go through invoke's parser and the task, as `fab` runs
them."""

from __future__ import annotations

import pytest
from invoke.exceptions import Exit
from invoke.parser import Parser

import tasks


def fab(*words: str) -> int:
    """`fab WORDS...` in this process (no host is reachable from the unit tier)."""
    parsed = Parser(contexts=tasks.ns.to_contexts()).parse_argv(list(words))
    try:
        tasks.ns[words[0]].body(None, **parsed[0].as_kwargs)
    except Exit as stop:
        return int(stop.code)
    return 0


@pytest.mark.parametrize("words", [
    ("logs", "--model=half_plus_two", "--lines=abc"),
    ("deploy", "--model=half_plus_two", "--lock-wait=soon"),
    ("guard", "--model=half_plus_two", "--min-requests=1.5"),
    ("plan-capacity", "--target-qps=100", "--per-instance-qps=10", "--load-factor=0x10"),
], ids=["int", "float", "int given a fraction", "hex"])
def test_a_number_option_given_text_exits_1_naming_it(
        words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert fab(*words) == 1
    err = capsys.readouterr().err
    flag = words[-1].split("=")[0]
    assert f"[field {flag}]" in err and "Traceback" not in err


def test_number_options_left_out_take_their_defaults(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert fab("plan-capacity", "--target-qps=100", "--per-instance-qps=10") == 0
    assert "= 100 / (10.0 x 0.65 x 0.9)" in capsys.readouterr().out
