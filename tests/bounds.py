"""Timing bounds in tests: each checked and recorded (test support).

A test that bounds a time (how long a step took, how late an event came, a latency, a pace)
asserts it with ``within``: the failure names the quantity, the measured value and the bound,
and every run records the measurement as a property of the running test (``timing bound``,
JSON), which the JUnit XML carries and scripts/test-report lists, tightest margin first. The
bound beside the call says why it is what it is; the table says how close the machine came.

tests/conftest.py tells this module which test is running (``recorded_on``); outside a test
``within`` only asserts.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PROPERTY = "timing bound"
# the JSON keys of a bound, how the report writes them and what each checks
OPERATORS = {"below": "<", "at_most": "<=", "above": ">", "at_least": ">="}
CHECKS = {"below": operator.lt, "at_most": operator.le, "above": operator.gt,
          "at_least": operator.ge}

_running: Any = None  # the pytest item now running, None outside a test


@contextmanager
def recorded_on(item: Any) -> Iterator[None]:
    """Record the bounds checked inside this block on ``item`` (a pytest Item)."""
    global _running
    before, _running = _running, item
    try:
        yield
    finally:
        _running = before


def within(what: str, measured: float, *, below: float | None = None,
           at_most: float | None = None, above: float | None = None,
           at_least: float | None = None, detail: object = None) -> None:
    """Assert that ``measured`` (``what``, with its unit) meets every bound given (``below``:
    ``<``, ``at_most``: ``<=``, ``above``: ``>``, ``at_least``: ``>=``), and record it on the
    running test, whether or not it does; a failure shows ``detail`` (a run's output, say)
    after the bound."""
    given = {"below": below, "at_most": at_most, "above": above, "at_least": at_least}
    limits = {key: float(limit) for key, limit in given.items() if limit is not None}
    if not limits:
        raise TypeError("within() needs at least one bound")
    measured = float(measured)
    if _running is not None:
        _running.user_properties.append(
            (PROPERTY, json.dumps({"what": what, "measured": measured, **limits})))
    failed = [f"{OPERATORS[key]} {limit:g}" for key, limit in limits.items()
              if not CHECKS[key](measured, limit)]
    shown = "" if detail is None else f"\n{detail}"
    assert not failed, f"{what}: measured {measured:g}, bound {' and '.join(failed)}{shown}"
