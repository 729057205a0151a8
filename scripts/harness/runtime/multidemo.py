"""The demo's multi-network story (scripts/demo.sh --multi-network): one pod, three networks, three entries.

Multus is the node's primary CNI (scripts/cluster.sh up --with-multus): eth0
comes from the node's bridge network, net1 from a macvlan
NetworkAttachmentDefinition, net2 from host-device moving a host interface
into the pod (what a physical NIC looks like). Each network's chain ends in
netclaim naming its own request of the pod's one ResourceClaimTemplate, so the
claim shows three device entries, each with its own interface, addresses and
MAC; the demo puts them beside Multus's own network-status annotation and the
pod's network namespace, and fails if any of the three disagree.

Then the device-ID case (the cluster runs the harness's own DRA driver beside
the test driver, `up --with-vf-driver`): a pod whose second claim has one
request `vf` with `count: 2` and the NAD `vf` twice, as dra-driver-sriov's
multi-VF demo. The request cannot tell the two VFs apart; Multus hands each
network the device ID of one of them, and the demo shows each interface's
entry on the device whose ResourceSlice carries that ID.
"""

from __future__ import annotations

import json
from typing import Callable

import yaml

from . import multinet
from .realcluster import RealCluster, wait_until

NAMESPACE, POD, TEMPLATE = "demo", "multi", "three-nets"
VF_POD, VF_TEMPLATE, PRIMARY_TEMPLATE = "vfs", "two-vfs", "eth0"
VF_NETWORKS = [multinet.Attachment("vf", "net1"), multinet.Attachment("vf", "net2")]
DEVICE_ID_ATTRIBUTE = "k8s.cni.cncf.io/deviceID"
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
    device_id_story(cluster, step)


def device_id_story(cluster: RealCluster, step: Callable[[str], None]) -> None:
    """Two VFs of one request, the same NAD twice: each entry on the device whose ID its interface got."""
    driver = cluster.values["NETCLAIM_VF_DRIVER"]
    step(f"the device-ID case: Pod {VF_POD} with claim template {VF_TEMPLATE} (request vf, count: 2, driver "
         f"{driver}) and {multinet.NETWORKS_ANNOTATION}: {multinet.networks_value(VF_NETWORKS)}, the same "
         "NetworkAttachmentDefinition twice; eth0 reports under its own claim")
    template = multinet.claim_template(NAMESPACE, VF_TEMPLATE, [cluster.values["NETCLAIM_VF_REQUEST"]],
                                       cluster.values["NETCLAIM_VF_DEVICE_CLASS"])
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    primary = multinet.claim_template(NAMESPACE, PRIMARY_TEMPLATE, [multinet.PRIMARY_REQUEST],
                                      cluster.values["NETCLAIM_DEVICE_CLASS"])
    cluster.apply(template, primary, multinet.pod(NAMESPACE, VF_POD, VF_NETWORKS, {
        "net": {"resourceClaimTemplateName": PRIMARY_TEMPLATE}, "vf": {"resourceClaimTemplateName": VF_TEMPLATE}}))
    cluster.wait_running(NAMESPACE, VF_POD)
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]
    ids = {(sl["spec"]["pool"]["name"], d["name"]): d["attributes"][DEVICE_ID_ATTRIBUTE]["string"]
           for sl in slices if sl["spec"]["driver"] == driver for d in sl["spec"].get("devices") or []}

    def shown() -> list[dict]:
        pod = cluster.get("pod", VF_POD, NAMESPACE)
        out = []
        for name in multinet.claim_names(pod):
            claim = cluster.claim_yaml(NAMESPACE, name)
            results = claim["status"]["allocation"]["devices"]["results"]
            if not any(r["driver"] == driver for r in results):
                continue
            out = [e for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == driver]
        return out if len(out) == 2 else []

    entries = wait_until(shown, "the two VF entries", timeout=30)
    netns = multinet.netns_interfaces(cluster, NAMESPACE, VF_POD)
    print(f"\n$ kubectl get resourceslices   # {driver}'s devices: name and {DEVICE_ID_ATTRIBUTE}")
    for (pool, device), device_id in sorted(ids.items()):
        print(f"  {pool}/{device}  {device_id}")
    print()
    wrong = []
    for e in sorted(entries, key=lambda x: x["networkData"]["interfaceName"]):
        nd = e["networkData"]
        ifname = nd["interfaceName"]
        here = netns.get(ifname)
        agrees = here is not None and here.mac == nd.get("hardwareAddress", "").lower() and \
            sorted(here.cidrs) == sorted(nd.get("ips") or [])
        wrong += [] if agrees else [ifname]
        print(f"pod={NAMESPACE}/{VF_POD} interface={ifname} device={e['device']} "
              f"deviceID={ids.get((e['pool'], e['device']))} ips={','.join(nd.get('ips') or [])} "
              f"mac={nd.get('hardwareAddress')} netns={'agrees' if agrees else 'DIFFERS'}")
    if wrong:
        raise SystemExit(f"the VF entries disagree with the pod's netns: {wrong}")
    print("Multus gave net1 the lower device ID: each entry sits on the device that carries its interface's ID,\n"
          "whatever order the allocation lists them in")
