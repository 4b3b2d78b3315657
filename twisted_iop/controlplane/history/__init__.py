"""Capacity history: the fleet's figures sampled at a fixed interval and kept in tiers.

One module per role (docs/architecture.md):

* :mod:`.settings`: ``history`` in control-plane.yaml (interval, the fleet's
  tiers and the edges', bounds);
* :mod:`.fields`: the one declaration of the sampled fields and their order;
* :mod:`.tiers`: rolling finer points up into coarser ones (sum, max, last, count),
  and reading points of an older, narrower form;
* :mod:`.chunks`: a chunk of one series' points as bytes (zigzag-varint deltas, zlib);
* :mod:`.columns`: a chunk of many series (a segment of edges) as frames of
  changed columns and patches, and reading one key out of it;
* :mod:`.breakdown`: what a status snapshot adds up to beyond its counts
  (per model, the engines' figures, the latency), parsed once per distinct snapshot;
* :mod:`.latency`: the latency figures of a snapshot kept small (packed
  sketches) and merged exactly for the fleet and each model fleet-wide;
* :mod:`.frames`: every edge's and model-on-an-edge's series, column-wise,
  by segment (the speed trick);
* :mod:`.edge_sampler`: a sample of the edges as one frame per segment,
  and the fleet's and models' totals;
* :mod:`.recorder`: the open chunks and roll-ups of the fleet's own series
  (the fleet, each model fleet-wide), and their writes to the store;
* :mod:`.service`: the :class:`~.service.HistoryService` that samples on
  its interval (from the fleet rounds) and expires old chunks;
* :mod:`.queries`: reading a view back (tier, range, fields, selector).
"""
