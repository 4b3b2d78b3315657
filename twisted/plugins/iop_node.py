"""twistd plugin: ``twistd -n iop-node --config PATH``."""

from twisted_iop.paced_polls import PacedServiceMaker

iop_node = PacedServiceMaker(
    "IOP Node",
    "twisted_iop.node.tap",
    "The twisted-iop Node runtime: provider probes and the link to its Edge.",
    "iop-node",
)
