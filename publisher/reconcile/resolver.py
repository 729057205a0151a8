"""Resolve an attachment to (claim, allocated device): docs/design.md "Finding the claim and device".

pod (from CNI_ARGS) -> the pod's claims (spec.resourceClaims[].resourceClaimName,
status.resourceClaimStatuses[] and the DRA extended-resource claim in
status.extendedResourceClaimStatus) -> the claims that are allocated to THIS
node, reserved for THIS pod (its UID, or its PodGroup: publisher/reconcile/reservation.py)
and have results of our driver -> the
device (choose_device, docs/publisher.md "Finding the claim and the device").
A claim allocated to another node is skipped with a reason, never hiding a
matching claim later in the pod's list. Anything still ambiguous is an error,
never a guess: a wrong guess would publish one pod's addresses on another device.

netclaim runs for every pod of its network, and most pods have no claim at
all. Such a pod is not a failure: NotOurs tells it apart (no request for a pod
without spec.resourceClaims, found in the node's pod watch), and the rules
finish its events quietly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from cni_plugin.wire.event import Event, legacy_order, new_order
from publisher import limits
from publisher.kube.calls import Kube, NotFound
from publisher.reconcile.reservation import admits, pod_group_name
from publisher.reconcile.slices import DeviceFacts, SliceFacts, SlicesUnsettled


class NotYet(Exception):
    """Not resolvable now, may be later (pod not visible, claim not allocated yet)."""


class NotOurs(Exception):
    """The pod has no claim that can be this driver's: nothing to publish, and never will be.

    Not a failure: most pods on a node have no network claim. Raised when the
    pod declares no claim, or when each of its claims is allocated without a
    result of the driver (reason `no_claim`), or, for an attachment whose entry
    names a request, when none of its claims has a device of that request
    (reason `no_request`): containerd's own multi-network attaches every pod to
    every network (eth0, eth1, ...), so a pod that claimed a device only for
    eth0 still gets an eth1, and that interface is simply not a claimed device.
    """

    def __init__(self, message: str, reason: str = "no_claim") -> None:
        super().__init__(message)
        self.reason = reason


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
    claim: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # as read to resolve
    # The UID of the pod resolved (the event may carry none): a claim reserved for the pod's
    # PodGroup does not name it.
    pod_uid: str = field(default="", compare=False)

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
    status = pod.get("status") or {}
    for st in status.get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName"):
            names.append(st["resourceClaimName"])
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):  # DRA extended resources: the scheduler's special claim
        names.append(extended["resourceClaimName"])
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class PodInfo:
    """What resolving needs of a pod: its UID, its claims and its PodGroup."""

    uid: str
    claims: tuple[str, ...]
    # spec.resourceClaims or status.extendedResourceClaimStatus is set. Without
    # either the pod can never have a claim: spec.resourceClaims is immutable and
    # the scheduler writes the extended-resource claim before it binds the pod,
    # i.e. before this node's watch ever shows it.
    declares_claims: bool = True
    # Every spec.resourceClaims entry has its claim name (by name, or a status
    # entry for a template). Else `claims` may still grow: read the pod again.
    names_complete: bool = True
    # spec.schedulingGroup.podGroupName ('' for none, immutable): a claim reserved for
    # that PodGroup is the pod's to use (publisher/reconcile/reservation.py).
    pod_group: str = ""
    # The claim the scheduler made for the pod's DRA extended resources and its requestMappings as
    # (resourceName, requestName) pairs: the scheduler names those requests itself
    # (container-<i>-request-<j>), so only the resource name can tie one to an interface.
    extended_claim: str = ""
    extended: tuple[tuple[str, str], ...] = ()

    def extended_requests(self, claim_name: str, resource: str) -> frozenset[str] | None:
        """The requests of `claim_name` that back `resource`: None when that claim is not the pod's
        extended-resource claim or no resource is named (the ordinary rules apply to it)."""
        if not resource or not claim_name or claim_name != self.extended_claim:
            return None
        return frozenset(request for name, request in self.extended if name == resource)

    @property
    def claimless(self) -> bool:
        """The pod has no claim and never will: none declared, or all its template claims said none."""
        return not self.declares_claims or (self.names_complete and not self.claims)


def pod_info(pod: dict[str, Any]) -> PodInfo:
    spec_refs = (pod.get("spec") or {}).get("resourceClaims") or []
    status = pod.get("status") or {}
    made = status.get("extendedResourceClaimStatus") or {}
    extended = made.get("resourceClaimName") or ""
    generated = {st.get("name") for st in status.get("resourceClaimStatuses") or []}
    complete = all(ref.get("resourceClaimName") or ref.get("name") in generated for ref in spec_refs)
    mappings = tuple((str(m.get("resourceName") or ""), str(m.get("requestName") or ""))
                     for m in made.get("requestMappings") or [] if isinstance(m, dict))
    return PodInfo((pod.get("metadata") or {}).get("uid", ""), tuple(pod_claim_names(pod)),
                   declares_claims=bool(spec_refs or extended), names_complete=complete,
                   pod_group=pod_group_name(pod), extended_claim=extended, extended=mappings)


def _claim_names(info: PodInfo, pod: str) -> bool:
    """True when `info` names all the pod's claims; NotOurs when it has none and never will."""
    if info.claimless:
        raise NotOurs(f"pod {pod} has no ResourceClaim")
    return bool(info.claims) and info.names_complete


def watch_wait(event: Event) -> float:
    """How long the pod watch may still need to show the event's pod: what is left of
    POD_WATCH_GRACE since the plugin stamped the event (nothing for a replayed old event)."""
    now = new_order()
    order = event.order or legacy_order(event.timestamp)
    if order[0] and order[0] == now[0]:  # same boot: CLOCK_BOOTTIME, immune to wall-clock steps
        age = (now[1] - order[1]) / 1e9
    else:
        age = (now[2] - order[2]) / 1e9
    return min(limits.POD_WATCH_GRACE, max(0.0, limits.POD_WATCH_GRACE - age))


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


def _parent_request(result: dict[str, Any]) -> str:
    """The claim request a result is for: `nic` for `nic` and for its subrequest `nic/fast`."""
    return str(result.get("request", "")).split("/", 1)[0]


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


def device_key(result: dict[str, Any]) -> tuple[str, str, str, str]:
    return (result.get("driver", ""), result.get("pool", ""), result.get("device", ""), result.get("shareID", "") or "")


def _candidates(claim: dict[str, Any], event: Event,
                extended: frozenset[str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """The results this attachment may use. In the claim the scheduler made for the pod's
    extended resources, when the entry names one: the requests the pod's requestMappings give
    that resource (`extended`). Else by configured request (a subrequest `nic/fast` matches
    `nic`), else by the driver's opaque config naming the interface, else all of the
    driver's results."""
    results = driver_results(claim, event.driver)
    if extended is not None:
        return [r for r in results if _parent_request(r) in extended], \
            f"extended resource {event.extended_resource!r}"
    if event.request:
        return [r for r in results if _request_matches(r.get("request", ""), event.request)], \
            f"request {event.request!r}"
    wanted = _config_requests(claim, event.driver, event.ifname)
    if wanted is not None:
        return [r for r in results if not wanted or _parent_request(r) in wanted], \
            f"opaque config for interface {event.ifname}"
    return results, "driver"


def _key(result: dict[str, Any]) -> tuple[str, str]:
    return (result.get("pool", ""), result.get("device", ""))


def _by_device_id(chosen: list[dict[str, Any]], event: Event, how: str,
                  facts: dict[tuple[str, str], DeviceFacts]) -> list[dict[str, Any]]:
    """The candidates left once the event's device ID is known: the one device carrying it.

    A candidate that publishes another ID is never this interface's; candidates that publish
    none are left to the other rules (a driver that names no IDs). Raises Unresolvable when
    every candidate publishes an ID and none is this one, or several are.
    """
    ids = {_key(r): facts[_key(r)].device_id for r in chosen if _key(r) in facts and facts[_key(r)].device_id}
    matched = [r for r in chosen if ids.get(_key(r)) == event.device_id]
    if len(matched) > 1:
        listed = ", ".join(f"{p}/{d}" for p, d in map(_key, matched))
        raise Unresolvable(f"several devices by {how} carry device ID {event.device_id}: {listed}", "AmbiguousDevice")
    if matched:
        return matched
    unnamed = [r for r in chosen if _key(r) not in ids]
    if not unnamed:
        listed = ", ".join(f"{p}/{d}={ids[(p, d)]}" for p, d in map(_key, chosen))
        raise Unresolvable(f"interface {event.ifname} is on device ID {event.device_id}, which no device allocated "
                           f"by {how} carries ({listed})", "DeviceIDNotAllocated")
    return unnamed


def choose_device(
    claim: dict[str, Any], event: Event, bound: Iterable[tuple[str, str, str, str]],
    slice_facts: Callable[[list[tuple[str, str]]], dict[tuple[str, str], DeviceFacts]] | None = None,
    extended: frozenset[str] | None = None,
) -> dict[str, Any] | None:
    """The allocation result for this attachment, None if the claim has none of ours.

    Deterministic, in this order: the candidates (the extended resource's requests `extended`,
    request / opaque config, _candidates); when
    the event carries a device ID, the one carrying it in the slices (_by_device_id); the only
    candidate left; among several, the one whose ResourceSlice attribute `interfaceName` names
    this interface; else the only one no other attachment holds. The slices
    (`slice_facts(candidate keys)`) are only asked for a device ID or among several candidates.
    A single candidate held by another pod's attachment is a shared device: it is chosen
    (docs/publisher.md "Shared devices"). Raises Unresolvable (AmbiguousDevice,
    DeviceIDNotAllocated) rather than guess; the slices raise SlicesUnsettled while the driver
    republishes a candidate's pool (its devices are unknown until then).
    """
    chosen, how = _candidates(claim, event, extended)
    read = (lambda: slice_facts([_key(r) for r in chosen])) if slice_facts else dict
    facts: dict[tuple[str, str], DeviceFacts] | None = None
    if event.device_id and chosen:
        facts = read()
        chosen = _by_device_id(chosen, event, how, facts)
    if len(chosen) <= 1:
        return chosen[0] if chosen else None
    facts = read() if facts is None else facts
    named = [r for r in chosen if (facts.get(_key(r)) or DeviceFacts()).interface == event.ifname]
    if len(named) == 1:
        return named[0]
    taken = set(bound)
    free = [r for r in chosen if device_key(r) not in taken]
    if len(free) == 1:
        return free[0]
    listed = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in (free or chosen))
    raise Unresolvable(f"ambiguous device by {how}: {listed}", "AmbiguousDevice")


def _extended_hint(pod: PodInfo, event: Event) -> str:
    """What to set when the pod's only way to this driver's device is an extended resource
    the entry does not name: the scheduler's claim never has the entry's request."""
    resources = sorted({name for name, _ in pod.extended if name})
    if not pod.extended_claim or not resources or event.extended_resource in resources:
        return ""
    return (f"; its claim {pod.extended_claim} was made by the scheduler for extended resource(s) "
            f"{', '.join(resources)}: name the one this interface stands for in the entry's "
            f"extendedResourceName")


class Resolver:
    """Pod -> claims -> allocated device, on the live API server."""

    def __init__(self, kube: Kube, node_name: str, pods: Any = None, claims: Any = None,
                 slices: SliceFacts | None = None) -> None:
        self.kube = kube
        self.node_name = node_name
        self.slices = slices or SliceFacts(kube, node_name)
        self.pods = pods  # a PodCache, or None to always GET
        self.claims = claims  # publisher/repair/claimwatch.py ClaimWindows (a watch that stays open), or None to GET

    def _pod(self, event: Event) -> PodInfo:
        """What resolving needs of the event's pod, with all its claim names: from the node's
        pod watch, else one GET.

        A pod the watch does not show yet is waited for while the event is
        younger than POD_WATCH_GRACE (the watch wakes the wait). Raises NotOurs
        for a pod that declares no claim: from the watch that costs no request.
        """
        ref = event.pod
        if ref is None:
            raise Unresolvable("event has no pod identity (K8S_POD_NAMESPACE/K8S_POD_NAME)")
        namespace, name, uid = ref.namespace, ref.name, ref.uid
        if self.pods is not None:
            gone = self.pods.gone(namespace, name, uid) if uid else None  # that very pod is gone: no wait
            info = None if gone else self.pods.wait_for(namespace, name, uid, watch_wait(event))
            if info is None:  # a pod the watch saw deleted only answers "no claim": never resolve a gone pod
                gone = gone or self.pods.gone(namespace, name, uid)
                if gone is not None and gone.claimless:
                    raise NotOurs(f"pod {namespace}/{name} had no ResourceClaim (deleted)")
                if gone is not None and uid and gone.uid == uid:
                    # That very pod was deleted before its ADD was handled (a backlog): its
                    # entry would be dropped at once, and a GET per retry would only end in a
                    # Warning about a pod that no longer exists.
                    raise NotOurs(f"pod {namespace}/{name} was deleted before its ADD was handled",
                                  reason="pod_deleted")
            elif _claim_names(info, f"{namespace}/{name}"):
                return info
        try:
            pod = self.kube.get_pod(namespace, name)
        except NotFound:
            raise NotYet(f"pod {namespace}/{name} is not visible") from None
        if self.pods is not None:
            self.pods.remember(pod)
        info = pod_info(pod)
        if uid and info.uid != uid:
            return info  # another pod of that name: resolve() says so
        if not _claim_names(info, f"{namespace}/{name}"):
            raise NotYet(f"pod {namespace}/{name}: the names of its claims are not known yet")
        return info

    def never_ours(self, event: Event) -> bool:
        """Whether the node's pod watch already knows this pod can never have a claim of ours
        (it declares none, or it is gone and declared none). Costs no request and never waits:
        a DEL asks this to know that no late ADD of the pod could ever publish."""
        ref = event.pod
        if self.pods is None or ref is None or not event.has_pod_identity:
            return False
        ns, name, uid = ref.namespace, ref.name, ref.uid
        info = self.pods.wait_for(ns, name, uid, 0) or self.pods.gone(ns, name, uid)
        return info is not None and info.claimless

    def resolve(self, event: Event, bound_for_claim: Any, known: dict[str, dict[str, Any]] | None = None) -> Target:
        """`bound_for_claim(claim_key)` gives the device keys other attachments hold; `known` are
        claim copies the caller knows to be current (by "namespace/name"): not read again."""
        pod_ref = event.pod
        if pod_ref is None or not event.has_pod_identity:
            raise Unresolvable("event has no pod identity (K8S_POD_NAMESPACE/K8S_POD_NAME)")
        pod = self._pod(event)
        if pod_ref.uid and pod.uid != pod_ref.uid:
            raise Unresolvable(f"pod {pod_ref.namespace}/{pod_ref.name} has uid {pod.uid}, "
                               f"the event is for {pod_ref.uid}")
        found: list[Target] = []
        waiting: list[str] = []
        skipped: list[Unresolvable] = []
        ours: list[str] = []  # claims with results of the driver
        for name in pod.claims:
            try:
                target = self._match_claim(pod_ref.namespace, name, pod, event, bound_for_claim, waiting,
                                           ours, (known or {}).get(f"{pod_ref.namespace}/{name}"))
            except Unresolvable as exc:
                if exc.reason != "AllocatedToOtherNode":
                    raise
                skipped.append(exc)  # not node-local: skip it, a later claim may be ours
                continue
            if target is not None:
                found.append(target)
        if len(found) > 1:
            raise Unresolvable("ambiguous: devices in several claims fit: " + ", ".join(t.claim_key for t in found),
                               "AmbiguousDevice")
        if found:
            return found[0]
        if waiting:
            raise NotYet("; ".join(waiting + [str(e) for e in skipped]))
        if skipped:
            raise skipped[0]
        if not ours:  # every claim read and allocated, none with a result of the driver
            raise NotOurs(f"no claim of pod {pod_ref.namespace}/{pod_ref.name} is allocated with a device of "
                          f"driver {event.driver}")
        if event.request or (event.extended_resource and pod.extended_claim):
            # The pod claimed devices of the driver, none for this interface's request or resource.
            wanted = " or ".join(filter(None, [f"request {event.request!r}" if event.request else "",
                                               f"extended resource {event.extended_resource!r}"
                                               if event.extended_resource else ""]))
            raise NotOurs(f"no claim of pod {pod_ref.namespace}/{pod_ref.name} has a device of driver "
                          f"{event.driver} for {wanted} (interface {event.ifname})"
                          + _extended_hint(pod, event), "no_request")
        raise Unresolvable(f"no claim of pod {pod_ref.namespace}/{pod_ref.name} has a device of driver {event.driver}")

    def _match_claim(
        self, namespace: str, name: str, pod: PodInfo, event: Event, bound_for_claim: Any,
        waiting: list[str], ours: list[str], known: dict[str, Any] | None = None,
    ) -> Target | None:
        if known is not None:
            return self._target(namespace, name, known, pod, event, bound_for_claim, waiting, ours)
        try:
            if self.claims is not None:
                claim = self.claims.read(namespace, name)
            else:
                with self.kube.purpose("resolve-get"):
                    claim = self.kube.get_claim(namespace, name)
        except NotFound:
            waiting.append(f"claim {namespace}/{name} is not visible")
            return None
        target = self._target(namespace, name, claim, pod, event, bound_for_claim, waiting, ours)
        if target is None and self.claims is not None:
            self.claims.unused(namespace, name)
        return target

    def _target(self, namespace: str, name: str, claim: dict[str, Any], pod: PodInfo, event: Event,
                bound_for_claim: Any, waiting: list[str], ours: list[str]) -> Target | None:
        status = claim.get("status") or {}
        if not status.get("allocation"):
            waiting.append(f"claim {namespace}/{name} is not allocated")
            return None
        if not driver_results(claim, event.driver):
            return None
        ours.append(name)
        if not admits(claim, namespace, pod.uid, pod.pod_group):
            waiting.append(f"claim {namespace}/{name} is not reserved for the pod"
                           + (f" nor its PodGroup {pod.pod_group}" if pod.pod_group else ""))
            return None
        claim_uid = (claim.get("metadata") or {}).get("uid", "")
        node = allocated_node(claim)
        if node != self.node_name:
            raise Unresolvable(f"claim {namespace}/{name} is allocated to node {node!r}, this is {self.node_name!r}",
                               "AllocatedToOtherNode", namespace, name, claim_uid)
        key = f"{namespace}/{name}"
        try:
            result = choose_device(claim, event, bound_for_claim(key),
                                   lambda keys: self.slices.facts(event.driver, keys),
                                   pod.extended_requests(name, event.extended_resource))
        except Unresolvable as exc:
            raise Unresolvable(f"claim {key}: {exc}", exc.reason, namespace, name, claim_uid) from None
        except SlicesUnsettled as exc:  # the driver is republishing the pool: wait for it, never guess
            raise NotYet(f"claim {key}: {exc}") from None
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
            claim=claim,
            pod_uid=pod.uid,
        )
