"""A kubeconfig's exec credential plugin, run once, for the commands an operator runs by hand.

Managed clusters hand operators kubeconfigs whose user is a command (a cloud CLI's get-token,
kubelogin, ...) that prints an ExecCredential. `netclaim-publisher fleet` runs on an operator's
machine with such a kubeconfig, so it runs the plugin as kubectl does: the kubeconfig's command,
args and env, KUBERNETES_EXEC_INFO describing the call (not interactive: stdin is not passed on;
the plugin's stderr is, for its messages), the cluster's details when `provideClusterInfo` asks.
The command is found where kubectl finds it (client-go's rule for a kubeconfig's file
references): a bare name in PATH; a relative path such as `./bin/get-token` in the directory of
the kubeconfig file that names it, wherever `fleet` is run from.
It runs once per invocation: a one-shot command outlives no token, so there is no refresh.

The node agent never runs one (publisher/kube/apiclient.py refuses `exec` there): a credential on
a node is a file the kubelet or the operator keeps fresh, not a program run from the service.
What the plugin prints is a credential: it is never logged or put into an error message, and
neither are its args (a time-out names the command only).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
TIMEOUT = 120.0  # a plugin may open a browser or refresh through an identity provider


class ExecError(ValueError):
    """The plugin could not give a credential; the message names the plugin, never its output."""


@dataclass(frozen=True)
class ExecCredential:
    token: str = ""
    cert_pem: bytes = b""
    key_pem: bytes = b""


def _cluster_info(cluster: dict[str, Any], ca_pem: bytes) -> dict[str, Any]:
    """spec.cluster as client-go fills it for provideClusterInfo."""
    info: dict[str, Any] = {"server": cluster.get("server", "")}
    if ca_pem:
        info["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    for key in ("tls-server-name", "insecure-skip-tls-verify", "proxy-url"):
        if cluster.get(key):
            info[key] = cluster[key]
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = ext.get("extension")
    return info


def _checked_spec(spec: dict[str, Any], user_name: str) -> tuple[str, list[str], dict[str, str], str]:
    """The command line, its environment and apiVersion, or an error naming what is wrong."""
    where = f"user {user_name!r} exec"
    api_version = spec.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ExecError(f"{where}: apiVersion {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    command = spec.get("command")
    if not command or not isinstance(command, str):
        raise ExecError(f"{where}: no command")
    if spec.get("interactiveMode") == "Always":
        raise ExecError(f"{where}: interactiveMode Always needs a terminal to answer the plugin; "
                        "log in with it once (e.g. through kubectl), or use a kubeconfig with a token")
    args = [str(a) for a in spec.get("args") or []]
    env = dict(os.environ)
    for item in spec.get("env") or []:
        if isinstance(item, dict) and item.get("name"):
            env[str(item["name"])] = str(item.get("value", ""))
    return command, args, env, api_version


def resolved_command(command: str, base: str) -> str:
    """The command as kubectl runs it: one with a path separator that is not absolute is relative
    to `base`, the directory of the kubeconfig file that names it (as are its tokenFile and
    certificate files); a bare name is left to the PATH lookup."""
    if base and os.sep in command and not os.path.isabs(command):
        return os.path.normpath(os.path.join(base, command))
    return command


def run(spec: dict[str, Any], user_name: str, cluster: dict[str, Any], ca_pem: bytes,
        base: str = "") -> ExecCredential:
    """Run the plugin once and return what it printed as a credential. `base`: the directory of the
    kubeconfig file the user came from (a relative command is found there)."""
    command, args, env, api_version = _checked_spec(spec, user_name)
    command = resolved_command(command, base)
    where = f"user {user_name!r} exec plugin {command!r}"
    info: dict[str, Any] = {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    if spec.get("provideClusterInfo"):
        info["spec"]["cluster"] = _cluster_info(cluster, ca_pem)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
    try:
        proc = subprocess.run([command, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              timeout=TIMEOUT, check=False)
    except FileNotFoundError:
        hint = spec.get("installHint") or ""
        raise ExecError(f"{where}: not found{': ' + ' '.join(str(hint).split()) if hint else ''}") from None
    except subprocess.TimeoutExpired:  # its message would repeat the args, which may hold secrets
        raise ExecError(f"{where}: gave no credential within {TIMEOUT:.0f} s (stopped)") from None
    except OSError as exc:  # names the command's file at most
        raise ExecError(f"{where}: {type(exc).__name__}: {exc}") from None
    if proc.returncode != 0:
        raise ExecError(f"{where} exited {proc.returncode} (its messages are above)")
    return _parse(proc.stdout, api_version, where)


def _parse(out: bytes, api_version: str, where: str) -> ExecCredential:
    try:
        doc = json.loads(out)
    except ValueError:
        raise ExecError(f"{where}: did not print an ExecCredential (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ExecError(f"{where}: did not print an ExecCredential")
    if doc.get("apiVersion") != api_version:
        raise ExecError(f"{where}: printed apiVersion {doc.get('apiVersion')!r}, the kubeconfig asks for {api_version}")
    status = doc.get("status") or {}
    token = status.get("token") or ""
    cert, key = status.get("clientCertificateData") or "", status.get("clientKeyData") or ""
    if bool(cert) != bool(key):
        raise ExecError(f"{where}: printed only one of clientCertificateData and clientKeyData")
    if not token and not cert:
        raise ExecError(f"{where}: printed neither a token nor a client certificate")
    _check_expiry(status.get("expirationTimestamp"), where)
    return ExecCredential(token=str(token), cert_pem=str(cert).encode(), key_pem=str(key).encode())


def _check_expiry(stamp: Any, where: str) -> None:
    """Refuse a credential whose expirationTimestamp has passed. Why: a plugin whose cached login ran out
    may still print its last token; run once, it would reach the API server only to be refused with a 401
    that names no cause, while this names the plugin and the time (the timestamp is not a secret)."""
    if stamp is None:
        return
    try:
        expires = datetime.fromisoformat(str(stamp))  # RFC 3339, "Z" too (Python 3.11+)
    except ValueError:
        raise ExecError(f"{where}: printed an expirationTimestamp that is not an RFC 3339 time") from None
    if expires.tzinfo is None:  # RFC 3339 always carries its offset
        raise ExecError(f"{where}: printed an expirationTimestamp that is not an RFC 3339 time")
    if expires <= datetime.now(UTC):
        when = expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # a time, never the printed text
        raise ExecError(f"{where}: printed a credential that expired at {when}: log in with the plugin again")
