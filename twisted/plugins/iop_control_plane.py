"""twistd plugin: ``twistd -n iop-control-plane [--config PATH]``."""

from twisted.application.service import ServiceMaker

iop_control_plane = ServiceMaker(
    "IOP Control Plane",
    "twisted_iop.controlplane.tap",
    "The twisted-iop Control Plane: edge wire, HTTP views, client WebSocket, console.",
    "iop-control-plane",
)
