"""twistd plugin: ``twistd -n iop-node --config PATH``."""

from twisted.application.service import ServiceMaker

iop_node = ServiceMaker(
    "IOP Node",
    "twisted_iop.node.tap",
    "The twisted-iop Node runtime: provider probes and the link to its Edge.",
    "iop-node",
)
