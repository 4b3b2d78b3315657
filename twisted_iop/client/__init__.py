"""Clients of the Control Plane: status repository, wire client, iopctl."""
