"""The wire contract: generated protobuf messages and the framed peer protocol.

``control_pb2`` is generated from ``proto/iop/control.proto`` by
``make proto`` and committed; ``tests/test_wire_generated.py`` fails when it
drifts from the .proto file.
"""

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0

#: Default maximum frame size on the TCP wires, in bytes (4 MiB).
DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024
