"""The API client a command's --kubeconfig names, or one clear line about why it cannot be used.

The service (`run`) and the chain keeper make their client here, so a missing file, a broken
kubeconfig or an unusable service account reads the same everywhere: one line on stderr, never a
traceback (one_line, config_error; publisher/cli.py words its other configuration errors with them).
"""

from __future__ import annotations

import os
from typing import Any

import click


def one_line(text: str) -> str:
    """Collapse a multi-line message (YAML parser errors, API Status) into one line."""
    return " ".join(str(text).split())


def config_error(what: str, exc: BaseException) -> click.ClickException:
    """A configuration error as the one line an operator reads in `kubectl logs` or the journal."""
    return click.ClickException(f"{what}: {one_line(str(exc)) or type(exc).__name__}")


def api_client_for(kubeconfig: str | None, pool_size: int) -> Any:
    """The API client, or one clear line about why the credential cannot be used."""
    from publisher.kube.apiclient import ConfigError
    from publisher.kube.calls import load_client

    if kubeconfig:
        paths = [p for p in kubeconfig.split(os.pathsep) if p]
        if not any(os.path.isfile(p) for p in paths):
            raise click.ClickException(f"kubeconfig {kubeconfig}: no such file")
        what = f"kubeconfig {kubeconfig}"
    else:
        what = "no --kubeconfig or KUBECONFIG given and the in-cluster service account is unusable"
    try:
        client = load_client(kubeconfig, pool_size=pool_size)
    except (ConfigError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise config_error(what, exc) from None
    if getattr(getattr(client, "endpoint", None), "system_roots", False):
        from publisher import logs

        logs.get().warning("the kubeconfig names no certificate-authority: the API server's certificate is "
                           "checked against the system's CA store (as kubectl does); name the cluster's CA to "
                           "trust it alone", extra={"kubeconfig": kubeconfig or ""})
    return client
