"""Tracing: W3C trace context on the inference path, its spans and their export.

This package owns what a request's trace is, from the client's
``traceparent`` to the collector:

* :mod:`.context`: the W3C Trace Context headers (``traceparent``,
  ``tracestate``), parsed strictly and written, and the random ids of new
  traces and spans. Every hop that reads the header from a peer (the Edge
  from its clients, the Node from its Edge) checks it here.
* :mod:`.spans`: one request's trace at the Edge: its server span, one
  child span per attempt (the first, a retry, a failover, each with the
  reason it was made), and the ``x-iop-route`` answer header.
* :mod:`.config`: the ``tracing:`` section of edge.yaml.
* :mod:`.export`: the bounded, batched queue of finished traces and the
  thread that hands them to the OTLP exporter, off the request path.
* :mod:`.otlp_sdk`: the only module that imports OpenTelemetry (the
  optional ``[tracing]`` extra); it is loaded only when
  ``tracing.otlp_endpoint`` is set.
"""
