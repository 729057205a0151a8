"""Operator conventions of netclaim-publisher: one-line configuration errors, KUBECONFIG honoured."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploylib import netclaim_publisher_bin, python_env

PROG = "netclaim-publisher"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(netclaim_publisher_bin()), *args], capture_output=True, text=True,
                          env={**python_env(), **(env or {})}, timeout=60)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"{PROG}: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("args, expect", [
    (["run", "--node-name", "n", "--workers", "0"], "--workers"),
    (["run", "--node-name", "n", "--metrics-address", "nohost"], "is not HOST:PORT"),
    (["run"], "--node-name"),
    (["bogus"], "No such command"),
    (["chain-keeper", "--plugin-binary", "/nonexistent/netclaim"], "no such file"),
])
def test_bad_flag_values_are_one_line(args: list[str], expect: str) -> None:
    assert expect in one_error_line(run(*args))


def test_missing_kubeconfig_is_one_line(tmp_root: Path) -> None:
    line = one_error_line(run("run", "--node-name", "n", "--kubeconfig", str(tmp_root / "nope"),
                              "--state-dir", str(tmp_root / "s"), "--socket", str(tmp_root / "sock")))
    assert "no such file" in line


def test_broken_kubeconfig_from_KUBECONFIG_is_one_line(tmp_root: Path) -> None:
    bad = tmp_root / "kubeconfig"
    bad.write_text("clusters: [\n  - {name: x\n")
    line = one_error_line(run("run", "--node-name", "n", "--state-dir", str(tmp_root / "s"),
                              env={"KUBECONFIG": str(bad)}))
    assert str(bad) in line  # KUBECONFIG was used, and its problem named


def test_no_credentials_at_all_is_one_line(tmp_root: Path) -> None:
    env = python_env()
    for key in ("KUBECONFIG", "NETCLAIM_KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        env.pop(key, None)
    proc = subprocess.run([str(netclaim_publisher_bin()), "run", "--node-name", "n"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert "in-cluster" in one_error_line(proc)


def test_metric_names_follow_prometheus_conventions_and_backlog_gauges(tmp_root: Path) -> None:
    import time

    from prometheus_client.parser import text_string_to_metric_families

    import cni_plugin
    from publisher.keeper.guard import KeeperMetrics
    from publisher.observe.metrics import Metrics

    metrics = Metrics()
    spool = tmp_root / "spool"
    spool.mkdir()
    old = time.time_ns() - 90 * 10**9
    (spool / f"{old:020d}-abc.event.json").write_text("{}")
    (spool / f"{time.time_ns():020d}-def.event.json").write_text("{}")
    (spool / "junk.tmp").write_text("")
    journaled = [30.0]  # age of the oldest pending journal event, seconds
    metrics.watch_backlog(str(spool), lambda: journaled[0])
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    for exposition in (metrics.exposition(), KeeperMetrics().exposition()):
        for fam in text_string_to_metric_families(exposition.decode()):
            assert fam.name.startswith(("netclaim_", "process_")), fam.name
            # A counter is <name>_total and nothing else; no _created series beside counters or histograms.
            assert not [s.name for s in fam.samples if s.name.endswith("_created")], fam.name
            if fam.type == "counter":
                assert all(s.name == f"{fam.name}_total" for s in fam.samples), fam.name
    assert families["netclaim_credential_reloads"].type == "counter"
    [info] = families["netclaim_build_info"].samples
    assert info.value == 1 and info.labels["version"] == cni_plugin.__version__
    assert families["netclaim_spool_depth"].samples[0].value == 2
    age = families["netclaim_oldest_pending_event_age_seconds"].samples[0].value
    assert 89 <= age <= 200  # the spool file is older than the journal's oldest
    journaled[0] = None
    for f in spool.iterdir():
        f.unlink()
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    assert families["netclaim_oldest_pending_event_age_seconds"].samples[0].value == 0
    assert families["netclaim_spool_depth"].samples[0].value == 0
