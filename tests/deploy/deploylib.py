"""Helpers for the deployment tests: what an operator installs, checked for real.

The shipped files under conf/ and scripts/install.sh are used as they are;
where a test must rename something (a unique bridge, namespace or binding name
so that parallel test runs do not collide), it rewrites a copy and says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
INSTALL_SH = REPO / "scripts" / "install.sh"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
DRIVER = "net.example.com"

# The runtime helpers under scripts/ (process stop, node identity) serve the
# demo and these tests alike.
sys.path.insert(0, str(REPO / "scripts" / "harness"))
from runtime.procs import terminate  # noqa: E402,F401


class Looker:
    """Looks at something every `every` seconds in a thread of its own while a `with` block runs: what
    the test does in the block (a rollout, a fault) must never show, so the look records what it saw."""

    every = 0.5

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def look(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self.look()

    def __enter__(self) -> Looker:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


def suffix() -> str:
    """A short random suffix for names shared with other test runs (netns, links, API objects)."""
    return uuid.uuid4().hex[:6]


def run_install(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """scripts/install.sh exactly as an operator (or the e2e harness) calls it."""
    proc = subprocess.run(
        ["bash", str(INSTALL_SH), *args], capture_output=True, text=True, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"install.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest shipped in conf/ (sorted: namespace first)."""
    return sorted((CONF / "kubernetes").rglob("*.yaml"), key=lambda p: (p.parent != CONF / "kubernetes", str(p)))


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: sections -> key -> values (keys may repeat), with backslash continuations joined."""
    return parse_unit_text(path.read_text())


def parse_unit_text(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    logical = re.sub(r"\\\n\s*", " ", text)
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, line
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def netclaim_publisher_bin() -> Path:
    return REPO / ".venv" / "bin" / "netclaim-publisher"


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


__all__ = [
    "CONF",
    "DRIVER",
    "INSTALL_SH",
    "REPO",
    "VENV_PYTHON",
    "load_yaml_docs",
    "manifest_files",
    "netclaim_publisher_bin",
    "parse_unit",
    "parse_unit_text",
    "python_env",
    "run_install",
    "suffix",
]


def own_cluster(env_var: str, default_dir: str, env: dict[str, str] | None = None) -> Iterator[Any]:
    """A real cluster in a directory of its own for one test module (`up` is a no-op when it is up
    already), brought down afterwards unless NETCLAIM_CLUSTER_KEEP; a cluster that cannot start
    fails the module with the reason. `env`: cluster.sh settings the module's cluster is started with
    (NETCLAIM_CLUSTER_FEATURE_GATES)."""
    import pytest
    from runtime.realcluster import ClusterError, RealCluster

    if os.geteuid() != 0:
        pytest.fail("the real cluster needs root", pytrace=False)
    directory = os.environ.get(env_var, default_dir)
    try:
        real = RealCluster.up(directory, {**os.environ, **(env or {}), "NETCLAIM_CLUSTER_DIR": directory})
    except ClusterError as exc:
        pytest.fail(f"the real cluster could not start: {exc}", pytrace=False)
    yield real
    if not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
        real.down()
