"""Long fuzzing runs of the wires' accepting sides (outside CI).

With atheris installed (``pip install atheris``) this is a coverage-guided
atheris target; without it, a plain random loop with structure-aware
mutations runs instead. Either way each input goes through the same
drivers as ``tests/wire/test_wire_fuzz.py`` (``twisted_iop.testing.wires.wire``):
the Control Plane's edge wire with a real registry and gateway, the Edge's
node wire with a real node registry, and the ``/client`` WebSocket; and
the same checks: no failure logged, the connection answered or closed as
docs/wire.md says, a good peer served afterwards. A failing input is saved
to ``--crash-dir`` and the run stops.

    .venv/bin/python bench/wire_fuzz.py --seconds 20            # random loop (or atheris if present)
    .venv/bin/python bench/wire_fuzz.py --random --iterations 5000 --seed 7
    .venv/bin/python bench/wire_fuzz.py -- -max_total_time=600   # atheris options after --
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import time
from typing import Any

from twisted_iop.testing.configs import node_hello
from twisted_iop.testing.wires.frames import field_bytes, field_varint, length_prefixed, ws_frame
from twisted_iop.testing.wires.wire import (
    ClientWireDriver,
    EdgeWireDriver,
    LogCapture,
    NodeWireDriver,
    check_answered_or_closed,
    edge_hello,
)
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import make_envelope
from twisted_iop.wire.settings import PeerSettings

SETTINGS = PeerSettings(max_frame_bytes=256 * 1024, max_hello_frame_bytes=8 * 1024)
WIRES = ("edge", "node", "client")


def run_one(data: bytes) -> None:
    """Drive one input: byte 0 picks the wire and whether hello comes first; the rest is the stream."""
    if not data:
        return
    wire = WIRES[data[0] % 3]
    say_hello = bool(data[0] & 4)
    stream = data[1:]
    # Split the stream at points taken from its own bytes, so the fuzzer
    # controls how reads are cut too.
    cuts = sorted({b * 7 % (len(stream) + 1) for b in stream[:8]} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in itertools.pairwise(cuts)]
    with LogCapture().active() as log:
        if wire == "client":
            client = ClientWireDriver()
            socket = client.connect()
            if say_hello:
                socket.send("client_hello_request", pb.ClientHelloRequest(protocol_major=PROTOCOL_MAJOR), 1)
            for piece in pieces:
                socket.feed(piece)
            client.clock.advance(11)
            assert socket.protocol.said_hello or socket.closed, "a socket without hello outlived the deadline"
            socket.drop()
            client.check_good_peer()
        else:
            driver: Any = EdgeWireDriver(SETTINGS) if wire == "edge" else NodeWireDriver(SETTINGS)
            connection = driver.connect()
            if say_hello:
                connection.send(driver.hello_body, driver.hello_message(), 1)
                report = pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_HEALTHY)
                connection.send("node_ready", pb.NodeReady(providers=[report]))
                driver.open_requests(connection)
            for piece in pieces:
                connection.feed(piece)
            check_answered_or_closed(connection, SETTINGS.max_frame_bytes, SETTINGS.max_hello_frame_bytes)
            driver.finish()
            connection.drop()
            driver.check_good_peer()
    if log.errors():
        raise AssertionError("failure logged:\n" + log.describe(log.errors()))


# -- the plain random loop ---------------------------------------------------------

_TEMPLATES: list[tuple[str, Any]] = [
    ("edge_hello_request", edge_hello("edge-x")),
    ("node_hello_request", node_hello()),
    ("edge_status_response", pb.EdgeStatusResponse(nodes=[pb.EdgeNodeSnapshot(node_id="n")])),
    ("edge_command_response", pb.EdgeCommandResponse(command_id="c")),
    ("edge_event", pb.EdgeEvent(kind="node.ready")),
    ("node_ready", pb.NodeReady(providers=[pb.ProviderHealthReport(provider_id="mock-a")])),
    ("node_health_report", pb.NodeHealthReport(providers=[pb.ProviderHealthReport(provider_id="mock-a")])),
    ("node_probe_response", pb.NodeProbeResponse()),
    ("error", pb.Error(code=pb.ERROR_CODE_INTERNAL)),
    ("ping", pb.Ping()),
    ("pong", pb.Pong()),
    ("edge_status_request", pb.EdgeStatusRequest()),
]


def _mutated_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    rid = rng.choice([0, 1, 2, 3, rng.getrandbits(64)])
    if kind == 0:
        return rng.randbytes(rng.randrange(64))
    if kind == 1:  # an unknown oneof member
        return field_varint(1, rid) + field_bytes(rng.randrange(100, 5000), rng.randbytes(rng.randrange(8)))
    if kind == 2:  # invalid UTF-8 in a string field
        return field_varint(1, rid) + field_bytes(rng.choice([20, 26, 40]), field_bytes(1, b"\xff\xfe"))
    body, message = rng.choice(_TEMPLATES)
    copy = type(message)()
    copy.CopyFrom(message)
    for field in copy.DESCRIPTOR.fields:
        if field.enum_type is not None and isinstance(getattr(copy, field.name), int):
            setattr(copy, field.name, rng.choice([0, 1, 5, 99, -1, 2**31 - 1]))
    if kind == 3 and body in ("node_ready", "node_health_report"):  # a huge repeated field
        for _ in range(rng.choice([100, 3000])):
            copy.providers.add(provider_id="mock-a", health=rng.choice([1, 42]))
    payload = make_envelope(body, copy, rid).SerializeToString()
    if kind == 4 and payload:  # flip a byte
        i = rng.randrange(len(payload))
        payload = payload[:i] + bytes([rng.randrange(256)]) + payload[i + 1 :]
    return payload


def random_input(rng: random.Random) -> bytes:
    """One input for :func:`run_one`: a header byte, then frames (or WebSocket frames)."""
    header = rng.randrange(256)
    payloads = [_mutated_payload(rng) for _ in range(rng.randrange(12))]
    if WIRES[header % 3] == "client":
        stream = b"".join(ws_frame(p, opcode=rng.choice([2, 2, 2, 1])) for p in payloads)
    else:
        stream = b"".join(length_prefixed(p) for p in payloads)
        if rng.random() < 0.05:
            stream += (SETTINGS.max_frame_bytes + 1).to_bytes(4, "big")
    return bytes([header]) + stream


def random_loop(seconds: float, iterations: int, seed: int, crash_dir: str) -> None:
    """Run random inputs until the time or the count runs out; save the first failing input."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline and (iterations <= 0 or done < iterations):
        data = random_input(rng)
        try:
            run_one(data)
        except Exception:
            os.makedirs(crash_dir, exist_ok=True)
            path = os.path.join(crash_dir, f"crash-{seed}-{done}.bin")
            with open(path, "wb") as f:
                f.write(data)
            print(f"input {done} failed; saved to {path}", file=sys.stderr)
            raise
        done += 1
    print(f"random loop: {done} inputs, seed {seed}, no failure")


def main() -> None:
    """Parse options; run atheris if present (unless --random), else the random loop."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random", action="store_true", help="use the random loop even if atheris is installed")
    parser.add_argument("--seconds", type=float, default=20.0, help="random loop time budget (default 20)")
    parser.add_argument("--iterations", type=int, default=0, help="random loop input count (default: no limit)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--crash-dir", default="wire-fuzz-crashes")
    args, rest = parser.parse_known_args()
    try:
        import atheris  # type: ignore[import-not-found]
    except ImportError:
        atheris = None
    if atheris is None or args.random:
        if atheris is None:
            print("atheris is not installed: running the plain random loop", file=sys.stderr)
        random_loop(args.seconds, args.iterations, args.seed, args.crash_dir)
        return
    # Coverage feedback from our code (and Twisted's, protobuf's) already imported.
    atheris.instrument_all()
    atheris.Setup([sys.argv[0], *[a for a in rest if a != "--"]], run_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
