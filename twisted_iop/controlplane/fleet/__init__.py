"""What the Control Plane knows of its edges: the registry (each edge's record, connection token,
hello and last snapshot), events and operations with their bounds, kept memory, and the filters
of the edge views. No I/O.
"""
