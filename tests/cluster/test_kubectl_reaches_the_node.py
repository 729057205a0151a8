"""kubectl reaches the kubelet of the single-node cluster (`scripts/cluster.sh up`, conftest.py's cluster).

`kubectl logs`, `exec` and `port-forward` and the node proxy all go through kube-apiserver to the
kubelet, where the Node says it serves: its InternalIP (the node IP) and the kubelet endpoint's
port. kube-apiserver verifies the kubelet's serving certificate against the cluster CA
(--kubelet-certificate-authority) and nothing here skips that check. The workload is the netclaim
image (scripts/build-image.sh, imported offline; it has python3.11), as in test_multinode.py.
`kubectl_reaches_the_node` is the whole check; test_crio_cluster.py runs it on a CRI-O node.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.request
import uuid
from pathlib import Path

from runtime.nodechart import build_image, version
from runtime.realcluster import RealCluster, wait_until

# The name the archive gives the image: fully qualified, so that CRI-O (no short-name search) finds it too.
APP_IMAGE = f"docker.io/library/netclaim:{version()}"
PYTHON = "/usr/bin/python3.11"
PORT = 8080
# Writes the text given as argv[1] to hello.txt, says so on stdout and serves that file's directory.
SERVER = ("import functools, http.server, os, sys; os.makedirs('/srv/www', exist_ok=True); "
          "open('/srv/www/hello.txt', 'w').write(sys.argv[1]); print('serving', sys.argv[1], flush=True); "
          "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/srv/www'); "
          f"http.server.ThreadingHTTPServer(('', {PORT}), handler).serve_forever()")


def import_app_image(cluster: RealCluster) -> str:
    """The netclaim image in the node's runtime (containerd or CRI-O); its name."""
    cluster.sh("import-image", build_image(), timeout=900)
    return APP_IMAGE


def apiserver_kubelet_ca(cluster: RealCluster) -> str:
    """The CA kube-apiserver verifies the kubelets' serving certificates against (its command line)."""
    pid = Path(cluster.values["NETCLAIM_CP_DIR"], "kube-apiserver.pid").read_text().strip()
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    flag = "--kubelet-certificate-authority"
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return ""


def kubelet_certificate(cluster: RealCluster, address: str, port: int) -> dict:
    """The kubelet's serving certificate, verified as kube-apiserver verifies it: against the cluster CA alone,
    for the address dialled."""
    context = ssl.create_default_context(cafile=cluster.values["NETCLAIM_APISERVER_CA"])
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT  # Go's checks, not Python's stricter RFC 5280 profile
    with socket.create_connection((address, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=address) as tls:
            return tls.getpeercert()


def kubectl_reaches_the_node(cluster: RealCluster, ns: str, image: str) -> None:
    node = cluster.get("node", cluster.node)
    (internal_ip,) = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert (internal_ip, str(port)) == (cluster.values["NETCLAIM_NODE_IP"], cluster.values["NETCLAIM_KUBELET_PORT"])
    assert apiserver_kubelet_ca(cluster) == cluster.values["NETCLAIM_APISERVER_CA"]
    cert = kubelet_certificate(cluster, internal_ip, port)
    assert ("IP Address", internal_ip) in cert["subjectAltName"], cert

    pod, text = "web", f"hello from {uuid.uuid4().hex[:8]}"
    cluster.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": ns},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "image": image, "imagePullPolicy": "Never",
                                 "command": [PYTHON, "-u", "-c", SERVER, text]}]}})
    cluster.wait_running(ns, pod, timeout=180)

    # kubectl logs
    logs = wait_until(lambda: cluster.kubectl("logs", "-n", ns, pod), f"{pod}'s log line", timeout=30)
    assert logs.strip() == f"serving {text}"

    # kubectl exec: a command's output (and its exit code)
    out = cluster.kubectl("exec", "-n", ns, pod, "--", PYTHON, "-c",
                          "import socket; print(socket.gethostname()); print(open('/srv/www/hello.txt').read())")
    assert out.splitlines() == [pod, text]
    failed = subprocess.run([cluster.values["NETCLAIM_KUBECTL"], "--kubeconfig", cluster.kubeconfig, "exec", "-n", ns,
                             pod, "--", PYTHON, "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 3, failed.stderr

    # kubectl port-forward: the file the pod serves
    with cluster.port_forward(ns, pod, PORT) as (local, forward):
        def fetch() -> str:  # "" until the forward listens
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/hello.txt", timeout=10) as resp:
                    return resp.read().decode()
            except OSError:
                if forward.poll() is not None:
                    raise AssertionError(f"kubectl port-forward exited: {forward.communicate()[1]}") from None
                return ""
        assert wait_until(fetch, f"port-forward to {pod}", timeout=30) == text

    # the node proxy: kube-apiserver -> the kubelet's own endpoints
    assert cluster.kubectl("get", "--raw", f"/api/v1/nodes/{cluster.node}/proxy/healthz").strip() == "ok"
    pods = json.loads(cluster.kubectl("get", "--raw", f"/api/v1/nodes/{cluster.node}/proxy/pods"))
    assert (ns, pod) in [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods["items"]]


def test_kubectl_logs_exec_port_forward_and_the_node_proxy_reach_the_node(real_cluster: RealCluster, ns: str) -> None:
    kubectl_reaches_the_node(real_cluster, ns, import_app_image(real_cluster))


def test_the_kubelets_metrics_are_read_on_the_node_ip_with_the_certificate_verified(real_cluster: RealCluster) -> None:
    """What the harness reads from the kubelet itself (RealCluster.kubelet_metrics) comes where it now serves."""
    assert "kubelet_running_pods" in real_cluster.kubelet_metrics()
