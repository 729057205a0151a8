"""The few Kubernetes API calls the publisher makes, counted and classified.

Responses are read as plain JSON dicts (`_preload_content=False`): the
publisher only needs a handful of fields, and skipping the generated models
saves CPU on every event. Every call is counted by verb and HTTP code, and
every failure is turned into one of two errors the caller can act on:
TransientError (retry with backoff) or PermanentError (report, do not retry).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
REQUEST_TIMEOUT = (5.0, 20.0)
# Events are a courtesy to kubectl users: a slow API must not hold the event
# thread (and its queue) for the 20 s a status apply may take.
EVENT_TIMEOUT = (2.0, 5.0)


class ApiError(Exception):
    """A failed API call: `code` is the HTTP status (0 for no response)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message


class TransientError(ApiError):
    """429, 5xx, or no answer at all: the same request may succeed later."""


class PermanentError(ApiError):
    """403, 422, 409, 400...: repeating the request cannot help."""


class NotFound(PermanentError):
    """404: the object is gone (or not yet created)."""


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


def classify(code: int, message: str) -> ApiError:
    if code == 404:
        return NotFound(code, message)
    if code == 429 or code >= 500 or code == 0:
        return TransientError(code, message)
    return PermanentError(code, message)


def load_client(kubeconfig: str | None, pool_size: int = 8) -> Any:
    """An ApiClient from a kubeconfig file, or the in-cluster service account."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    # Retries are the publisher's own job (with backoff that knows about the
    # journal); urllib3 must not hide an outage behind its own retry loop.
    configuration.retries = 0
    return client.ApiClient(configuration)


@dataclass
class Kube:
    """Raw calls on one ApiClient; `record(verb, code)` is told about each call.

    Requests are built with ApiClient.param_serialize/call_api instead of the
    generated CoreV1Api/ResourceV1Api classes: instantiating those two costs
    ~25 MiB of RSS for code the publisher never uses.
    """

    api_client: Any
    record: Callable[[str, str], None] = lambda verb, code: None

    def _request(self, verb: str, method: str, path: str, query: list[tuple[str, str]] | None = None,
                 body: Any = None, content_type: str = "application/json", timeout: Any = REQUEST_TIMEOUT) -> Any:
        """One request; returns the RESTResponse (body not read) or raises a classified ApiError."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            req = self.api_client.param_serialize(
                method=method, resource_path=path, query_params=query or [], header_params=headers,
                body=body, auth_settings=["BearerToken"])
            resp = self.api_client.call_api(*req, _request_timeout=timeout)
        except ApiException as exc:
            code = int(exc.status or 0)
            self.record(verb, str(code))
            raise classify(code, _api_message(exc.body or exc.reason)) from None
        except Exception as exc:  # urllib3/socket errors: no answer from the server
            self.record(verb, "error")
            raise TransientError(0, f"{type(exc).__name__}: {exc}") from None
        self.record(verb, str(resp.status))
        if resp.status >= 400:
            raise classify(resp.status, _api_message(resp.read()))
        return resp

    def _json(self, verb: str, method: str, path: str, **kw: Any) -> dict[str, Any]:
        data = self._request(verb, method, path, **kw).read()
        return json.loads(data) if data else {}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("get", "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("get", "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")

    def apply_claim_status(
        self, namespace: str, name: str, devices: list[dict[str, Any]], field_manager: str
    ) -> None:
        """Server-side apply of status.devices; force stays off (see docs/publisher.md)."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": devices},
        }
        resp = self._request(
            "apply", "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
            query=[("fieldManager", field_manager), ("force", "false")], body=body,
            content_type=APPLY_CONTENT_TYPE)
        resp.read()  # the answer is the whole claim; nothing in it is needed

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        """POST one events.k8s.io/v1 Event; the answer (the stored Event) is not needed."""
        self._request("event", "POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
                      body=event, timeout=EVENT_TIMEOUT).read()

    def get_daemonset(self, namespace: str, name: str) -> dict[str, Any]:
        """The chain keeper's own DaemonSet: gone or being deleted means uninstall (publisher/chainkeeper.py)."""
        return self._json("get", "GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")

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

    def watch_pods_on_node(self, node: str, resource_version: str, timeout: int = 300) -> Any:
        """A streaming watch (raw urllib3 response) of the pods bound to `node`."""
        resp = self._request(
            "watch", "GET", "/api/v1/pods",
            query=[("fieldSelector", f"spec.nodeName={node}"), ("watch", "true"),
                   ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                   ("timeoutSeconds", str(timeout))],
            timeout=(5.0, timeout + 30))
        return resp.response
