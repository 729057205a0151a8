"""The few Kubernetes API calls the publisher makes, counted and classified.

Responses are read as plain JSON dicts (`_preload_content=False`): the
publisher only needs a handful of fields, and skipping the generated models
saves CPU on every event. Every call is counted by verb and HTTP code, and
every failure is turned into one of two errors the caller can act on:
TransientError (retry with backoff) or PermanentError (report, do not retry).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import random
import re
import ssl
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import urllib3

from publisher import limits, logs
from publisher.clock import node_seconds
from publisher.kube import apiclient
from publisher.kube.apiclient import ApiClient
from publisher.kube.ratelimit import TokenBucket

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
REQUEST_TIMEOUT = (5.0, 20.0)
# Events are a courtesy to kubectl users: a slow API must not hold the event
# thread (and its queue) for the 20 s a status apply may take.
EVENT_TIMEOUT = (2.0, 5.0)
# A request made outside a Kube.purpose() block is counted under the purpose of its verb.
DEFAULT_PURPOSE = {"apply": "apply", "event": "event", "get": "get", "list": "list", "watch": "watch",
                   "lease": "node-lease"}


def watch_seconds() -> int:
    """How long a long-lived watch runs before it is renewed (limits.WATCH_RENEW, jittered)."""
    return random.randint(*limits.WATCH_RENEW)


class ApiError(Exception):
    """A failed API call: `code` is the HTTP status (0 for no response); `retry_after` the seconds
    the server asked to wait before the next try (its Retry-After header on a 429 or 503; 0.0: none).
    Every retry path takes it as a floor for its backoff."""

    def __init__(self, code: int, message: str, retry_after: float = 0.0) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


class TransientError(ApiError):
    """429, 5xx, 401, 403, or no answer at all: the same request may succeed later."""


class PermanentError(ApiError):
    """422, 409, 400...: repeating the request cannot help."""


class NotFound(PermanentError):
    """404: the object is gone (or not yet created)."""


class Forbidden(TransientError):
    """403. Treated as transient: right after an API server (re)start its authorizer answers
    403 until its RBAC caches have synced, and a fixed RBAC must not need a restart here.
    Retried with backoff, shown in `status`; never a reason to drop an event."""


class Unauthorized(TransientError):
    """401: the credentials expired or rotated. Transient: they are re-read and the
    request retried with backoff; no event is dropped because of it."""


class TlsFailed(TransientError):
    """No answer because the TLS handshake failed: the server's certificate is not trusted (or does
    not name it), or it refused ours. After a rotation of the CA or of the client certificate the
    files on disk are read again at once."""


_NOT_RAW = re.compile("[\x7f-\uffff]")  # sent escaped: every BMP character past ASCII


def apply_body(body: dict[str, Any]) -> bytes:
    """JSON that the API server's YAML decoder reads back as the same text (an apply body is YAML).

    The client library's ASCII JSON writes a character beyond U+FFFF as a surrogate-pair
    escape ("\\ud83d\\ude00"), which that decoder refuses (400 "invalid Unicode
    character escape code"): one such character in a prevResult would fail the whole
    claim's apply. So those go as raw UTF-8, and every other non-ASCII character as a
    \\uXXXX escape: raw, some would be read as YAML line breaks (U+0085, U+2028).
    """
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return _NOT_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _api_message(body: Any) -> str:
    """The `message` of a Status object, which is what an operator needs to read."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        status = json.loads(body)
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    except (TypeError, ValueError):
        pass
    return str(body)[:2000]


def classify(code: int, message: str, retry_after: float = 0.0) -> ApiError:
    if code == 404:
        return NotFound(code, message)
    if code == 401:
        return Unauthorized(code, message, retry_after)
    if code == 403:
        return Forbidden(code, message, retry_after)
    if code == 429 or code >= 500 or code == 0:
        return TransientError(code, message, retry_after)
    return PermanentError(code, message)


def retry_after_seconds(value: str | None) -> float:
    """A Retry-After header as seconds from now: delay-seconds (what the API server sends) or an
    HTTP date; 0.0 when absent or unreadable, at most limits.RETRY_AFTER_MAX (a bad header must
    not stall a retry for hours)."""
    if not value:
        return 0.0
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0.0
    return min(max(0.0, seconds), limits.RETRY_AFTER_MAX) if seconds == seconds else 0.0


_RV = re.compile(rb'"resourceVersion":"([^"]*)"')


def resource_version(answer: bytes) -> str:
    """metadata.resourceVersion of an object's JSON, without decoding the whole claim: the API
    server writes metadata first, and no field before it holds that key."""
    match = _RV.search(answer, 0, 4096)
    if match:
        return match.group(1).decode()
    try:
        return str(((json.loads(answer) or {}).get("metadata") or {}).get("resourceVersion", ""))
    except (TypeError, ValueError, AttributeError):
        return ""


def load_client(kubeconfig: str | None, pool_size: int = 8) -> ApiClient:
    """A client for a kubeconfig file (or several, KUBECONFIG-style), or the in-cluster service account."""
    return apiclient.load(kubeconfig, pool_size)


@dataclass
class Credentials:
    """Loads the client, and loads it again when the credentials on disk change.

    Tokens rotate: kubelet rewrites a projected service-account token well
    before it expires (hourly by default), and a systemd install may renew the
    kubeconfig's token (or its `tokenFile`) from cron. Certificates rotate too:
    the cluster's CA bundle (a pod's `ca.crt`, a kubeconfig's
    `certificate-authority`) and a node's client certificate and key. So every
    one of those files (apiclient.credential_files) is checked every
    CREDENTIALS_RELOAD seconds, after every 401 and after every failed TLS
    handshake; a changed fingerprint builds a new ApiClient.
    """

    kubeconfig: str | None
    pool_size: int = 8
    loader: Callable[[str | None, int], Any] = load_client
    fingerprint: str = ""
    checked: float = 0.0
    reloads: int = 0
    last_reload: float = 0.0

    def __post_init__(self) -> None:
        """Created next to the client it guards: what is on disk now is what that client uses."""
        self.fingerprint = self.fingerprint or self.current_fingerprint()
        self.checked = time.monotonic()

    def current_fingerprint(self) -> str:
        digest = hashlib.sha256()
        for path in apiclient.credential_files(self.kubeconfig):
            digest.update(path.encode())
            try:
                with open(path, "rb") as fh:
                    digest.update(fh.read())
            except OSError:
                digest.update(b"-")
        return digest.hexdigest()

    def refreshed(self, force: bool = False, now: bool = False) -> Any | None:
        """A new client when the credentials changed (or `force`), else None.

        Without `now` the files are looked at only every CREDENTIALS_RELOAD seconds."""
        if not force and not now and time.monotonic() - self.checked < limits.CREDENTIALS_RELOAD:
            return None
        self.checked = time.monotonic()
        fp = self.current_fingerprint()
        if fp == self.fingerprint and not force:
            return None
        client = self.loader(self.kubeconfig, self.pool_size)
        self.fingerprint = fp
        self.reloads += 1
        self.last_reload = time.time()
        return client


def tls_failure(exc: BaseException) -> bool:
    """Whether a request without an answer failed in TLS: the server's certificate was not trusted,
    or it refused ours. urllib3 may wrap the ssl error (a ProtocolError whose argument it is, when a
    TLS 1.3 server's refusal of the client certificate arrives with the first read)."""
    seen: list[BaseException] = [exc]
    for current in seen:
        if isinstance(current, (urllib3.exceptions.SSLError, ssl.SSLError)):
            return True
        if len(seen) < 8:
            seen += [e for e in (current.__cause__, current.__context__, *current.args)
                     if isinstance(e, BaseException) and e not in seen]
    return False


def reason_of(code: int, tls: bool = False) -> str:
    """A failed call's short, fixed reason: what /readyz may say (never the server's own words, which
    are the log's: an upstream body is no answer for every prober of the node)."""
    if code == 0:
        return "TLS handshake failed" if tls else "unreachable (no answer)"
    if code == 401:
        return "unauthorized (401)"
    if code == 403:
        return "forbidden (403)"
    if code == 429:
        return "throttled (429)"
    return f"HTTP {code // 100}xx ({code})"


@dataclass
class ApiHealth:
    """What /readyz and `status` need to know about the API connection."""

    failing_since: float = 0.0  # node time of the first call without an answer (or with 5xx) since the last good one
    last_error: str = ""  # the full error: logged and in `status` (root's socket), never in /readyz
    last_reason: str = ""  # reason_of() the last failure: what /readyz says
    unauthorized: int = 0  # consecutive 401s
    unauthorized_total: int = 0
    reloads: int = 0
    last_reload: float = 0.0


@dataclass
class Kube:
    """Raw calls on one ApiClient; `record(verb, code)` is told about each call.

    Requests go through publisher/kube/apiclient.py (urllib3 alone), not the
    kubernetes package: its generated classes cost ~16 MiB of RSS per node for
    code the publisher never uses.
    """

    api_client: Any
    record: Callable[[str, str], None] = lambda verb, code: None
    # Told each request's latency (verb, code, seconds until its answer was read; a watch: until its stream
    # opened): publisher/observe/metrics.py netclaim_api_request_duration_seconds.
    record_duration: Callable[[str, str, float], None] = lambda verb, code, seconds: None
    credentials: Credentials | None = None
    # Told the purpose of every request sent (publisher/observe/metrics.py netclaim_api_requests_by_purpose_total).
    count_purpose: Callable[[str], None] = lambda purpose: None
    # Every request of this process takes a token first (publisher/kube/ratelimit.py; a watch once, when opened).
    limiter: TokenBucket = field(default_factory=lambda: TokenBucket(limits.API_QPS, limits.API_BURST))
    _health: ApiHealth = field(default_factory=ApiHealth)
    _cred_lock: threading.Lock = field(default_factory=threading.Lock)
    _context: threading.local = field(default_factory=threading.local)

    @contextmanager
    def purpose(self, name: str) -> Iterator[None]:
        """Requests made inside are counted under `name` (resolve-watch, resolve-get, verify, ...):
        what each part of the publisher costs the API server is then visible on its own."""
        previous = getattr(self._context, "purpose", None)
        self._context.purpose = name
        try:
            yield
        finally:
            self._context.purpose = previous

    def _count(self, verb: str) -> None:
        self.count_purpose(getattr(self._context, "purpose", None) or DEFAULT_PURPOSE.get(verb, verb))

    def health(self) -> ApiHealth:
        h = self._health
        if self.credentials is not None:
            h.reloads, h.last_reload = self.credentials.reloads, self.credentials.last_reload
        return h

    def _note(self, code: int, message: str = "", tls: bool = False) -> None:
        """Track the answer for health: no answer/5xx/401 count as failing, anything else as up.

        The start and the end of an outage are logged once each, the first with the full error."""
        h = self._health
        if code == 401:
            h.unauthorized += 1
            h.unauthorized_total += 1
        elif code:
            h.unauthorized = 0
        if code == 0 or code >= 500:
            if not h.failing_since:
                logs.get().warning("API requests failing", extra={"reason": reason_of(code, tls), "error": message})
            h.failing_since = h.failing_since or node_seconds()  # a wall-clock step must not end or age an outage
            h.last_error, h.last_reason = message, reason_of(code, tls)
        elif code != 401:
            if h.failing_since:
                logs.get().info("API requests answered again", extra={"code": code})
            h.failing_since = 0.0

    def _refresh_credentials(self, force: bool = False, now: bool = False) -> bool:
        """Swap in a client built from the current credentials; True when one was built."""
        if self.credentials is None:
            return False
        with self._cred_lock:
            try:
                fresh = self.credentials.refreshed(force, now)
            except Exception as exc:  # noqa: BLE001 - a half-written kubeconfig: keep the old client, try again later
                message = f"credentials reload failed: {exc}"  # ConfigError names files, never a token
                if message != self._health.last_error:
                    logs.get().warning("credentials on disk unusable, keeping the current ones",
                                       extra={"error": str(exc)})
                self._health.last_error = message
                return False
            if fresh is None:
                return False
            self.api_client = fresh
            logs.get().info("credentials reloaded", extra={"reloads": self.credentials.reloads})
            return True

    def _request(self, verb: str, method: str, path: str, query: list[tuple[str, str]] | None = None,
                 body: Any = None, content_type: str = "application/json", timeout: Any = REQUEST_TIMEOUT,
                 stream: bool = False) -> Any:
        """One request; returns the Reply (or with `stream` the open response) or raises a classified ApiError.

        A 401 re-reads the credentials and, if they changed, tries once more at
        once; otherwise it is raised as Unauthorized (transient: the caller backs off).
        """
        self._refresh_credentials()
        try:
            return self._request_once(verb, method, path, query, body, content_type, timeout, stream)
        except Unauthorized:
            if not self._refresh_credentials(force=True):
                raise
        except Forbidden:  # maybe a token of another identity, already rotated on disk
            if not self._refresh_credentials(now=True):
                raise
        except TlsFailed:  # maybe a rotated CA or client certificate, already on disk
            if not self._refresh_credentials(now=True):
                raise
        return self._request_once(verb, method, path, query, body, content_type, timeout, stream)

    def _request_once(self, verb: str, method: str, path: str, query: list[tuple[str, str]] | None,
                      body: Any, content_type: str, timeout: Any, stream: bool = False) -> Any:
        self.limiter.take()  # outside every lock: a request waiting for a token blocks no other
        self._count(verb)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        sent = time.monotonic()
        try:
            resp = self.api_client.request(method, path, query, headers, body, timeout, stream=stream)
        except Exception as exc:  # noqa: BLE001 - urllib3/ssl/socket errors: no answer from the server
            self.record(verb, "error")
            self.record_duration(verb, "error", time.monotonic() - sent)
            tls = tls_failure(exc)
            self._note(0, f"{type(exc).__name__}: {exc}", tls)
            raise (TlsFailed if tls else TransientError)(0, f"{type(exc).__name__}: {exc}") from None
        self.record(verb, str(resp.status))
        self.record_duration(verb, str(resp.status), time.monotonic() - sent)
        if resp.status >= 400:
            message = _api_message(resp.read())
            if stream:
                resp.release_conn()
            self._note(resp.status, message)
            wait = retry_after_seconds((getattr(resp, "headers", None) or {}).get("Retry-After"))
            raise classify(resp.status, message, wait)
        self._note(resp.status)
        return resp

    def _json(self, verb: str, method: str, path: str, **kw: Any) -> dict[str, Any]:
        data = self._request(verb, method, path, **kw).read()
        return json.loads(data) if data else {}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("get", "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("get", "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")

    def watch_claim(self, namespace: str, name: str, timeout: int) -> Any:
        """A watch of one claim by name that starts with the claim itself (raw urllib3 response).

        With sendInitialEvents the server first sends the claim as it is now (ADDED, none
        when it does not exist), then a BOOKMARK annotated k8s.io/initial-events-end: one
        request both reads the claim, like a GET, and keeps following it
        (publisher/repair/claimwatch.py). RBAC authorizes it as a watch of that one name.
        """
        resp = self._request(
            "watch", "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
            query=[("fieldSelector", f"metadata.name={name}"), ("watch", "true"), ("sendInitialEvents", "true"),
                   ("resourceVersionMatch", "NotOlderThan"), ("allowWatchBookmarks", "true"),
                   ("timeoutSeconds", str(timeout))],
            timeout=(5.0, timeout + 30), stream=True)
        return resp

    def apply_claim_status(
        self, namespace: str, name: str, devices: list[dict[str, Any]], field_manager: str
    ) -> str:
        """Server-side apply of status.devices; force stays off (see docs/publisher.md).

        Returns the resourceVersion of the answer: an open claim watch tells its own apply's
        event from a later change by it (publisher/repair/claimwatch.py)."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": devices},
        }
        resp = self._request(
            "apply", "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
            query=[("fieldManager", field_manager), ("force", "false")], body=apply_body(body),
            content_type=APPLY_CONTENT_TYPE)
        return resource_version(resp.read())

    def list_resource_slices(self, node: str, driver: str) -> dict[str, Any]:
        """This node's ResourceSlices of `driver`: read only for a request with several devices or a device ID."""
        query = [("fieldSelector", f"spec.nodeName={node},spec.driver={driver}")]
        return self._json("list", "GET", "/apis/resource.k8s.io/v1/resourceslices", query=query)

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        """POST one events.k8s.io/v1 Event; the answer (the stored Event) is not needed."""
        self._request("event", "POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
                      body=event, timeout=EVENT_TIMEOUT).read()

    def get_daemonset(self, namespace: str, name: str) -> dict[str, Any]:
        """The chain keeper's own DaemonSet: gone or being deleted means uninstall (publisher/keeper/keeper.py).

        Short timeouts: it is asked within the pod's termination grace period.
        """
        return self._json("get", "GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}",
                          timeout=EVENT_TIMEOUT)

    def list_daemonset(self, namespace: str, name: str) -> dict[str, Any]:
        """The keeper's own DaemonSet as a list of at most one (publisher/keeper/ownerwatch.py).

        The name goes in the field selector: that is how RBAC's resourceNames covers
        a list or a watch. An empty list is as positive as a 404.
        """
        return self._json("list", "GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
                          query=[("fieldSelector", f"metadata.name={name}")], timeout=EVENT_TIMEOUT)

    def watch_daemonset(self, namespace: str, name: str, resource_version: str, timeout: int = 0) -> Any:
        """A streaming watch (raw urllib3 response) of the keeper's own DaemonSet, by name."""
        resp = self._request(
            "watch", "GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
            query=[("fieldSelector", f"metadata.name={name}"), ("watch", "true"),
                   ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                   ("timeoutSeconds", str(timeout or watch_seconds()))],
            timeout=(5.0, limits.WATCH_SILENCE), stream=True)
        return resp

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch one events.k8s.io/v1 Event (its series: repeats of the same warning)."""
        self._request("event", "PATCH", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}",
                      body=patch, content_type="application/merge-patch+json", timeout=EVENT_TIMEOUT).read()

    def list_pods_on_node(self, node: str, limit: int = 200, cont: str = "") -> dict[str, Any]:
        """One page of the pods bound to `node` (pages keep the memory peak of a relist small)."""
        query = [("fieldSelector", f"spec.nodeName={node}"), ("limit", str(limit))]
        if cont:
            query.append(("continue", cont))
        return self._json("list", "GET", "/api/v1/pods", query=query)

    def watch_pods_on_node(self, node: str, resource_version: str, timeout: int = 0) -> Any:
        """A streaming watch (raw urllib3 response) of the pods bound to `node`."""
        resp = self._request(
            "watch", "GET", "/api/v1/pods",
            query=[("fieldSelector", f"spec.nodeName={node}"), ("watch", "true"),
                   ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                   ("timeoutSeconds", str(timeout or watch_seconds()))],
            timeout=(5.0, limits.WATCH_SILENCE), stream=True)
        return resp

    # The node's heartbeat (publisher/observe/nodelease.py): one Lease per node in the release namespace,
    # read by `netclaim-publisher fleet`. Created once, then replaced with the resourceVersion of the last
    # answer (a PUT), so a write never undoes someone else's: a conflict re-reads it first.

    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("lease", "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
                          timeout=EVENT_TIMEOUT)

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        return self._json("lease", "POST", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
                          body=lease, timeout=EVENT_TIMEOUT)

    def update_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        """PUT the whole Lease; its metadata.resourceVersion makes a stale copy a 409, never an overwrite."""
        return self._json("lease", "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
                          body=lease, timeout=EVENT_TIMEOUT)
