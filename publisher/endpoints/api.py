"""The endpoints controller's calls: lists and watches of whole collections, slice applies and deletes.

They go through the publisher's client (publisher/kube/calls.py Kube): the same credentials
re-read on rotation, the same token bucket, the same classified errors. Lists are paged so a
relist of 1,000 pods or claims is a few bounded answers, never one huge one.
"""

from __future__ import annotations

import json
from typing import Any

from publisher import limits
from publisher.kube.calls import APPLY_CONTENT_TYPE, Kube, apply_body, watch_seconds

FIELD_MANAGER = "netclaim-endpoints"
SLICES = "/apis/discovery.k8s.io/v1"
LIST_PAGE = 500


class EndpointsKube(Kube):
    """Kube with the generic collection calls the controller needs (the node service needs none of them)."""

    def list_page(self, path: str, query: list[tuple[str, str]], cont: str = "") -> dict[str, Any]:
        """One page of a collection (`path` e.g. /api/v1/pods), LIST_PAGE objects at most."""
        q = [*query, ("limit", str(LIST_PAGE))] + ([("continue", cont)] if cont else [])
        return self._json("list", "GET", path, query=q)

    def watch_collection(self, path: str, query: list[tuple[str, str]], resource_version: str,
                         timeout: int = 0) -> Any:
        """A streaming watch (raw urllib3 response) of a collection from `resource_version`."""
        return self._request(
            "watch", "GET", path,
            query=[*query, ("watch", "true"), ("resourceVersion", resource_version),
                   ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout or watch_seconds()))],
            timeout=(5.0, limits.WATCH_SILENCE), stream=True)

    def apply_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one EndpointSlice, forced: the slices named `<svc>-netclaim-*` are ours alone."""
        meta = body["metadata"]
        data = self._request(
            "apply", "PATCH", f"{SLICES}/namespaces/{meta['namespace']}/endpointslices/{meta['name']}",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")], body=apply_body(body),
            content_type=APPLY_CONTENT_TYPE).read()
        return json.loads(data) if data else {}

    def delete_slice(self, namespace: str, name: str) -> None:
        self._request("delete", "DELETE", f"{SLICES}/namespaces/{namespace}/endpointslices/{name}").read()
