"""The node-life soak on a real cluster: `scripts/bench.py soak`, every invariant a test.

The soak brings up its own scripts/cluster.sh cluster (NETCLAIM_SOAK_CLUSTER_DIR,
default /tmp/nc-soak), scales Deployments of ordinary and claimed pods while it
injects every fault of its cycle (publisher, kubelet and containerd restarts by
SIGKILL and SIGTERM, an API server restart, the journal's write lock held by
another process, the spool read-only, the state disk full, a reboot with the
clock behind, a primary-CNI conflist rewrite, and credential rotation: the
publisher's and the chain keeper's token files replaced the way kubelet
rotates a projected token, the old token revoked, neither process restarted),
and takes the cluster down. It
runs once per module, as a user would run it (a subprocess); each invariant of
its report is one test here, so a failure names the invariant and carries the
soak's own evidence. NETCLAIM_SOAK_MINUTES sets the length (default 5).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MINUTES = os.environ.get("NETCLAIM_SOAK_MINUTES", "5")
CLUSTER_DIR = os.environ.get("NETCLAIM_SOAK_CLUSTER_DIR", "/tmp/nc-soak")

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from benchlib.soak_report import INVARIANTS  # noqa: E402


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.fail("the soak needs root (a real kubelet, containerd, mounts)", pytrace=False)
    out = tmp_path_factory.mktemp("soak")
    cmd = [sys.executable, str(REPO / "scripts" / "bench.py"), "--out", str(out), "soak", "--minutes", MINUTES,
           "--dir", CLUSTER_DIR, "--plot", str(out / "soak.png")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=1800 + float(MINUTES) * 120)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the soak still takes its cluster down
        stdout, stderr = proc.communicate(timeout=600)
    report = out / "soak.json"
    if not report.exists():
        pytest.fail(f"the soak wrote no report (exit {proc.returncode}):\n{stderr[-4000:]}", pytrace=False)
    figures = json.loads(report.read_text())
    figures["_stdout"] = stdout
    return figures


def slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())[:60]


@pytest.mark.parametrize("invariant", INVARIANTS, ids=[slug(i) for i in INVARIANTS])
def test_soak_invariant(soak: dict[str, Any], invariant: str) -> None:
    verdict = soak["invariants"].get(invariant)
    assert verdict is not None, f"the soak's report has no verdict for {invariant!r}"
    assert verdict["ok"], (f"soak invariant failed: {invariant}\nevidence: {json.dumps(verdict['detail'], indent=1)[:3000]}"
                           f"\n\nsoak summary:\n{soak['_stdout'][-6000:]}")


def test_soak_leaves_the_host_clean(soak: dict[str, Any]) -> None:
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        mounts = [line.split()[1] for line in fh if line.split()[1].startswith(CLUSTER_DIR.rstrip("/") + "/")]
    assert not mounts, f"mounts left under {CLUSTER_DIR}: {mounts}"
    assert not Path(CLUSTER_DIR).exists(), f"{CLUSTER_DIR} left behind"
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    left = [line for line in ps.splitlines() if CLUSTER_DIR + "/" in line]
    assert not left, f"processes of the soak's cluster still run: {left}"
    assert any("host clean" in note for note in soak["teardown"]), soak["teardown"]
