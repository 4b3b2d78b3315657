"""Engine adapters: one per provider kind (see :mod:`twisted_iop.node.engines.base`)."""
