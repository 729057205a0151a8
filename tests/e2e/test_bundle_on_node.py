"""The containerd chain runs the installed self-contained plugin, and a node
whose publisher is gone for good keeps starting and stopping pods.

scripts/install.sh put the static executable from scripts/build-plugin.sh into
the harness's CNI bin dir; containerd runs it for every sandbox. With no
publisher at all (DaemonSet deleted, service disabled) each ADD and DEL falls
back to the spool, which the plugin caps (`spoolMaxFiles`): pods still start
and stop, the spool stays under its cap, and the drops are counted in the
`overflow` marker the publisher reports when it returns.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from runtime.cni_conf import NetclaimInstall
from runtime.cri import PodMeta

REPO = Path(__file__).resolve().parents[2]
SPOOL_CAP = 3

pytestmark = [pytest.mark.containerd]


def _built_bundle() -> bytes:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-plugin.sh")], capture_output=True, text=True,
                          timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Path(proc.stdout.strip().splitlines()[-1]).read_bytes()


def _capped(conflist: Path) -> Path:
    """The installed entry with a small spool cap (an operator's conflist edit)."""
    doc = json.loads(conflist.read_text())
    doc["plugins"][-1].update(spoolMaxFiles=SPOOL_CAP)
    conflist.write_text(json.dumps(doc, indent=2) + "\n")
    return conflist


def _start_stop(harness, name: str) -> list[str]:
    info = harness.run_pod(PodMeta(name, "bundle-e2e", str(uuid.uuid4())))
    try:
        return info.ips
    finally:
        harness.stop_pod(info.id)
        harness.remove_pod(info.id)


def test_containerd_runs_the_installed_static_plugin(harness, node_dirs: NetclaimInstall) -> None:
    conflist = harness.stage_conflist(f"bundle-{uuid.uuid4().hex[:6]}", node_dirs)
    installed = harness.paths.cni_bin_dir / "netclaim"
    data = installed.read_bytes()
    assert data[:4] == b"\x7fELF" and data == _built_bundle(), "the chain's netclaim is not the built bundle"
    assert str(REPO).encode() not in data
    harness.activate(conflist)

    ips = _start_stop(harness, "bundle-web")

    assert ips, "the pod got no IP"
    records = [json.loads(line) for line in Path(node_dirs.log_file).read_text().splitlines()]
    assert {r.get("command") for r in records} >= {"ADD", "DEL"}, "containerd did not run netclaim"


def test_publisher_gone_for_good_pods_still_start_and_stop_and_the_spool_stays_capped(
        harness, node_dirs: NetclaimInstall) -> None:
    conflist = _capped(harness.stage_conflist(f"gone-{uuid.uuid4().hex[:6]}", node_dirs))
    harness.activate(conflist)
    assert not node_dirs.socket.exists(), "a publisher is listening: this test needs none"

    started = [_start_stop(harness, f"gone-{i}") for i in range(SPOOL_CAP + 3)]

    assert all(started), f"a pod got no IP: {started}"
    spool = Path(node_dirs.spool_dir)
    spooled = sorted(p.name for p in spool.iterdir() if p.name.endswith(".json"))
    assert len(spooled) <= SPOOL_CAP, spooled
    marker = json.loads((spool / "overflow").read_text())
    # (SPOOL_CAP + 3) pods x (ADD + DEL) events, SPOOL_CAP of them kept.
    assert marker["dropped"] >= 2 * (SPOOL_CAP + 3) - SPOOL_CAP, marker
