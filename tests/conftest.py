"""Test configuration: Hypothesis profiles (helpers live in ``twisted_iop.testing``)."""

from __future__ import annotations

import os

# Hypothesis: deterministic enough for CI, and never slow.
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("IOP_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")
