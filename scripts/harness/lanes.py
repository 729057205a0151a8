"""Run the whole suite as lanes side by side, each with its own real parts: `scripts/test.sh`.

Most of the suite's time is spent waiting on real components (a kubelet starting a pod, an API
server restarting, a soak's fault window), not on the CPU. Pytest processes that share no
real part overlap those waits. A lane is a set of test directories; every test still runs exactly once,
with the same real parts as a single run.

The lanes share no real part. Lane "a" uses the shared control plane (the model tests) and the
soak's own cluster; lane "b" uses every other cluster, each in its own directory already, and
gets a control plane of its own (the publisher and integration tests run against it) under a
0700 directory (the same ownership checks as every harness state dir). Everything else a test
makes has a random name (netns, bridges, temp dirs); the temp dir stays the same, because a unix socket's path is bounded (108 bytes) and some
tests' socket paths are already near it. The other lanes' output goes to log files, printed whole after
lane a's, so each lane reads as one ordinary pytest run. SIGINT or SIGTERM interrupts every lane
the way Ctrl-C interrupts pytest, so their fixtures still tear the clusters down.

    python3 scripts/harness/lanes.py [pytest options...]

The exit code is the first failing lane's (pytest's codes), 0 when every lane passes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build"))

from runtime.statedir import secure_state_dir  # noqa: E402
from version_table import matrix_minors, newest_minor

REPO = Path(__file__).resolve().parents[2]
# Lane a takes the longest waits of the suite (the model's random interleavings, the node-life
# soak and the compressed node life on the chart); lane b runs every other test, so a new test
# directory can never be left out.
# Measured in one run with the publisher's tests in lane a: 39.4 and 28.6 min; they now run in
# lane b, against its own control plane.
LANE_A = ["tests/model", "tests/soak", "tests/deploy/test_node_life.py"]
# Lane c starts with the one test that sleeps: a publisher at rest for longer than the old resync
# interval (5 min, waiting on nothing but time by design), against a control plane of its own so
# that no other test's requests reach the server counts it compares. Then the release test (the
# artefacts, the chart installed by digest and the upgrade from the previous release, on a
# cluster of its own), the DaemonSet's install-rechain-upgrade-uninstall on a real cluster
# (about 5 min), every documented command of both installs run as written (a cluster of its own,
# about 2 min) and the image's and the plugins' cold rebuilds (about 3 min): lane b has no time
# left for them.
# The three-node cluster's module (a cluster of its own, about 5 min) moved here when lane b passed
# 47 min (lane c then 32).
# The version matrix (one real cluster per Kubernetes minor, about 1.5 min each once built) runs
# here too: its older minors' binaries are built, on a machine that lacks them, in the
# background from the lanes' start (prebuild), while this lane's first test sleeps.
LANE_C = ["tests/publisher/service/test_publisher_steady.py::test_idle_publisher_makes_no_request_per_claim",
          "tests/deploy/test_release.py", "tests/deploy/test_release_registry.py",
          "tests/deploy/test_kubernetes_versions.py", "tests/deploy/test_kubectl_plugin.py",
          "tests/deploy/test_daemonset_cluster.py", "tests/integration/test_style.py",
          "tests/deploy/test_documented_commands_run.py", "tests/bundle/test_reproducible_builds.py",
          "tests/cluster/test_multinode.py"]
LANES: dict[str, list[str]] = {"a": LANE_A, "b": ["tests", *(f"--ignore={p}" for p in LANE_A),
                                                  *(f"--deselect={p}" if "::" in p else f"--ignore={p}"
                                                    for p in LANE_C)], "c": LANE_C}


def lane_env(name: str, base: Path) -> dict[str, str]:
    """Lane a: the caller's environment. Other lanes: a control plane of their own."""
    env = dict(os.environ)
    if name != "a":
        env["NETCLAIM_CP_DIR"] = str(secure_state_dir(base / f"lane-{name}") / "control-plane")
    return env


def prebuild(base: Path) -> subprocess.Popen[bytes]:
    """Build (or find cached) the older Kubernetes minors of the version matrix, one after another, at low
    priority; a cluster of a minor that is not built yet waits for it on the build lock."""
    older = [m for m in matrix_minors() if m != newest_minor()]
    script = " && ".join(f"scripts/build/components.sh --kube {m} control-plane node >/dev/null" for m in older)
    with open(base / "prebuild.log", "wb") as out:
        return subprocess.Popen(["nice", "-n", "10", "bash", "-c", script or "true"], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def main(argv: list[str]) -> int:
    base = secure_state_dir(Path(tempfile.gettempdir()) / "netclaim-lanes")
    builds = prebuild(base)
    python = str(REPO / ".venv" / "bin" / "python")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    for name, paths in LANES.items():
        cmd = [python, "-m", "pytest", *argv, *paths]
        if name == "a":
            procs[name] = subprocess.Popen(cmd, cwd=REPO, env=lane_env(name, base), start_new_session=True)
        else:
            logs[name] = base / f"lane-{name}.log"
            with open(logs[name], "wb") as out:
                procs[name] = subprocess.Popen(cmd, cwd=REPO, env=lane_env(name, base), stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        print(f"[lanes] lane {name} (pid {procs[name].pid}): {' '.join(paths)}", file=sys.stderr, flush=True)

    # Each lane is in a session of its own, so a terminal's Ctrl-C reaches the lanes only through
    # this forward: once (a second SIGINT would cut pytest's teardowns short and leave clusters up).
    def stop(_signum: int, _frame: object) -> None:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # pytest's KeyboardInterrupt: teardowns run

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started = time.monotonic()
    codes: dict[str, int] = {}
    took: dict[str, float] = {}
    while len(codes) < len(procs):  # in the order they end, so each lane's time is its own
        for name, p in procs.items():
            if name not in codes and p.poll() is not None:
                codes[name], took[name] = p.returncode, time.monotonic() - started
        time.sleep(1)
    for name, path in logs.items():
        print(f"\n[lanes] ===== lane {name}: {' '.join(LANES[name])} =====", flush=True)
        sys.stdout.write(path.read_text(errors="replace"))
    if builds.wait() != 0:
        print(f"[lanes] building the older Kubernetes minors failed: {base / 'prebuild.log'}", flush=True)
    summary = ", ".join(f"lane {n} exit {codes[n]} in {took[n] / 60:.1f} min" for n in procs)
    print(f"\n[lanes] {summary}", flush=True)
    return next((codes[n] for n in procs if codes[n] != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
