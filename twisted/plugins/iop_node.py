"""twistd plugin: ``twistd -n iop-node --config PATH``."""

from twisted_iop.eventloop.process_tuning import DaemonServiceMaker

iop_node = DaemonServiceMaker(
    "IOP Node",
    "twisted_iop.node.tap",
    "The twisted-iop Node runtime: provider probes and the link to its Edge.",
    "iop-node",
)
