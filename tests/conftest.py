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

# Edges and Nodes started by the tests (in process through their taps, or as
# twistd daemons) serve their metrics and inference API on a free port, never
# the fixed defaults.
os.environ.setdefault("IOP_EDGE_METRICS_LISTEN", "tcp:0:interface=127.0.0.1")
os.environ.setdefault("IOP_NODE_METRICS_LISTEN", "tcp:0:interface=127.0.0.1")
os.environ.setdefault("IOP_EDGE_INFERENCE_LISTEN", "tcp:0:interface=127.0.0.1")
