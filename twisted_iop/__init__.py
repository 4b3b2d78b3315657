"""twisted-iop: an operations control plane for fleets of LLM inference sites."""

__version__ = "0.1.0"
