"""Bring the project's real control plane up (or reuse a running one) for the demo and benchmarks."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .statedir import DEFAULT_CP_DIR, UnsafeStateDir, secure_state_dir

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "control-plane.sh"


@dataclass
class ControlPlaneHandle:
    kubeconfig: str
    server: str
    started_here: bool
    env: dict[str, str]
    ca_file: str = ""

    def down(self) -> None:
        """Stop it only when we started it: a developer's running control plane stays."""
        if self.started_here:
            _run("down", env=self.env)


def _run(*args: str, env: dict[str, str]) -> str:
    """Run scripts/control-plane.sh on a state dir that is ours alone (runtime/statedir.py)."""
    try:
        secure_state_dir(env.get("NETCLAIM_CP_DIR") or DEFAULT_CP_DIR, create=False)
    except UnsafeStateDir as exc:
        raise RuntimeError(str(exc)) from None
    done = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/control-plane.sh {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def up() -> ControlPlaneHandle:
    env = dict(os.environ)
    _run("status", env=env)  # refuses an unsafe state dir before anything else runs
    status = subprocess.run([str(SCRIPT), "status"], env=env, capture_output=True, text=True)
    already = status.returncode == 0 and "kube-apiserver: running" in status.stdout
    _run("up", env=env)
    values = {}
    for line in _run("env", env=env).splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            values[key] = shlex.split(value)[0] if value else ""
    return ControlPlaneHandle(
        values["KUBECONFIG"], values.get("NETCLAIM_APISERVER", ""), not already, env,
        ca_file=values.get("NETCLAIM_APISERVER_CA", ""),
    )


def api_client(kubeconfig: str):
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)
