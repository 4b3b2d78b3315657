"""The Node's HTTP connection pool to its engines, without a log line per connection.

Engines drop idle connections (llama-cpp-python after 5 s) and the Node
opens new ones for probes and requests all day: Twisted's default pool
logs "Starting factory" and "Stopping factory" for each, with the
engine's address in it. The probes and the inference runner share this
pool class.
"""

from __future__ import annotations

from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory


class _QuietClientFactory(_HTTP11ClientFactory):
    """The pool's per-connection factory, without the "Starting/Stopping factory" lines."""

    noisy = False


class QuietConnectionPool(HTTPConnectionPool):
    """A persistent pool whose connections open and close without a log line each."""

    _factory = _QuietClientFactory
