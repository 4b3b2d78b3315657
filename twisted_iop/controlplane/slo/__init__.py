"""Service level objectives: what "fast enough" means, measured, and alerts when it is not.

This package owns SLOs from their spec to their alerts:

* :mod:`.spec`: an SLO as an operator writes it (metric, percentile or
  ratio, objective, model, edge selector, window), parsed once with errors
  naming the field (one parser for ``PUT /slos/{name}`` and the ``slos:``
  section of control-plane.yaml);
* :mod:`.buckets`: good/bad counts in time buckets, bounded, pure;
* :mod:`.evaluator`: one SLO's buckets, its value over the window, error
  budget, burn rates and multi-window burn-rate alerts (pure, clock passed in);
* :mod:`.readings`: the difference of two cumulative latency readings of
  each provider stream (``LatencySketch.minus``), restarts counted from zero;
* :mod:`.service`: the timer that reads the edges' kept snapshots, feeds the
  evaluators, records ``slo.alert.*`` events and keeps SLOs in the store;
* :mod:`.routes`: ``/slos`` on the Control Plane's HTTP API.

See docs/slos.md for how the figures are computed.
"""
