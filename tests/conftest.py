"""Fixtures shared by every test suite: the real local control plane.

The control plane is the real etcd + kube-apiserver that scripts/control-plane.sh
builds and starts. A test that needs it and cannot get it fails with the reason;
it is never skipped. When the control plane was already up before the session
(a developer keeping one running), the session reuses it and leaves it up;
otherwise the session starts it and stops it at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONTROL_PLANE = REPO / "scripts" / "control-plane.sh"
sys.path.insert(0, str(REPO / "tests"))
sys.path.append(str(REPO / "scripts" / "harness"))  # appended: scripts/harness/runtime never shadows a package

from runtime.realcluster import parse_env  # noqa: E402  (one reader of `... env` exports)
from runtime.statedir import DEFAULT_CP_DIR, UnsafeStateDir, secure_state_dir  # noqa: E402


def _run_cp(*args: str, env: dict[str, str]) -> str:
    try:  # the script runs as root and sources files from it: ours alone, or refused
        secure_state_dir(env.get("NETCLAIM_CP_DIR") or DEFAULT_CP_DIR, create=False)
    except UnsafeStateDir as exc:
        raise RuntimeError(str(exc)) from None
    proc = subprocess.run(
        [str(CONTROL_PLANE), *args], env=env, capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"scripts/control-plane.sh {' '.join(args)} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-4000:]}"
        )
    return proc.stdout


@dataclass
class ControlPlane:
    """Handle on the running control plane, as tests see it."""

    dir: Path
    kubeconfig: str
    server: str
    ca_file: str
    env: dict[str, str] = field(repr=False)
    started_here: bool = False

    def token(self, user: str) -> str:
        """Bearer token of a static user: admin, system:node:node-a, system:node:node-b."""
        for line in (self.dir / "tokens.csv").read_text().splitlines():
            parts = line.split(",")
            if len(parts) >= 2 and parts[1] == user:
                return parts[0]
        raise KeyError(f"no static token for {user!r}")

    def kubeconfig_for_token(self, token: str, path: str | os.PathLike[str]) -> str:
        """Write a kubeconfig that authenticates with `token`; returns its path."""
        text = (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: local\n  cluster:\n    server: {self.server}\n"
            f"    certificate-authority: {self.ca_file}\n"
            f"users:\n- name: user\n  user:\n    token: {token}\n"
            "contexts:\n- name: local\n  context: {cluster: local, user: user}\n"
            "current-context: local\n"
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return str(path)

    def api_client(self, kubeconfig: str | None = None):  # -> kubernetes.client.ApiClient
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig or self.kubeconfig, client_configuration=configuration)
        return client.ApiClient(configuration)

    def stop_apiserver(self) -> None:
        _run_cp("apiserver-stop", env=self.env)

    def start_apiserver(self) -> None:
        _run_cp("apiserver-start", env=self.env)


@pytest.fixture(scope="session")
def control_plane() -> ControlPlane:
    env = dict(os.environ)
    env.setdefault("NETCLAIM_CP_DIR", DEFAULT_CP_DIR)
    try:
        secure_state_dir(env["NETCLAIM_CP_DIR"], create=False)
    except UnsafeStateDir as exc:
        pytest.fail(f"the real control plane could not start: {exc}", pytrace=False)
    status = subprocess.run([str(CONTROL_PLANE), "status"], env=env, capture_output=True, text=True)
    already_up = status.returncode == 0 and "kube-apiserver: running" in status.stdout
    try:
        _run_cp("up", env=env)
        values = parse_env(_run_cp("env", env=env))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"the real control plane could not start: {exc}", pytrace=False)
    cp = ControlPlane(
        dir=Path(values["NETCLAIM_CP_DIR"]),
        kubeconfig=values["KUBECONFIG"],
        server=values["NETCLAIM_APISERVER"],
        ca_file=values["NETCLAIM_APISERVER_CA"],
        env=env,
        started_here=not already_up,
    )
    yield cp
    if cp.started_here and not os.environ.get("NETCLAIM_CP_KEEP"):
        _run_cp("down", env=env)


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane):
    """An admin kubernetes.client.ApiClient on the real API server."""
    client = control_plane.api_client()
    yield client
    client.close()
