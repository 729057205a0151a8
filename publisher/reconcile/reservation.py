"""Whether a claim's `status.reservedFor` admits a pod: the one answer every part asks for.

A claim may be used by the pods it is reserved for. Two shapes of reservation exist in
Kubernetes 1.37 (resource.k8s.io/v1 `ResourceClaimConsumerReference`):

- a pod: `resource: pods` (core group) and the pod's UID;
- a PodGroup (KEP-5729, feature gate DRAWorkloadResourceClaims, beta and off by default in
  1.37): `apiGroup: scheduling.k8s.io`, `resource: podgroups`, the group's name and UID. Every
  pod whose `spec.schedulingGroup.podGroupName` is that name, in the claim's namespace, may use
  the claim; the scheduler writes one such entry for all of them, not one per pod.

The kubelet admits a pod by the same rule before it starts the sandbox
(k8s.io/dynamic-resource-allocation resourceclaim.IsReservedForPod). A pod does not know its
PodGroup's UID, so the group entry is matched by group, resource and name, as the kubelet
does; a PodGroup recreated under the same name is therefore the same group here too. The rule
needs no PodGroup read: it stays one look at the claim and the pod, with no request per event.

Without the gate no claim carries a PodGroup entry and no pod a schedulingGroup (the API server
drops the field), so accepting the group shape is harmless where it is off; with it off on the
kubelet only, the pod never starts and no ADD ever comes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

PODGROUP_API_GROUP = "scheduling.k8s.io"
PODGROUP_RESOURCE = "podgroups"


def pod_group_name(pod: dict[str, Any]) -> str:
    """The PodGroup a pod belongs to (`spec.schedulingGroup.podGroupName`, immutable), '' for none."""
    group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return group if isinstance(group, str) else ""


@dataclass(frozen=True)
class Reservations:
    """A claim's reservedFor, read once: the pods by UID and the PodGroups by name."""

    namespace: str
    pods: frozenset[str]
    pod_groups: frozenset[str]

    @property
    def sole_pod(self) -> str:
        """The UID of the one pod the claim is reserved for when that is all it is reserved for, else ''."""
        if len(self.pods) == 1 and not self.pod_groups:
            return next(iter(self.pods))
        return ""

    def admits(self, pod_namespace: str, pod_uid: str, pod_group: str | Callable[[], str]) -> bool:
        """Whether the pod may use the claim: its UID is reserved, or its PodGroup in the claim's namespace.

        `pod_group` may be a callable, asked only when a group could admit the pod (the
        reconciler looks the group up in the pod watch only then).
        """
        if pod_uid and pod_uid in self.pods:
            return True
        if not self.pod_groups or (self.namespace and pod_namespace != self.namespace):
            return False
        group = pod_group() if callable(pod_group) else pod_group
        return bool(group) and group in self.pod_groups


def reservations(claim: dict[str, Any]) -> Reservations:
    """The claim's reservations, each entry of the two shapes `admits` knows (others admit no pod)."""
    pods: set[str] = set()
    groups: set[str] = set()
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        resource, group = ref.get("resource"), ref.get("apiGroup") or ""
        if resource == "pods" and not group and ref.get("uid"):
            pods.add(ref["uid"])
        elif resource == PODGROUP_RESOURCE and group == PODGROUP_API_GROUP and ref.get("name"):
            groups.add(ref["name"])
    namespace = (claim.get("metadata") or {}).get("namespace", "")
    return Reservations(namespace, frozenset(pods), frozenset(groups))


def admits(claim: dict[str, Any], pod_namespace: str, pod_uid: str, pod_group: str | Callable[[], str]) -> bool:
    """Whether the claim's reservedFor lets the pod use it (Reservations.admits)."""
    return reservations(claim).admits(pod_namespace, pod_uid, pod_group)
