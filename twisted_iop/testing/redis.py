"""A private ``redis-server`` for tests and benchmarks.

Every test that needs Redis starts its own on a free loopback port in a
temporary directory (append-only file on, so a stop and start keeps the
data, as a production Redis would), and stops it afterwards: no test
depends on a Redis someone else started.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

#: How long a starting redis-server may take to answer PING.
START_SECONDS = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_available() -> bool:
    """Whether ``redis-server`` is installed (``make test`` installs it)."""
    return shutil.which("redis-server") is not None


class RedisServer:
    """One redis-server process on 127.0.0.1, its data in ``directory``."""

    def __init__(self, directory: Path, port: Optional[int] = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        """The ``redis://`` URL the Control Plane's ``cluster.redis_url`` takes."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server (again, on the same port and data) and wait for PING."""
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (make redis installs it)")
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 (the server process writes it)
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                "--maxclients",
                "1000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}; see {self.directory}")
            if self.ping():
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {START_SECONDS:g}s")

    def ping(self) -> bool:
        """Whether the server answers PING right now."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """Send one command (inline form) and return the raw first reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            parts = [f"${len(a.encode())}\r\n{a}\r\n" for a in args]
            s.sendall(f"*{len(args)}\r\n{''.join(parts)}".encode())
            return s.recv(65536)

    def stop(self) -> None:
        """Stop the server the way an operator would (SIGTERM, data kept)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def kill(self) -> None:
        """Kill the server at once (SIGKILL)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.process = None


class RedisReplyError(Exception):
    """An error reply (``-ERR ...``, ``-NOSCRIPT ...``) from the server."""


#: The largest bulk string or array the synchronous client accepts.
MAX_REPLY_ITEMS = 1 << 24


class SyncRedis:
    """A blocking RESP2 client on one socket to a :class:`RedisServer`.

    For tests that run the cluster's Lua scripts step by step without the
    reactor. Replies come back as Python values: integers as ``int``, simple
    and bulk strings as ``str``, nil as ``None``, arrays as ``list``; an
    error reply raises :class:`RedisReplyError`.
    """

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self._socket = socket.create_connection((host, port), timeout=timeout)
        self._reader = self._socket.makefile("rb")

    def call(self, *args: object) -> Any:
        """Send one command (each argument as ``str``) and return its reply."""
        parts = [str(a).encode() for a in args]
        request = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        self._socket.sendall(request)
        return self._reply()

    def eval(self, source: str, *args: object) -> Any:
        """``EVAL`` a Lua script with no keys and ``args`` as ARGV; return its reply."""
        return self.call("EVAL", source, 0, *args)

    def close(self) -> None:
        """Close the socket."""
        self._reader.close()
        self._socket.close()

    def __enter__(self) -> SyncRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self) -> bytes:
        line = self._reader.readline(65536)
        if not line.endswith(b"\r\n"):
            raise ConnectionError("redis-server closed the connection or sent an overlong line")
        return line[:-2]

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind in (b"$", b"*"):
            size = int(rest)
            if size < 0:
                return None
            if size > MAX_REPLY_ITEMS:
                raise ConnectionError(f"reply of {size} items or bytes is over the client's bound")
            if kind == b"*":
                return [self._reply() for _ in range(size)]
            data = self._reader.read(size + 2)
            if len(data) != size + 2 or not data.endswith(b"\r\n"):
                raise ConnectionError("redis-server closed the connection inside a bulk string")
            return data[:-2].decode()
        raise ConnectionError(f"unknown RESP reply type {kind!r}")
