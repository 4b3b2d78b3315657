"""twistd plugin: ``twistd -n iop-edge --config PATH``."""

from twisted_iop.eventloop.process_tuning import DaemonServiceMaker

iop_edge = DaemonServiceMaker(
    "IOP Edge",
    "twisted_iop.edge.tap",
    "The twisted-iop Edge agent: node listener, provider pool, control plane link.",
    "iop-edge",
)
