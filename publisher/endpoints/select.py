"""Which pods a Service on a secondary network selects, and which of their addresses it serves.

A Service names its network with annotations, because Kubernetes has no field for it (KEP-4817's
first user story: a Service whose endpoints are the pods' addresses on a secondary network):

- `netclaim.dev/endpoints-selector`: the pods, as an equality label selector (`app=web,tier=db`;
  `key` alone: the label is set). The Service itself has no `spec.selector`, or
  kube-controller-manager would make slices of the pods' primary addresses beside ours.
- `netclaim.dev/endpoints-driver`: the DRA driver whose `status.devices` entries carry the addresses.
- `netclaim.dev/endpoints-request`: the claim request whose device is the network (a sub-request
  `req/sub` matches `req` too). Driver and request are the key because both are in the claim's
  allocation, which the scheduler wrote and no pod can forge; an interface name is the pod's to choose.
- `netclaim.dev/endpoints-family`: `IPv4`, `IPv6` or `IPv4,IPv6`; without it the Service's own
  `spec.ipFamilies`.

Only an entry of a claim reserved for the pod counts (its `reservedFor` names the pod's UID, or
the pod's PodGroup: publisher/reconcile/reservation.py, the rule every part of netclaim uses): a
claim of the same name left from a deleted pod never lends its addresses to the new one. A claim
that several running pods use (a shared claim, a PodGroup's) has one entry per device, showing the
attachment of the latest of them. When the node's publisher runs with --shared-attachments, the
entry's `data.attachments` (netclaim.dev/v1 CNIResult) lists each pod's own addresses, and each pod
gets its own; without that list nothing says which pod the entry's addresses are, and they go to
none of the pods rather than to all (one address on several pods' endpoints, most of them wrong).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

from publisher.reconcile.mapper import DATA_API_VERSION, DATA_KIND
from publisher.reconcile.reservation import admits, pod_group_name

PREFIX = "netclaim.dev/endpoints-"
SELECTOR = PREFIX + "selector"
DRIVER = PREFIX + "driver"
REQUEST = PREFIX + "request"
FAMILY = PREFIX + "family"
FAMILIES = ("IPv4", "IPv6")


class NotSelectable(ValueError):
    """The Service's annotations cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Selection:
    """What one annotated Service asks for."""

    labels: tuple[tuple[str, str | None], ...]  # (key, value); None: the key only has to exist
    driver: str
    request: str
    families: tuple[str, ...]

    def selects(self, pod: dict[str, Any]) -> bool:
        have = (pod.get("metadata") or {}).get("labels") or {}
        return all(k in have and (v is None or have[k] == v) for k, v in self.labels)


def wants_endpoints(service: dict[str, Any]) -> bool:
    """Whether the Service asks this controller for endpoints at all (any of its annotations)."""
    annotations = (service.get("metadata") or {}).get("annotations") or {}
    return any(k.startswith(PREFIX) for k in annotations)


def parse_selector(text: str) -> tuple[tuple[str, str | None], ...]:
    """`a=b,c==d,e` -> ((a, b), (c, d), (e, None)); an empty selector would select every pod: refused."""
    terms: list[tuple[str, str | None]] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term or any(word in term for word in (" in ", " notin ", "(")):
            raise NotSelectable(f"{SELECTOR}: {term!r}: only key=value and key terms are supported")
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        key, value = key.strip(), value.strip()
        if not key:
            raise NotSelectable(f"{SELECTOR}: {term!r} has no key")
        terms.append((key, value if sep else None))
    if not terms:
        raise NotSelectable(f"{SELECTOR} is empty: it would select every pod of the namespace")
    return tuple(terms)


def selection_of(service: dict[str, Any]) -> Selection:
    """The Service's Selection, or NotSelectable naming the annotation at fault."""
    meta = service.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = service.get("spec") or {}
    if spec.get("selector"):
        raise NotSelectable("the Service has spec.selector: kube-controller-manager serves it; remove the "
                            f"selector and use {SELECTOR}")
    missing = [a for a in (SELECTOR, DRIVER, REQUEST) if not str(annotations.get(a) or "").strip()]
    if missing:
        raise NotSelectable(f"missing annotation {', '.join(missing)}")
    family_text = str(annotations.get(FAMILY) or "").strip()
    families = [f.strip() for f in family_text.split(",") if f.strip()] if family_text else \
        list(spec.get("ipFamilies") or ["IPv4"])
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise NotSelectable(f"{FAMILY}: {family_text!r}: IPv4, IPv6 or IPv4,IPv6")
    return Selection(labels=parse_selector(str(annotations[SELECTOR])), driver=str(annotations[DRIVER]).strip(),
                     request=str(annotations[REQUEST]).strip(),
                     families=tuple(f for f in FAMILIES if f in families))


def claim_names(pod: dict[str, Any]) -> list[str]:
    """The pod's claims: named ones from its spec, generated ones from its status (kubernetes #140036)."""
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    names = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if name:
            names.append(name)
    return names


def _request_matches(result_request: str, wanted: str) -> bool:
    return result_request == wanted or result_request.startswith(wanted + "/")


def _reserved_for(claim: dict[str, Any], pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return admits(claim, meta.get("namespace", ""), meta.get("uid", ""), lambda: pod_group_name(pod))


def running(pod: dict[str, Any]) -> bool:
    """A pod whose claims are in use: not Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def shared_claims(pods: Iterable[dict[str, Any]], claims: dict[str, dict[str, Any]]) -> set[str]:
    """The claims (by name, one namespace) that more than one running pod uses and may use."""
    users: Counter[str] = Counter()
    for pod in pods:
        if running(pod):
            users.update({n for n in claim_names(pod) if n in claims and _reserved_for(claims[n], pod)})
    return {name for name, count in users.items() if count > 1}


def servable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether an EndpointSlice may carry the address: the API server refuses a slice with an unspecified,
    loopback, link-local or multicast one (and the whole slice, every pod's endpoint in it, with it)."""
    return not (ip.is_unspecified or ip.is_loopback or ip.is_link_local or ip.is_multicast
                or (isinstance(ip, ipaddress.IPv6Address) and (ip.scope_id or ip.ipv4_mapped)))


def _shared_ips(entry: dict[str, Any], pod_uid: str) -> list[str]:
    """The pod's own addresses on a shared device, from the entry's data.attachments ([] when not listed)."""
    data = entry.get("data") or {}
    if not isinstance(data, dict) or data.get("apiVersion") != DATA_API_VERSION or data.get("kind") != DATA_KIND:
        return []
    for item in data.get("attachments") or []:
        if isinstance(item, dict) and pod_uid and item.get("podUID") == pod_uid:
            return [ip for ip in item.get("ips") or [] if isinstance(ip, str)]
    return []


@dataclass(frozen=True)
class Address:
    """One address the pod serves on the network: its entry's readiness and the IP without its prefix."""

    ip: str
    family: str
    ready: bool


def addresses(pod: dict[str, Any], claims: dict[str, dict[str, Any]], sel: Selection,
              shared: frozenset[str] | set[str] = frozenset()) -> list[Address]:
    """The pod's addresses on the Service's network, from the entries of its claims (`claims` by name,
    the pod's namespace; of a claim in `shared`, only the entry's data.attachments item of this pod), in
    the order the entries list them, each IP once."""
    uid = (pod.get("metadata") or {}).get("uid", "")
    found: list[Address] = []
    seen: set[str] = set()
    for name in claim_names(pod):
        claim = claims.get(name)
        if claim is None or not _reserved_for(claim, pod):
            continue
        status = claim.get("status") or {}
        devices = {(r.get("pool"), r.get("device")) for r in
                   ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
                   if r.get("driver") == sel.driver and _request_matches(str(r.get("request", "")), sel.request)}
        for entry in status.get("devices") or []:
            if entry.get("driver") != sel.driver or (entry.get("pool"), entry.get("device")) not in devices:
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in entry.get("conditions") or [])
            ips = _shared_ips(entry, uid) if name in shared else (entry.get("networkData") or {}).get("ips") or []
            for cidr in ips:
                try:
                    ip = ipaddress.ip_interface(cidr).ip
                except ValueError:
                    continue
                if not servable(ip):
                    continue
                if str(ip) not in seen:
                    seen.add(str(ip))
                    found.append(Address(str(ip), f"IPv{ip.version}", ready))
    return found
