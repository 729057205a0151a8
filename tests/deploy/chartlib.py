"""The Helm chart as the tests use it: the real helm binary, rendering, and the shipped role.

helm is built from Go modules by scripts/build/components.sh (cached by
version). A test that cannot get it fails with the reason; it is not skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from deploylib import DRIVER, REPO

CHART = REPO / "conf" / "helm" / "netclaim"
BUILD = REPO / "scripts" / "build" / "components.sh"


def kube_version() -> str:
    """The Kubernetes version built here: offline rendering checks the chart's kubeVersion against it."""
    gomod = (REPO / "scripts" / "build" / "gomod" / "kubernetes" / "go.mod").read_text()
    return re.search(r"^require k8s\.io/kubernetes (v[0-9.]+)$", gomod, re.M).group(1)


def helm_binary() -> str:
    """$HELM, else the cached build of the pinned version, else build it (waits for the build lock)."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    gomod = (REPO / "scripts" / "build" / "gomod" / "helm" / "go.mod").read_text()
    version = re.search(r"^require helm\.sh/helm/v3 (v[0-9.]+)$", gomod, re.M).group(1)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "netclaim" / "bin"
    cached = cache / f"helm-{version}"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    proc = subprocess.run([str(BUILD), "helm"], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise AssertionError(f"helm could not be built: {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def helm(*args: str, kubeconfig: str | None = None, check: bool = True,
         timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
           "HELM_CACHE_HOME": "/tmp/netclaim-helm-cache", "HELM_CONFIG_HOME": "/tmp/netclaim-helm-config",
           "HELM_DATA_HOME": "/tmp/netclaim-helm-data"}
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(*sets: str, driver: str | None = DRIVER, release: str = "netclaim", namespace: str = "netclaim-system",
           chart: Path = CHART) -> list[dict[str, Any]]:
    """`helm template` with --set KEY=VALUE pairs; the rendered objects.

    The chart has no default driverName (a render without one is refused), so every render
    passes `--set driverName=<driver>` first, as an operator must: the e2e test driver unless
    `driver` names another; a `driverName=...` among `sets` comes later and wins. `driver=None`
    renders without one (the refusal)."""
    args = ["template", release, str(chart), "--namespace", namespace, "--kube-version", kube_version()]
    if driver is not None:
        args += ["--set", f"driverName={driver}"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def driver_set(driver: str = DRIVER) -> tuple[str, str]:
    """The `--set driverName=...` pair for a helm command line of a test's own."""
    return ("--set", f"driverName={driver}")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = by_kind(docs, kind)
    return doc
