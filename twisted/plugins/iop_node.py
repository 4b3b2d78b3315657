"""twistd plugin: ``twistd -n iop-node --config PATH``."""

from twisted_iop.lean_poll import LeanPollServiceMaker

iop_node = LeanPollServiceMaker(
    "IOP Node",
    "twisted_iop.node.tap",
    "The twisted-iop Node runtime: provider probes and the link to its Edge.",
    "iop-node",
)
