"""The real Control Plane daemon against hostile HTTP clients and with role tokens."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import pytest_twisted
import treq

from twisted_iop.testing.harness import start_daemon, wait_for_ports
from twisted_iop.testing.http import connect, request_head
from twisted_iop.testing.wires.peers import connect_edge

pytestmark = pytest.mark.e2e

VIEWER_SECRET = "viewer-secret-0123456789"
OPERATOR_SECRET = "operator-secret-0123456789"

CONFIG = f"""
http:
  listen: tcp:0:interface=127.0.0.1
  tokens:
    - {{name: dashboard, role: viewer, token: {VIEWER_SECRET}}}
    - {{name: alice, role: operator, sha256: {hashlib.sha256(OPERATOR_SECRET.encode()).hexdigest()}}}
client_wire:
  listen: tcp:0:interface=127.0.0.1
edge_wire:
  listen: tcp:0:interface=127.0.0.1
"""


@pytest_twisted.ensureDeferred
async def test_daemon_refuses_hostile_http_and_honours_roles(tmp_path: Path) -> None:
    """Unauthenticated 1 GiB POSTs, cross-site forms and foreign Hosts never reach a view; roles hold."""
    config = tmp_path / "cp.yaml"
    config.write_text(CONFIG)
    daemon = start_daemon(["iop-control-plane", "--config", str(config)], tmp_path, name="cp")
    try:
        ports = await wait_for_ports(daemon, {"http", "edge_wire", "client_wire"})
        http = ports["http"]
        edge, hello = await connect_edge(ports["edge_wire"], "edge-h")
        assert hello is not None and hello.accepted
        path = "/edges/edge-h/commands"

        huge = await connect(http)
        huge.tcp.write(
            request_head("POST", http, "Content-Type: application/json\r\nContent-Length: 1073741824\r\n", path=path)
        )
        await huge.closed
        assert huge.status == 401

        form = await connect(http)
        form.tcp.write(
            request_head(
                "POST",
                http,
                f"Authorization: Bearer {OPERATOR_SECRET}\r\nContent-Type: text/plain\r\n"
                "Origin: http://evil.example\r\nContent-Length: 22\r\n",
                path=path,
            )
            + b'{"name": "node.drain"}'
        )
        await form.closed
        assert form.status in (403, 415)
        assert edge.commands_seen == []

        rebound = await connect(http)
        rebound.tcp.write(request_head("GET", http, "", host="rebind.attacker.example", path="/edges"))
        await rebound.closed
        assert rebound.status == 421

        base = f"http://127.0.0.1:{http}"
        viewer: dict[bytes | str, bytes | str] = {"Authorization": f"Bearer {VIEWER_SECRET}"}
        operator: dict[bytes | str, bytes | str] = {
            "Authorization": f"Bearer {OPERATOR_SECRET}",
            "Content-Type": "application/json",
        }
        response = await treq.get(base + "/edges/edge-h", headers=viewer)
        assert response.code == 200
        await response.content()
        body = json.dumps({"name": "node.drain", "target": "node-1"}).encode()
        response = await treq.post(base + path, data=body, headers={**viewer, "Content-Type": "application/json"})
        assert response.code == 403
        await response.content()
        response = await treq.post(base + path, data=body, headers=operator)
        answer = json.loads(await response.content())
        assert response.code == 200 and answer["state"] == "succeeded"
        assert answer["requested_by"] == "alice"
        assert [c.name for c in edge.commands_seen] == ["node.drain"]
        log = daemon.log()
        assert VIEWER_SECRET not in log and OPERATOR_SECRET not in log
        edge.tcp.loseConnection()
    finally:
        daemon.stop()
