"""twistd plugin: ``twistd -n iop-control-plane [--config PATH]``."""

from twisted_iop.lean_poll import LeanPollServiceMaker

iop_control_plane = LeanPollServiceMaker(
    "IOP Control Plane",
    "twisted_iop.controlplane.tap",
    "The twisted-iop Control Plane: edge wire, HTTP views, client WebSocket, console.",
    "iop-control-plane",
)
