"""The Control Plane daemon (``twistd iop-control-plane``): where operators see and steer the fleet.

Folders by what they own: :mod:`.fleet` (what is known of the edges),
:mod:`.requests` (requests in flight to edges), :mod:`.wires` (the edge
wire and the WebSocket ``/client`` wire), :mod:`.http` (the HTTP API),
:mod:`.rollouts`, :mod:`.deployments`, :mod:`.slo`, :mod:`.history`,
:mod:`.store` (what outlives the process) and :mod:`.cluster`; beside them
the composition root (:mod:`.tap`), its config, ``/metrics`` and
:mod:`.restore`.
"""
