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
basic auth, proxies. (The one exception is an operator's command: `fleet` runs on a
laptop with a managed cluster's kubeconfig and may run its exec plugin once,
publisher/kube/execcred.py.)

Whom the client trusts is exactly what the kubeconfig names, as client-go
reads it, and stricter where client-go is lax:
- the API server's certificate is checked against the kubeconfig's CA alone
  (`certificate-authority` or `-data`; in a pod the service account's
  `ca.crt`), never against the system store as well. A CA that is named but
  empty is an error (it would otherwise mean "the system store"). Only a
  kubeconfig that names no CA at all falls back to the system store, as
  client-go does; the publisher logs a warning at start when it does.
- `insecure-skip-tls-verify` together with a CA is an error (client-go refuses
  it too: one of the two is a mistake).
- host names are matched against the certificate's subject alternative names
  only, never its common name (as Go's TLS does since Go 1.15), also with
  `tls-server-name`.
- `tokenFile` wins over an inline `token` (as client-go: the file is the one
  kept fresh); a token with a line break or any other character a header
  cannot carry is refused, naming where it came from, never its value.

Retries are not done here: the publisher's journal and backoff own them, so an
outage must surface at once, not hide behind a retry loop.
"""

from __future__ import annotations

import base64
import json
import os
import re
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

    @property
    def system_roots(self) -> bool:
        """No CA was named at all: the server is checked against the system store (as client-go does)."""
        return not self.insecure and not self.ca_pem


def _read(path: str, base: str, what: str) -> bytes:
    full = path if os.path.isabs(path) else os.path.join(base, path)
    try:
        with open(full, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"{what} {full}: {exc.strerror or exc}") from None


def _data_or_file(section: dict[str, Any], key: str, base: str) -> bytes:
    """`<key>-data` (base64) wins over `<key>` (a file, relative to the kubeconfig), as kubectl reads them.

    One that is named but holds nothing is an error naming it: for a CA, "empty" would
    otherwise silently mean "whatever the system store trusts"."""
    data = section.get(f"{key}-data")
    if data is not None and data != "":
        try:
            decoded = base64.b64decode(data, validate=True)
        except (ValueError, TypeError):
            raise ConfigError(f"{key}-data is not base64") from None
        if not decoded.strip():
            raise ConfigError(f"{key}-data is empty")
        return decoded
    path = section.get(key)
    if not path:
        return b""
    content = _read(path, base, key)
    if not content.strip():
        raise ConfigError(f"{key} {_full(path, base)} is empty")
    return content


def _full(path: str, base: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


# What a bearer token may hold: visible ASCII (a JWT, or a static token). A line break would split the
# Authorization header; the HTTP layer then refuses it with an error that quotes the header, token and all.
_TOKEN = re.compile(r"[\x21-\x7e]+")


def checked_token(token: str, where: str) -> str:
    """The token without surrounding whitespace (a file written by `echo`), or ConfigError naming
    `where` it came from: never a word of the token itself."""
    token = token.strip()
    if token and not _TOKEN.fullmatch(token):
        what = "a line break" if ("\n" in token or "\r" in token) else "a space or a control character"
        raise ConfigError(f"{where}: the token has {what} inside; a token is one line of visible characters")
    return token


def _token(user: dict[str, Any], name: str, base: str) -> str:
    """`tokenFile` wins over an inline `token`, as client-go reads them (the file is the one kept fresh)."""
    token_file = user.get("tokenFile")
    if token_file:
        raw = _read(token_file, base, "tokenFile").decode("utf-8", errors="replace")
        where = f"tokenFile {_full(token_file, base)}"
        if not raw.strip():
            raise ConfigError(f"{where} is empty")
        return checked_token(raw, where)
    return checked_token(str(user.get("token") or ""), f"user {name!r}: token")


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


def from_kubeconfig(kubeconfig: str, allow_exec: bool = False) -> Endpoint:
    """The current context of a kubeconfig (KUBECONFIG may list several files: the first file that
    sets current-context decides it; clusters and users are looked up in every file, first wins).
    `allow_exec`: run the user's exec plugin once for its credential (operators' commands only)."""
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
        if user.get(unsupported) and not (unsupported == "exec" and allow_exec):
            raise ConfigError(f"user {context.get('user')!r}: {unsupported} is not supported by netclaim-publisher; "
                              "give it a token, tokenFile or client certificate")
    if cluster.get("proxy-url"):
        raise ConfigError("proxy-url is not supported by netclaim-publisher")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith("https://"):
        raise ConfigError(f"cluster server {server!r}: an https:// URL is required")
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    ca_named = [k for k in ("certificate-authority", "certificate-authority-data") if cluster.get(k)]
    if insecure and ca_named:
        raise ConfigError(f"cluster {context.get('cluster')!r}: insecure-skip-tls-verify and {ca_named[0]} are both "
                          "set; one of them is a mistake (verify with the CA, or skip verification, not both)")
    ca_pem = _data_or_file(cluster, "certificate-authority", cluster_base)
    user_name = str(context.get("user") or "")
    cert_pem = _data_or_file(user, "client-certificate", user_base)
    key_pem = _data_or_file(user, "client-key", user_base)
    token = _token(user, user_name, user_base)
    if allow_exec and isinstance(user.get("exec"), dict):
        from publisher.kube import execcred

        try:
            cred = execcred.run(user["exec"], user_name, cluster, ca_pem, user_base)
        except execcred.ExecError as exc:
            raise ConfigError(str(exc)) from None
        token = checked_token(cred.token, f"user {user_name!r} exec plugin's token") if cred.token else token
        if cred.cert_pem:
            cert_pem, key_pem = cred.cert_pem, cred.key_pem
    return Endpoint(server=server, ca_pem=ca_pem, insecure=insecure,
                    tls_server_name=str(cluster.get("tls-server-name") or ""),
                    cert_pem=cert_pem, key_pem=key_pem, token=token)


def in_cluster(directory: str = IN_CLUSTER_DIR) -> Endpoint:
    """The pod's service account: the projected token (rotated by the kubelet; re-read by Credentials)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError("KUBERNETES_SERVICE_HOST/PORT are not set: not in a pod")
    if ":" in host:
        host = f"[{host}]"
    token_path, ca_path = os.path.join(directory, "token"), os.path.join(directory, "ca.crt")
    token = checked_token(_read(token_path, directory, "service-account token").decode("utf-8", errors="replace"),
                          f"service-account token {token_path}")
    ca = _read(ca_path, directory, "service-account CA")
    if not ca.strip():  # client-go would then trust the system store; a pod's API server is never in it
        raise ConfigError(f"service-account CA {ca_path} is empty")
    return Endpoint(server=f"https://{host}:{port}", ca_pem=ca, token=token)


def credential_files(kubeconfig: str | None, directory: str = IN_CLUSTER_DIR) -> list[str]:
    """Every file the client's trust and identity are read from: the kubeconfig files and the CA,
    client certificate, client key and token files they name, or the service account's token and
    CA. A change to any of them (a rotation) builds a new client (publisher/kube/calls.py Credentials)."""
    if not kubeconfig:
        return [os.path.join(directory, "token"), os.path.join(directory, "ca.crt")]
    files: list[str] = []
    for path in [p for p in kubeconfig.split(os.pathsep) if p]:  # KUBECONFIG may list several
        files.append(path)
        try:
            doc = _load_yaml(path)
        except ConfigError:
            continue
        base = os.path.dirname(os.path.abspath(path))
        sections: list[tuple[Any, tuple[str, ...]]] = [
            (item.get("cluster"), ("certificate-authority",)) for item in doc.get("clusters") or []
            if isinstance(item, dict)]
        sections += [(item.get("user"), ("client-certificate", "client-key", "tokenFile"))
                     for item in doc.get("users") or [] if isinstance(item, dict)]
        for section, keys in sections:
            if isinstance(section, dict):
                files += [_full(str(section[k]), base) for k in keys if section.get(k)]
    return files


def _ssl_context(ep: Endpoint) -> ssl.SSLContext:
    """A context that trusts exactly the endpoint's CA (the system store only when none was named)
    and matches names against subject alternative names only."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts nothing until told; verifies and checks names
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.hostname_checks_common_name = False  # as Go: a name in the subject's CN alone is no match
    if ep.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ep.ca_pem:
        try:
            ctx.load_verify_locations(cadata=ep.ca_pem.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            raise ConfigError(f"certificate-authority: {exc.reason or exc}") from None
    else:
        ctx.load_default_certs()  # no CA named at all: the system store, as client-go does (logged at start)
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
    headers: Any = None  # urllib3's case-insensitive headers: Retry-After of a 429 (publisher/kube/calls.py)

    def read(self) -> bytes:
        return self.data


class ApiClient:
    """A bounded pool of keep-alive HTTPS connections to one API server."""

    def __init__(self, endpoint: Endpoint, pool_size: int = 8) -> None:
        url = urllib.parse.urlsplit(endpoint.server)
        self.endpoint = endpoint
        self.prefix = url.path.rstrip("/")
        self._auth = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
        # The name is checked by OpenSSL itself against the SNI name (tls-server-name, else the URL's host),
        # with the context's rules (SANs only); urllib3's own matcher is used only to turn checking off.
        self.pool = urllib3.HTTPSConnectionPool(
            url.hostname or "", url.port or 443, maxsize=pool_size, block=False, retries=False,
            ssl_context=_ssl_context(endpoint), server_hostname=endpoint.tls_server_name or None,
            cert_reqs="CERT_NONE" if endpoint.insecure else "CERT_REQUIRED",
            assert_hostname=False if endpoint.insecure else None)

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


def load(kubeconfig: str | None, pool_size: int = 8, allow_exec: bool = False) -> ApiClient:
    """The client for a kubeconfig (a path, or several joined like KUBECONFIG), else the in-cluster account."""
    return ApiClient(from_kubeconfig(kubeconfig, allow_exec) if kubeconfig else in_cluster(), pool_size)
