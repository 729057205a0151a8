"""The chain keeper keeps working after its token is rotated and the old one is refused.

The keeper lives as long as its DaemonSet pod, far longer than a projected
token (the chart asks for 3600 s, which the API server does not extend).
Real parts: the real kube-apiserver (tests/conftest.py), the real
`netclaim-publisher chain-keeper` process with its owner watch and Event
recorder, the real plugin executable it installs. Its kubeconfig reads the
token from a `tokenFile`, as kubelet's projected token is read: a
ServiceAccount token bound to a Secret (TokenRequest, boundObjectRef kind
Secret). The rotation writes a token bound to a second Secret into the file
(atomic replace, as kubelet does) and deletes the first Secret, so the old
token is refused (401) as soon as the API server's token cache lets go; an
API server restart then breaks the keeper's DaemonSet watch, which has to
list again with the new token. After that the keeper must still write its
ChainContested Event, see its DaemonSet deleted, and clean the node on
SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from runtime import identity
from test_chain_keeper import (
    CILIUM,
    PRIMARY,
    Node,
    OtherWriter,
    cilium_exclusive,
    get,
    keeper_log,
    probes_port,
    running_keeper,
    wait,
)

pytestmark = pytest.mark.controlplane

NAMESPACE = "netclaim-rotation"
ACCOUNT = "chain-keeper"


def ensure_namespace(core: client.CoreV1Api) -> None:
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:
            raise


class KeeperIdentity:
    """The keeper's ServiceAccount, its least grants (its DaemonSet; Events), and its rotating token file."""

    def __init__(self, api: client.ApiClient, workdir: Path, server: str, ca_file: str) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.suffix = uuid.uuid4().hex[:6]
        self.daemonset = f"netclaim-{self.suffix}"
        self.token_file = workdir / "token"
        self.kubeconfig = workdir / "keeper.kubeconfig"
        self.secrets: list[dict[str, str]] = []
        self.token = ""
        self._write_kubeconfig(server, ca_file)

    def _write_kubeconfig(self, server: str, ca_file: str) -> None:
        text = json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca_file}}],
            "users": [{"name": "keeper", "user": {"tokenFile": str(self.token_file)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "keeper"}}],
            "current-context": "local"})
        fd = os.open(self.kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)

    def setup(self) -> "KeeperIdentity":
        ensure_namespace(self.core)
        try:
            self.core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": ACCOUNT}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        subject = [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]
        grants = [
            (NAMESPACE, [{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [self.daemonset],
                          "verbs": ["get", "list", "watch"]}]),
            ("default", [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]),
        ]
        for namespace, rules in grants:
            name = f"keeper-{self.suffix}"
            self.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
            self.rbac.create_namespaced_role_binding(namespace, {
                "metadata": {"name": name}, "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})
        client.AppsV1Api(self.api).create_namespaced_daemon_set(NAMESPACE, {
            "metadata": {"name": self.daemonset},
            "spec": {"selector": {"matchLabels": {"app": self.daemonset}},
                     "template": {"metadata": {"labels": {"app": self.daemonset}},
                                  "spec": {"containers": [{"name": "keeper", "image": "local/pause:1"}]}}}})
        self.mint()
        return self

    def mint(self) -> None:
        """A Secret, a token bound to it, written to the token file as kubelet writes one (atomic replace)."""
        secret = self.core.create_namespaced_secret(NAMESPACE, {
            "metadata": {"name": f"keeper-{self.suffix}-{len(self.secrets)}"}, "type": "Opaque"})
        bound = {"name": secret.metadata.name, "uid": secret.metadata.uid}
        self.secrets.append(bound)
        self.token = identity.bound_token(self.api, "Secret", bound, namespace=NAMESPACE, service_account=ACCOUNT)
        tmp = self.token_file.with_name(".token.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.token)
        os.replace(tmp, self.token_file)

    def rotate(self) -> None:
        """The new token on disk, the old one's Secret deleted; returns once the server refuses the old token."""
        old_token, old = self.token, self.secrets[-1]
        self.mint()
        self.core.delete_namespaced_secret(old["name"], NAMESPACE)
        wait(lambda: not identity.authenticated(self.api, old_token), "the old token to be refused", timeout=60)
        assert identity.authenticated(self.api, self.token)

    def cleanup(self) -> None:
        for secret in self.secrets:
            ignore_404(lambda: self.core.delete_namespaced_secret(secret["name"], NAMESPACE))
        ignore_404(lambda: client.AppsV1Api(self.api).delete_namespaced_daemon_set(self.daemonset, NAMESPACE))
        for namespace in (NAMESPACE, "default"):
            name = f"keeper-{self.suffix}"
            ignore_404(lambda: self.rbac.delete_namespaced_role_binding(name, namespace))
            ignore_404(lambda: self.rbac.delete_namespaced_role(name, namespace))


def ignore_404(call: Any) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise


def contest_events(api: client.ApiClient, node_name: str) -> list[dict[str, Any]]:
    resp = client.EventsV1Api(api).list_namespaced_event("default", _preload_content=False)
    return [e for e in json.loads(resp.data)["items"]
            if e.get("reason") == "ChainContested" and e["regarding"].get("name") == node_name]


def owner_seen(root: Path, state: str) -> bool:
    """The keeper's owner watch logged this state of its DaemonSet."""
    return re.search(rf"own DaemonSet observed .*state={state}\b", keeper_log(root)) is not None


def test_the_keeper_keeps_working_after_its_token_is_rotated_and_the_old_one_refused(
        tmp_root: Path, plugin_binary: Path, control_plane: Any, api_client: client.ApiClient) -> None:
    node = Node(tmp_root)
    original = node.write("10-calico.conflist", PRIMARY)
    (node.spool / "1-x.event.json").write_text("{}")
    keeper_id = KeeperIdentity(api_client, tmp_root, control_plane.server, control_plane.ca_file).setup()
    node_name = f"node-{keeper_id.suffix}"
    try:
        with running_keeper(node, plugin_binary, tmp_root, f"--kubeconfig={keeper_id.kubeconfig}",
                            f"--daemonset={keeper_id.daemonset}", f"--namespace={NAMESPACE}",
                            f"--node-name={node_name}", "--cni-cache-dir=") as keeper:
            wait(lambda: node.chained("10-calico.conflist"), "the first chaining", keeper, tmp_root)
            wait(lambda: owner_seen(tmp_root, "present"), "the owner watch's first list", keeper, tmp_root,
                 timeout=60)

            keeper_id.rotate()
            # A restart ends every watch: the keeper's has to list again, which the old token cannot.
            control_plane.stop_apiserver()
            control_plane.start_apiserver()

            # An API write after the rotation: the contest Event (Cilium's exclusive mode undoing the keeper).
            node.write("05-cilium.conflist", CILIUM)
            with OtherWriter(node, cilium_exclusive):
                wait(lambda: bool(contest_events(api_client, node_name)), "the ChainContested Event written with "
                     "the rotated token", keeper, tmp_root, timeout=180)
            os.rename(node.net_d / "10-calico.conflist.cilium_bak", node.net_d / "10-calico.conflist")
            (node.net_d / "05-cilium.conflist").unlink()
            wait(lambda: node.chained("10-calico.conflist"), "chaining back into the original", keeper, tmp_root)

            # Uninstall: the DaemonSet deleted, seen by the watch that listed again with the new token.
            client.AppsV1Api(api_client).delete_namespaced_daemon_set(keeper_id.daemonset, NAMESPACE)
            wait(lambda: owner_seen(tmp_root, "gone"), "the owner watch to see its DaemonSet deleted", keeper,
                 tmp_root, timeout=180)
            keeper.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 60
            while keeper.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert keeper.poll() == 0, keeper_log(tmp_root)
        said = keeper_log(tmp_root)
        assert re.search(r"uninstall or not .*owner=gone", said), said
        assert (node.net_d / "10-calico.conflist").read_bytes() == original, said
        assert sorted(os.listdir(node.net_d)) == ["10-calico.conflist"], said
        assert sorted(os.listdir(node.bin_d)) == [], said
        assert list(node.spool.parent.iterdir()) == [], said
    finally:
        keeper_id.cleanup()


def test_the_keeper_turns_ready_only_once_it_has_looked_at_its_daemonset(
        tmp_root: Path, plugin_binary: Path, control_plane: Any, api_client: client.ApiClient) -> None:
    """A keeper that has not yet read its own DaemonSet could not tell an uninstall's SIGTERM from an upgrade's
    and would leave the node chained; a `helm uninstall` right after `helm upgrade --wait` hit exactly that.
    So /readyz waits for the owner watch's first answer: with the API server down at start the keeper still
    chains the node (the chain never waits on the API) and its /readyz line says `chained`, but it answers 503
    and names the missing look; once the API server is back and the watch has listed, it turns ready."""
    node = Node(tmp_root)
    node.write("10-calico.conflist", PRIMARY)
    keeper_id = KeeperIdentity(api_client, tmp_root, control_plane.server, control_plane.ca_file).setup()
    stopped = False
    try:
        control_plane.stop_apiserver()
        stopped = True
        with running_keeper(node, plugin_binary, tmp_root, f"--kubeconfig={keeper_id.kubeconfig}",
                            f"--daemonset={keeper_id.daemonset}", f"--namespace={NAMESPACE}",
                            "--probe-address=127.0.0.1:0", "--cni-cache-dir=") as keeper:
            port = probes_port(keeper, tmp_root)
            wait(lambda: node.chained("10-calico.conflist"), "the first chaining, API server down", keeper, tmp_root)
            code, body = get(port, "/readyz")
            assert code == 503 and body.startswith("chained conflist=10-calico.conflist"), (code, body)
            assert "owner=not-looked-yet" in body, body
            control_plane.start_apiserver()
            stopped = False
            wait(lambda: get(port, "/readyz")[0] == 200, "ready once the owner watch has listed", keeper, tmp_root,
                 timeout=120)
            assert owner_seen(tmp_root, "present"), keeper_log(tmp_root)
            assert "owner=" not in get(port, "/readyz")[1]
    finally:
        if stopped:
            control_plane.start_apiserver()
        keeper_id.cleanup()
