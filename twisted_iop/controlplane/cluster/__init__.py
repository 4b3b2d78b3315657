"""Cluster mode: several Control Plane replicas share one fleet through Redis.

The embedded default is one process with everything in memory and none of
this runs. With ``cluster.backend: redis`` each replica keeps a *mirror* of
the whole fleet in its own :class:`~twisted_iop.controlplane.fleet.registry.EdgeRegistry`,
so every view reads local memory, while Redis owns the facts:

* ``scripts`` holds the Lua scripts, one per kind of change, each applied
  only if the connection's **fence** is still the edge's current one;
* ``store`` is the link to Redis (a writer connection, whose order is the
  order of changes, and a reader that follows the fleet stream and this
  replica's inbox);
* ``remote`` routes status asks and commands for an edge held by another
  replica to its owner (:class:`RemotePeer` has the shape of a local
  connection, so the gateway is the same code for both);
* ``replica`` is the service that ties them to the registry and the
  gateway, composing its rooms: ``presence`` (leases, heartbeat,
  readiness, reaping dead replicas), ``journal`` (claims at hello, the
  fenced writes, reconciling after Redis comes back), ``stream_reader``
  (the mirror fed by the fleet stream) and ``inbox`` (requests routed
  here, run through the gateway); ``keys`` is the key layout they share.

docs/scale-out.md describes the key layout and the rules.
"""
