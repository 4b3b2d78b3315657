"""twistd plugin: ``twistd -n iop-control-plane [--config PATH]``."""

from twisted_iop.eventloop.process_tuning import DaemonServiceMaker

iop_control_plane = DaemonServiceMaker(
    "IOP Control Plane",
    "twisted_iop.controlplane.tap",
    "The twisted-iop Control Plane: edge wire, HTTP views, client WebSocket, console.",
    "iop-control-plane",
)
