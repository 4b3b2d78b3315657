"""The Edge daemon (``twistd iop-edge``): one site's gateway between the Control Plane and its Nodes.

* :mod:`.inference`: the request path (the OpenAI-compatible API, the gateway, request
  lifecycle, error rules, latency, tokens);
* :mod:`.nodes`: the Nodes of this Edge (their wire, connection ownership, the registry);
* :mod:`.providers`: where a request may run (pool and queues, cool-downs, engine load,
  launched engines' states);
* beside them: the link to the Control Plane, the status snapshot, commands, deployments,
  relayed events, metrics, config and the tap that composes it all.
"""
