"""Resolve an attachment to (claim, allocated device): DESIGN.md "Finding the claim".

pod (from CNI_ARGS) -> the pod's claims (spec.resourceClaims[].resourceClaimName
and status.resourceClaimStatuses[]) -> the claims that are allocated to THIS
node, reserved for THIS pod (UID match) and have results of our driver -> the
device: configured request name, else the driver's opaque config naming the
interface, else the only device not bound to another attachment. Anything
ambiguous is an error, never a guess: a wrong guess would publish one pod's
addresses on another device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from cni_plugin.wire import Event

from .kube import Kube, NotFound


class NotYet(Exception):
    """Not resolvable now, may be later (pod not visible, claim not allocated yet)."""


class Unresolvable(Exception):
    """Will never resolve (pod UID differs, claim allocated to another node, ambiguity).

    `reason` (CamelCase) and the claim, when one is to blame, travel with the
    error so the Warning Event can name them without parsing the message.
    """

    def __init__(self, message: str, reason: str = "Unresolvable", claim_namespace: str = "",
                 claim_name: str = "", claim_uid: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.claim_namespace = claim_namespace
        self.claim_name = claim_name
        self.claim_uid = claim_uid


@dataclass(frozen=True)
class Target:
    """Where an attachment's entry goes."""

    claim_namespace: str
    claim_name: str
    claim_uid: str
    driver: str
    pool: str
    device: str
    share_id: str = ""

    @property
    def claim_key(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"

    @property
    def device_key(self) -> tuple[str, str, str, str]:
        return (self.driver, self.pool, self.device, self.share_id)


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            names.append(ref["resourceClaimName"])
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName"):
            names.append(st["resourceClaimName"])
    return list(dict.fromkeys(names))


def allocated_node(claim: dict[str, Any]) -> str | None:
    """The node of a node-local allocation: exactly one term, matchFields metadata.name In [node]."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    terms = selector.get("nodeSelectorTerms") or []
    if len(terms) != 1 or terms[0].get("matchExpressions"):
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) != 1:
        return None
    req = fields[0]
    if req.get("key") == "metadata.name" and req.get("operator") == "In" and len(req.get("values") or []) == 1:
        return req["values"][0]
    return None


def driver_results(claim: dict[str, Any], driver: str) -> list[dict[str, Any]]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [r for r in results if r.get("driver") == driver]


def _request_matches(result_request: str, wanted: str) -> bool:
    """`nic` matches a result for `nic` and for a subrequest `nic/fast`."""
    return result_request == wanted or result_request.split("/", 1)[0] == wanted


def _config_requests(claim: dict[str, Any], driver: str, ifname: str) -> list[str] | None:
    """Requests named by the driver's opaque config for this interface, if any.

    The config convention: opaque.parameters.interfaceName == ifname, applied
    to `requests` (all of the claim's requests when the list is empty).
    """
    configs = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("config") or []
    for cfg in configs:
        opaque = cfg.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") == driver and isinstance(params, dict) and params.get("interfaceName") == ifname:
            return list(cfg.get("requests") or [])
    return None


def choose_device(
    claim: dict[str, Any], event: Event, bound: Iterable[tuple[str, str, str, str]]
) -> dict[str, Any] | None:
    """The allocation result for this attachment, None if the claim has none of ours.

    Raises Unresolvable when more than one device fits.
    """
    results = driver_results(claim, event.driver)
    if not results:
        return None
    if event.request:
        chosen = [r for r in results if _request_matches(r.get("request", ""), event.request)]
        how = f"request {event.request!r}"
    else:
        wanted = _config_requests(claim, event.driver, event.ifname)
        if wanted is not None:
            chosen = [r for r in results if not wanted or r.get("request", "").split("/", 1)[0] in wanted]
            how = f"opaque config for interface {event.ifname}"
        else:
            taken = set(bound)
            chosen = [
                r for r in results
                if (r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID", "") or "") not in taken
            ]
            how = "the only unbound device"
    if len(chosen) > 1:
        names = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in chosen)
        raise Unresolvable(f"ambiguous device by {how}: {names}", "AmbiguousDevice")
    return chosen[0] if chosen else None


class Resolver:
    """Pod -> claims -> allocated device, on the live API server."""

    def __init__(self, kube: Kube, node_name: str, pods: Any = None) -> None:
        self.kube = kube
        self.node_name = node_name
        self.pods = pods  # a PodCache, or None to always GET

    def _pod(self, namespace: str, name: str, uid: str) -> tuple[str, list[str]]:
        """(uid, claim names) of the pod: from the node's pod watch, else one GET."""
        if self.pods is not None:
            info = self.pods.get(namespace, name)
            if info is not None and info.claims and (not uid or info.uid == uid):
                return info.uid, list(info.claims)
        try:
            pod = self.kube.get_pod(namespace, name)
        except NotFound:
            raise NotYet(f"pod {namespace}/{name} is not visible") from None
        return (pod.get("metadata") or {}).get("uid", ""), pod_claim_names(pod)

    def resolve(self, event: Event, bound_for_claim: Any) -> Target:
        """`bound_for_claim(claim_key)` gives the device keys other attachments hold."""
        if not event.has_pod_identity:
            raise Unresolvable("event has no pod identity (K8S_POD_NAMESPACE/K8S_POD_NAME)")
        pod_ref = event.pod
        uid, names = self._pod(pod_ref.namespace, pod_ref.name, pod_ref.uid)
        if pod_ref.uid and uid != pod_ref.uid:
            raise Unresolvable(f"pod {pod_ref.namespace}/{pod_ref.name} has uid {uid}, the event is for {pod_ref.uid}")
        if not names:
            raise Unresolvable(f"pod {pod_ref.namespace}/{pod_ref.name} references no ResourceClaim")
        found: list[Target] = []
        waiting: list[str] = []
        for name in names:
            target = self._match_claim(pod_ref.namespace, name, uid, event, bound_for_claim, waiting)
            if target is not None:
                found.append(target)
        if len(found) > 1:
            raise Unresolvable("ambiguous: devices in several claims fit: " + ", ".join(t.claim_key for t in found),
                               "AmbiguousDevice")
        if found:
            return found[0]
        if waiting:
            raise NotYet("; ".join(waiting))
        raise Unresolvable(f"no claim of pod {pod_ref.namespace}/{pod_ref.name} has a device of driver {event.driver}")

    def _match_claim(
        self, namespace: str, name: str, pod_uid: str, event: Event, bound_for_claim: Any, waiting: list[str]
    ) -> Target | None:
        try:
            claim = self.kube.get_claim(namespace, name)
        except NotFound:
            waiting.append(f"claim {namespace}/{name} is not visible")
            return None
        status = claim.get("status") or {}
        if not status.get("allocation"):
            waiting.append(f"claim {namespace}/{name} is not allocated")
            return None
        if not driver_results(claim, event.driver):
            return None
        reserved = {r.get("uid") for r in status.get("reservedFor") or [] if r.get("resource") == "pods"}
        if pod_uid not in reserved:
            waiting.append(f"claim {namespace}/{name} is not reserved for the pod")
            return None
        claim_uid = (claim.get("metadata") or {}).get("uid", "")
        node = allocated_node(claim)
        if node != self.node_name:
            raise Unresolvable(f"claim {namespace}/{name} is allocated to node {node!r}, this is {self.node_name!r}",
                               "AllocatedToOtherNode", namespace, name, claim_uid)
        key = f"{namespace}/{name}"
        try:
            result = choose_device(claim, event, bound_for_claim(key))
        except Unresolvable as exc:
            raise Unresolvable(f"claim {key}: {exc}", exc.reason, namespace, name, claim_uid) from None
        if result is None:
            return None
        return Target(
            claim_namespace=namespace,
            claim_name=name,
            claim_uid=claim_uid,
            driver=event.driver,
            pool=result.get("pool", ""),
            device=result.get("device", ""),
            share_id=result.get("shareID", "") or "",
        )
