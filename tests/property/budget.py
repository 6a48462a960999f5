"""How many generated cases each property test runs (see conftest.py for the profiles)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import settings

SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 1


def examples(count: int) -> Callable[[Any], Any]:
    """``@examples(n)``: run ``n`` generated cases (x10 with HYPOTHESIS_PROFILE=long)."""
    return settings(max_examples=count * SCALE)
