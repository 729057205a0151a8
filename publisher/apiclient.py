"""One connection pool to the API server, from a kubeconfig or the in-cluster service account.

The publisher makes a handful of raw REST calls: GET a claim or a pod, a
server-side apply of a claim's status, a few watches and Events. The
kubernetes package would do them through a client that imports its ~1,800
generated model classes: 16 MiB of RSS on every node (80 GiB over 5,000
nodes) for code the publisher never runs. So this module reads the two
credential forms a node agent is given, a kubeconfig (token, tokenFile or
client certificate) or the projected service-account token, and talks to the
API server with urllib3 alone. What a node agent is never given is refused
with a clear error instead of half-supported: exec plugins, auth providers,
basic auth, proxies.

Retries are not done here: the publisher's journal and backoff own them, so an
outage must surface at once, not hide behind a retry loop.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

import urllib3

IN_CLUSTER_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
Timeout = float | tuple[float, float]


class ConfigError(ValueError):
    """The credential cannot be used; the message says which part and why."""


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to authenticate to it; PEM and tokens as read from disk."""

    server: str
    ca_pem: bytes = b""
    insecure: bool = False
    tls_server_name: str = ""
    cert_pem: bytes = b""
    key_pem: bytes = b""
    token: str = ""

    def __repr__(self) -> str:  # never a token or a key in a log line or a traceback
        return f"Endpoint(server={self.server!r}, token={'set' if self.token else 'none'})"


def _read(path: str, base: str, what: str) -> bytes:
    full = path if os.path.isabs(path) else os.path.join(base, path)
    try:
        with open(full, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"{what} {full}: {exc.strerror or exc}") from None


def _data_or_file(section: dict[str, Any], key: str, base: str) -> bytes:
    """`<key>-data` (base64) wins over `<key>` (a file, relative to the kubeconfig), as kubectl reads them."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            raise ConfigError(f"{key}-data is not base64") from None
    path = section.get(key)
    return _read(path, base, key) if path else b""


def _named(doc: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    for item in doc.get(f"{kind}s") or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(kind) or {}
    raise ConfigError(f"no {kind} named {name!r}")


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml  # only here: the in-cluster form needs no YAML

    try:
        with open(path, "rb") as fh:
            doc = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a kubeconfig (a mapping is expected)")
    return doc


def from_kubeconfig(kubeconfig: str) -> Endpoint:
    """The current context of a kubeconfig (KUBECONFIG may list several files: the first file that
    sets current-context decides it; clusters and users are looked up in every file, first wins)."""
    docs = [(p, _load_yaml(p)) for p in kubeconfig.split(os.pathsep) if p]
    if not docs:
        raise ConfigError("no kubeconfig file given")
    context_name = next((d.get("current-context") for _, d in docs if d.get("current-context")), "")
    if not context_name:
        raise ConfigError("no current-context")

    def lookup(kind: str, name: str) -> tuple[dict[str, Any], str]:
        for path, doc in docs:
            try:
                return _named(doc, kind, name), os.path.dirname(os.path.abspath(path))
            except ConfigError:
                continue
        raise ConfigError(f"no {kind} named {name!r}")

    context, _ = lookup("context", context_name)
    cluster, cluster_base = lookup("cluster", context.get("cluster", ""))
    user, user_base = lookup("user", context.get("user", "")) if context.get("user") else ({}, "")
    for unsupported in ("exec", "auth-provider", "username", "password"):
        if user.get(unsupported):
            raise ConfigError(f"user {context.get('user')!r}: {unsupported} is not supported by netclaim-publisher; "
                              "give it a token, tokenFile or client certificate")
    if cluster.get("proxy-url"):
        raise ConfigError("proxy-url is not supported by netclaim-publisher")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith("https://"):
        raise ConfigError(f"cluster server {server!r}: an https:// URL is required")
    token = str(user.get("token") or "")
    if not token and user.get("tokenFile"):
        token = _read(user["tokenFile"], user_base, "tokenFile").decode().strip()
    return Endpoint(server=server, ca_pem=_data_or_file(cluster, "certificate-authority", cluster_base),
                    insecure=bool(cluster.get("insecure-skip-tls-verify")),
                    tls_server_name=str(cluster.get("tls-server-name") or ""),
                    cert_pem=_data_or_file(user, "client-certificate", user_base),
                    key_pem=_data_or_file(user, "client-key", user_base), token=token.strip())


def in_cluster(directory: str = IN_CLUSTER_DIR) -> Endpoint:
    """The pod's service account: the projected token (rotated by the kubelet; re-read by Credentials)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError("KUBERNETES_SERVICE_HOST/PORT are not set: not in a pod")
    if ":" in host:
        host = f"[{host}]"
    token = _read(os.path.join(directory, "token"), directory, "service-account token").decode().strip()
    return Endpoint(server=f"https://{host}:{port}", ca_pem=_read(os.path.join(directory, "ca.crt"), directory,
                                                                   "service-account CA"), token=token)


def _ssl_context(ep: Endpoint) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ep.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ep.ca_pem:
        try:
            ctx.load_verify_locations(cadata=ep.ca_pem.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            raise ConfigError(f"certificate-authority: {exc.reason or exc}") from None
    if ep.cert_pem or ep.key_pem:
        _load_client_cert(ctx, ep.cert_pem, ep.key_pem)
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl reads a certificate chain only from paths: hand it memory files, so a key never touches a disk."""
    if not cert or not key:
        raise ConfigError("a client certificate needs both client-certificate and client-key")
    fds = [os.memfd_create("netclaim-cert", os.MFD_CLOEXEC), os.memfd_create("netclaim-key", os.MFD_CLOEXEC)]
    try:
        for fd, data in zip(fds, (cert, key)):
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    except ssl.SSLError as exc:
        raise ConfigError(f"client certificate or key: {exc.reason or exc}") from None
    finally:
        for fd in fds:
            os.close(fd)


@dataclass
class Reply:
    """A whole answer: its status, body and headers (the connection is back in the pool already)."""

    status: int
    data: bytes
    headers: Any = None  # urllib3's case-insensitive headers: Retry-After of a 429 (publisher/kube.py)

    def read(self) -> bytes:
        return self.data


class ApiClient:
    """A bounded pool of keep-alive HTTPS connections to one API server."""

    def __init__(self, endpoint: Endpoint, pool_size: int = 8) -> None:
        url = urllib.parse.urlsplit(endpoint.server)
        self.endpoint = endpoint
        self.prefix = url.path.rstrip("/")
        self._auth = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
        self.pool = urllib3.HTTPSConnectionPool(
            url.hostname or "", url.port or 443, maxsize=pool_size, block=False, retries=False,
            ssl_context=_ssl_context(endpoint), server_hostname=endpoint.tls_server_name or None,
            assert_hostname=False if endpoint.insecure else (endpoint.tls_server_name or None))

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                headers: dict[str, str] | None = None, body: Any = None, timeout: Timeout = 10.0,
                stream: bool = False) -> Any:
        """A Reply, or with `stream` the open urllib3 response (the caller reads and releases it).

        Raises urllib3's errors when there is no answer; an HTTP error status is an answer."""
        url = self.prefix + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body, separators=(",", ":")).encode()
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        resp = self.pool.urlopen(method, url, body=body, headers={**self._auth, **(headers or {})},
                                 timeout=urllib3.Timeout(connect=connect, read=read), retries=False,
                                 redirect=False, preload_content=False, release_conn=not stream)
        if stream:
            return resp
        try:
            return Reply(resp.status, resp.read(), resp.headers)
        finally:
            resp.release_conn()

    def close(self) -> None:
        self.pool.close()


def load(kubeconfig: str | None, pool_size: int = 8) -> ApiClient:
    """The client for a kubeconfig (a path, or several joined like KUBECONFIG), else the in-cluster account."""
    return ApiClient(from_kubeconfig(kubeconfig) if kubeconfig else in_cluster(), pool_size)
