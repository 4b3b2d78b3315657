"""Capacity history: the fleet's figures sampled at a fixed interval and kept in tiers.

One module per role (docs/architecture.md):

* :mod:`.settings`: ``history`` in control-plane.yaml (interval, tiers, bounds);
* :mod:`.fields`: the one declaration of the sampled fields and their order;
* :mod:`.tiers`: rolling finer points up into coarser ones (sum, max, last, count);
* :mod:`.chunks`: a chunk of points as bytes (zigzag-varint deltas, zlib);
* :mod:`.breakdown`: what a status snapshot adds up to beyond its counts
  (per model, the engines' figures), parsed once per distinct snapshot;
* :mod:`.recorder`: the open chunks and roll-ups of every series, and
  their writes to the store;
* :mod:`.service`: the :class:`~.service.HistoryService` that samples on
  its interval (from the fleet rounds) and expires old chunks;
* :mod:`.queries`: reading a view back (tier, range, fields, selector).
"""
