"""The systemd units in configs/systemd/: consistent, hardened, and what docs/operations.md installs."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from twisted_iop.testing.harness import TWISTD

ROOT = Path(__file__).resolve().parents[1]

UNITS = ROOT / "configs" / "systemd"
#: unit name -> the config file name its daemon reads.
DAEMONS = {"iop-control-plane": "control-plane", "iop-edge": "edge", "iop-node": "node"}
INSTALLED_TWISTD = "/opt/twisted-iop/bin/twistd"
#: Settings that name the daemon, and so differ between the units; the Node's
#: stop also stops the engines it launches (longer, its own kill mode) and
#: keeps their pidfiles in its state directory.
PER_DAEMON = {"ExecStart", "EnvironmentFile", "TimeoutStopSec", "KillMode", "StateDirectory"}
#: The hardening every unit must carry (systemd-analyze security rates it 1.8).
HARDENING = {
    "NoNewPrivileges",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "RestrictNamespaces",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "RestrictAddressFamilies",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "UMask",
}


def read_unit(name: str) -> configparser.ConfigParser:
    """Parse a unit file as INI, keeping the case of its keys."""
    parser = configparser.ConfigParser(interpolation=None, strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep keys' case, as systemd does
    parser.read(UNITS / f"{name}.service")
    return parser


def test_exactly_the_three_units_ship() -> None:
    """configs/systemd holds one unit per daemon and nothing else."""
    assert sorted(p.name for p in UNITS.iterdir()) == sorted(f"{name}.service" for name in DAEMONS)


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_unit_is_consistent_and_hardened(name: str, tmp_path: Path) -> None:
    """Start limits in [Unit], the shared paths, the full hardening set; systemd agrees where installed."""
    unit = read_unit(name)
    conf = DAEMONS[name]
    service = dict(unit["Service"])
    # StartLimit* in [Service] is ignored by systemd: it belongs to [Unit].
    assert unit["Unit"]["StartLimitIntervalSec"] == "60" and unit["Unit"]["StartLimitBurst"] == "5"
    assert not [key for key in service if key.startswith("StartLimit")]
    # No Documentation= pointing at files nothing installs.
    assert "Documentation" not in unit["Unit"]
    assert service["ExecStart"] == (
        f"{INSTALLED_TWISTD} -n --pidfile= --logfile=- {name} --config /etc/iop/{conf}.yaml"
    )
    assert service["EnvironmentFile"] == f"-/etc/iop/{conf}.env"
    # Its state (the store, pidfiles) under /var/lib/twisted-iop/<daemon>, writable under ProtectSystem=strict.
    assert service["StateDirectory"] == f"twisted-iop/{conf}"
    assert set(service) >= HARDENING
    assert service["LimitNOFILE"] == "65536"
    # Apart from what names the daemon, the three [Service] sections are identical.
    reference = read_unit("iop-control-plane")["Service"]
    assert {k: v for k, v in service.items() if k not in PER_DAEMON} == {
        k: v for k, v in reference.items() if k not in PER_DAEMON
    }
    assert dict(unit["Install"]) == {"WantedBy": "multi-user.target"}

    if shutil.which("systemd-analyze") is None:
        return
    # systemd-analyze checks that ExecStart exists: point it at this checkout's twistd.
    local = tmp_path / f"{name}.service"
    local.write_text((UNITS / f"{name}.service").read_text().replace(INSTALLED_TWISTD, TWISTD))
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(local)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0 and verify.stdout + verify.stderr == "", verify
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(local)], capture_output=True, text=True, timeout=60
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout)
    assert match is not None, security
    assert float(match.group(1)) <= 2.0, security.stdout[-400:]


def test_node_unit_stops_engines_itself_and_keeps_their_pidfiles() -> None:
    """iop-node: SIGTERM to the Node alone (it stops its engines after its requests), time for
    the grace and an engine's stop, and a state directory for the engines' pidfiles."""
    node = dict(read_unit("iop-node")["Service"])
    assert node["KillMode"] == "mixed" and node["StateDirectory"] == "twisted-iop/node"
    assert int(node["TimeoutStopSec"].removesuffix("s")) >= 10 + 20 + 5
    for other in ("iop-control-plane", "iop-edge"):
        service = dict(read_unit(other)["Service"])
        assert service["TimeoutStopSec"] == "20s" and "KillMode" not in service


def test_operations_guide_installs_what_the_units_run() -> None:
    """docs/operations.md installs each unit and its config where the unit's ExecStart reads it."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    assert "/opt/twisted-iop/bin/" in guide
    for name, conf in DAEMONS.items():
        assert f"configs/systemd/{name}.service" in guide
        assert f"/etc/iop/{conf}.yaml" in guide
    assert "LimitNOFILE" in guide
