"""Hypothesis settings of the property tier.

Profile ``ci`` (the default) runs a fixed number of generated cases per test, with no
example database (nothing written into the checkout) and no per-example deadline (the
machine is shared: timing is noise, the test asserts behaviour). ``HYPOTHESIS_PROFILE=long``
runs ten times as many. Each test sets its own share of the cases with ``examples(n)``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", database=None, deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
settings.register_profile("long", parent=settings.get_profile("ci"))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
