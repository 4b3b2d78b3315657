"""twistd plugin: ``twistd -n iop-edge --config PATH``."""

from twisted.application.service import ServiceMaker

iop_edge = ServiceMaker(
    "IOP Edge",
    "twisted_iop.edge.tap",
    "The twisted-iop Edge agent: node listener, provider pool, control plane link.",
    "iop-edge",
)
