"""The Control Plane's wires: the edge wire (TCP, framed protobuf) with its hello and admission,
the edge peer the registry sees, and the WebSocket /client wire with its frames.
"""
