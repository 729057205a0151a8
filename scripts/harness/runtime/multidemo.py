"""The demo's multi-network story (scripts/demo.sh --multi-network): one pod, three networks, three entries.

Multus is the node's primary CNI (scripts/cluster.sh up --with-multus): eth0
comes from the node's bridge network, net1 from a macvlan
NetworkAttachmentDefinition, net2 from host-device moving a host interface
into the pod (what a physical NIC looks like). Each network's chain ends in
netclaim naming its own request of the pod's one ResourceClaimTemplate, so the
claim shows three device entries, each with its own interface, addresses and
MAC; the demo puts them beside Multus's own network-status annotation and the
pod's network namespace, and fails if any of the three disagree.
"""

from __future__ import annotations

import json
from typing import Callable

import yaml

from . import multinet
from .realcluster import RealCluster, wait_until

NAMESPACE, POD, TEMPLATE = "demo", "multi", "three-nets"
NETWORKS = [multinet.Attachment("macvlan", "net1"), multinet.Attachment("hostdev0", "net2")]
REQUESTS = [multinet.PRIMARY_REQUEST] + [a.request for a in NETWORKS]


def story(cluster: RealCluster, step: Callable[[str], None]) -> None:
    step(f"installing netclaim (eth0's chain reports under request {multinet.PRIMARY_REQUEST!r}); Multus is the "
         "node's primary CNI and each NetworkAttachmentDefinition's chain ends in netclaim with its own request")
    cluster.sh("install-netclaim")
    step(f"creating namespace {NAMESPACE}, ResourceClaimTemplate {TEMPLATE} (requests {', '.join(REQUESTS)}) and Pod "
         f"{POD} annotated {multinet.NETWORKS_ANNOTATION}: {multinet.networks_value(NETWORKS)}")
    cluster.namespace(NAMESPACE)
    cluster.apply(multinet.claim_template(NAMESPACE, TEMPLATE, REQUESTS, cluster.values["NETCLAIM_DEVICE_CLASS"]),
                  multinet.pod(NAMESPACE, POD, NETWORKS, {"net": {"resourceClaimTemplateName": TEMPLATE}}))
    cluster.wait_running(NAMESPACE, POD)
    claim = cluster.pod_claim(NAMESPACE, POD)
    expected = {"eth0": multinet.PRIMARY_REQUEST, **{a.ifname: a.request for a in NETWORKS}}
    last: list[str] = []

    def agree() -> bool:
        nonlocal last
        last = multinet.problems(multinet.view(cluster, NAMESPACE, POD), expected)
        return not last

    try:
        wait_until(agree, "the three views to agree", timeout=30)
    except AssertionError:
        raise SystemExit("the claim, the pod's netns and Multus's network-status disagree: " + "; ".join(last))
    step(f"Pod Running; claim {claim} holds one device per network")
    status = cluster.claim_yaml(NAMESPACE, claim)["status"]
    requests = {(r["pool"], r["device"]): r["request"] for r in status["allocation"]["devices"]["results"]}
    shown = [{"device": e["device"], "request": requests.get((e["pool"], e["device"])),
              "networkData": e.get("networkData"),
              "Ready": next((c["status"] for c in e.get("conditions") or [] if c["type"] == "Ready"), "")}
             for e in status.get("devices") or []]
    print(f"\n$ kubectl get resourceclaim {claim} -n {NAMESPACE} -o yaml   # .status.devices, abridged")
    print(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False))
    pod = cluster.get("pod", POD, NAMESPACE)
    print(f"$ kubectl get pod {POD} -n {NAMESPACE} -o jsonpath='{{.metadata.annotations.k8s\\.v1\\.cni\\.cncf\\.io/"
          "network-status}'   # Multus's view, abridged")
    for s in json.loads(pod["metadata"]["annotations"][multinet.STATUS_ANNOTATION]):
        print(f"  {s.get('interface')}: {s.get('name')} ips={','.join(s.get('ips') or [])} mac={s.get('mac')}")
    print()
    for e in sorted(shown, key=lambda x: x["networkData"]["interfaceName"]):
        nd = e["networkData"]
        print(f"pod={NAMESPACE}/{POD} request={e['request']} interface={nd['interfaceName']} "
              f"ips={','.join(nd.get('ips') or [])} mac={nd.get('hardwareAddress')} Ready={e['Ready']}")
    print("claim entries, the pod's netns and Multus's network-status agree on every interface")
