"""twistd plugin: ``twistd -n iop-edge --config PATH``."""

from twisted_iop.paced_polls import PacedServiceMaker

iop_edge = PacedServiceMaker(
    "IOP Edge",
    "twisted_iop.edge.tap",
    "The twisted-iop Edge agent: node listener, provider pool, control plane link.",
    "iop-edge",
)
