"""twistd plugin: ``twistd -n iop-edge --config PATH``."""

from twisted_iop.lean_poll import LeanPollServiceMaker

iop_edge = LeanPollServiceMaker(
    "IOP Edge",
    "twisted_iop.edge.tap",
    "The twisted-iop Edge agent: node listener, provider pool, control plane link.",
    "iop-edge",
)
