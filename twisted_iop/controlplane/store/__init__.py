"""What the Control Plane keeps across restarts (see :mod:`.interface`)."""
