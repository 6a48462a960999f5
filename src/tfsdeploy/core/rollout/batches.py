"""Batches and the failure threshold (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def batch_size(step: int | str, total: int) -> int:
    """Hosts in one batch: a count, or a percentage of all hosts (rounded down, at least 1)."""
    if isinstance(step, str):
        return max(1, math.floor(total * float(step.rstrip("%")) / 100 + 1e-9))
    return max(1, step)


def plan_batches(items: Sequence[T], serial: Sequence[int | str]) -> list[list[T]]:
    """Split ``items`` into batches as Ansible's ``serial`` does: the last step repeats.

    ``serial=(1, "25%", "100%")`` over 8 hosts gives [1], [2], [5]: a canary, a quarter of
    the fleet, then the rest.
    """
    batches: list[list[T]] = []
    position, index = 0, 0
    steps = list(serial) or [len(items)]
    while position < len(items):
        size = batch_size(steps[min(index, len(steps) - 1)], len(items))
        batches.append(list(items[position:position + size]))
        position += size
        index += 1
    return batches


def threshold_exceeded(failed: int, total: int, max_fail_percentage: float) -> bool:
    """Whether the roll must stop: failed hosts (unreachable ones count) above the threshold.

    Inclusive: with ``max_fail_percentage=25`` and 8 hosts, 2 failures (25%) are tolerated and
    the third stops the roll. With 0 (the default) the first failure stops it.
    """
    return total > 0 and failed * 100 > max_fail_percentage * total + 1e-9
