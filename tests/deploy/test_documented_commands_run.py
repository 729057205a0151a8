"""Every command the user docs show for an install runs, as written, on a real install of that kind.

test_docs.py checks that each documented command exists; this runs them. Each fenced block of commands
says which install it is for (doclib.py). For each install one test walks the docs the way an operator
does: install, check that it works, look into a problem, uninstall. Every line of every block of that
install is pasted into a shell on a node (noderoot.py: the node's own paths and host name, this machine
left untouched) and must exit as the docs say (0 unless they say otherwise, EXPECTATIONS) and print
what they say it prints. Lines that change the cluster run in the order the docs give them; the
read-only blocks run in between, in the docs' order.

Only three things stand between a documented line and the line run, each a short explicit table here:
the placeholders the docs ask the reader to fill in (POD, NAME, NODE_IP, <driverName>, ...), the
defaults that this cluster's node layout changes (daemonset_substitutions: its CNI and netclaim dirs;
and in both installs the documented ports, picked free because this machine's ports are shared with
other test clusters), and, for the chart, a values file with that layout added to `helm install`
(platform_values). Lines that cannot run on this machine are named, with the reason, in
CANNOT_RUN_HERE; any other line left unrun fails the test.

- DaemonSet: the harness's real single-node cluster (scripts/cluster.sh: etcd, kube-apiserver,
  kubelet, containerd 2.x, the DRA test driver), the image built by scripts/build-image.sh and
  imported into its containerd, netclaim pods with claims on it.
- systemd: a node named after that cluster's node, with a primary network of its own: the docs'
  steps as written, the unit started the way systemd starts it (there is no systemd here), an ADD for
  a real pod of that cluster through the node's conflist by libcni's cnitool (the library containerd
  and CRI-O run chains with), the checks, the uninstall, then multi-network.md's installs.

NETCLAIM_DOCS_CLUSTER_DIR picks the cluster dir (default /tmp/nc-cl-docs); NETCLAIM_CLUSTER_KEEP=1
leaves it up.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import cni_plugin
from chartlib import helm, helm_binary
from deploylib import CONF, REPO, own_cluster, parse_unit_text, suffix, terminate
from doclib import RUN_SEPARATORS, Block, all_blocks, command_lines, logical_lines, program_words, words
from noderoot import LineRun, NodeRoot
from publisher.keeper.nodefiles import cached_users
from test_daemonset_cluster import (NodeFiles, build_image, can_i, daemonset_pod, pod_gets_status, service_account,
                                    sigterm_keeper)

from runtime.realcluster import RealCluster, entries_of, free_port, ready_status, wait_until

pytestmark = pytest.mark.containerd

VERSION = cni_plugin.__version__
RELEASE = "netclaim"
NAMESPACE = "netclaim-system"
# The docs' `kubectl get resourceclaim NAME` names no namespace: the claim is in the reader's current one.
PODS_NAMESPACE = "default"
PLATFORM_VALUES = "/root/this-cluster-values.yaml"
CNI_CACHE = "/var/lib/cni"  # libcni's cache, where containerd keeps each sandbox's config

# ---------------------------------------------------------------- what the docs say a line does


@dataclass(frozen=True)
class Expect:
    """What a documented line (matched by `command`, a regex) does: its exit code and what its output
    shows (regexes; {NAME}-style placeholders are filled in), and where the docs say so."""

    command: str
    prints: tuple[str, ...] = ()
    rc: int = 0
    says: str = ""


EXPECTATIONS = (
    Expect(r"^scripts/build-image\.sh", (r"\.oci\.tar\s*$",), says="an OCI archive (README, install.md)"),
    Expect(r"^helm install ", (r"STATUS: deployed",)),
    Expect(r"^helm uninstall ", (rf'release "{RELEASE}" uninstalled',)),
    # Every container ready: the publisher, the chain keeper and (with the live watch, the default) the netns opener.
    Expect(r"get pods -o wide -l app\.kubernetes\.io/name=netclaim", (r"(?m)^\S+\s+3/3\s+Running\s",),
           says="one per node, all three containers ready (troubleshooting.md)"),
    Expect(r"netclaim-publisher status", (r"(?m)^journal depth:\s+0$", r"(?m)^last error:", r"{NAME}\s+published"),
           says="journal, last error, per-claim state; exit 1 only on a problem (publisher.md)"),
    Expect(r"logs POD -c publisher", (r'"msg":"publisher started"',), says="the node service"),
    Expect(r"logs POD -c chain-keeper", (r'"msg":"chain status"',), says="chaining and uninstall"),
    Expect(r"logs POD -c netns-opener", (r'"msg":"netns opener serving"',), says="the live watch's netns opening"),
    Expect(r"netclaim-publisher fleet .*-o json", (r'"ok": 1',), says="exit 0: no node has a problem (publisher.md)"),
    Expect(r"netclaim-publisher fleet", (r"(?m)^NODE\s+CHAINED\s+CONTESTED\s+BACKLOG", r"(?m)^1 node: 1 ok$"),
           says="a table (publisher.md)"),
    Expect(r"get resourceclaim NAME -o jsonpath=.\{\.status\.devices\}", (r'"interfaceName":"eth0"',)),
    Expect(r"describe resourceclaim NAME", (r"(?m)^Name:\s+{NAME}$",)),
    Expect(r"/metrics \| grep netclaim_", (r"(?m)^netclaim_build_info\{",)),
    Expect(r"/readyz", (r"^ok",), says="/readyz of the publisher"),
    Expect(r"^ls /etc/cni/net\.d/", (r"\.conflist",)),
    Expect(r"^jq '\.plugins\[\]\.type'", (r'"netclaim"\s*$',), says='..., "netclaim" (troubleshooting.md)'),
    Expect(r"^ls -l /opt/cni/bin/netclaim", (r"^-rwxr-xr-x ",), says="the plugin, 0755 (troubleshooting.md)"),
    Expect(r"^kubectl -n netclaim-system create token netclaim-publisher", (r"^[\w-]+\.[\w-]+\.[\w-]+\s*$",),
           says="a token (README.md)"),
    Expect(r"^helm template netclaim conf/helm/netclaim .*--show-only templates/10-rbac\.yaml.*\| kubectl apply -f -",
           (r"clusterrole\.rbac\.authorization\.k8s\.io/netclaim-publisher",),
           says="netclaim's RBAC for the reader's driver, applied (README.md, install.md step 3)"),
)

# Lines that cannot run on this machine, and why. What can still be checked of them is checked where the
# test does their part (the units systemctl names; the release steps in test_release.py).
CANNOT_RUN_HERE = {
    r"^systemctl ": "no systemd as init on this machine: the test does what the line does (starts or stops the "
                    "installed unit's ExecStart with its environment, directories and umask) and checks that the "
                    "unit the line names is the unit the docs installed in /etc/systemd/system",
    r"^cd dist/[0-9.]+ && sha256sum -c SHA256SUMS": "a release's directory (scripts/release.sh): test_release.py runs "
                                                    "`sha256sum -c SHA256SUMS` in the release it builds",
    r"^skopeo ": "an OCI registry to push to: there is none on this machine",
    r"^ctr -n k8s\.io images |^helm install \S+ netclaim-[0-9.]+\.tgz ":
        "the release's archive and packaged chart (scripts/release.sh; the push block's install also a registry): "
        "test_release.py imports the archive with every platform, names its index by digest and installs the "
        "packaged chart by digest on a cluster of its own; a release built and installed here too would double "
        "lane c's release cost",
    r"^COSIGN_PASSWORD=\S+ scripts/release\.sh \S+ --push |^cosign |^helm install \S+ oci://registry\.example\.com/":
        "the reader's registry and the project's signing key (placeholders): test_release_registry.py pushes a "
        "release to a real registry on the loopback, signs it, verifies it with cosign, pulls the chart from it "
        "and installs it by digest on a real node",
    r"--set cni\.conflist=10-aws\.conflist": "Amazon EKS's node layout and the reader's registry and digest "
                                             "(placeholders): none of it is on this machine",
}


def build_caches() -> str:
    """The machine's build caches (image, plugin, package store), bound into a NodeRoot as they are: a
    reader's machine keeps them between commands too, and umoci cannot unpack an image's layers into
    the overlay (seen: `mkdir .../rootfs/var/spool: not a directory`)."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "netclaim"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def cannot_run_here(line: str) -> str:
    return next((why for pattern, why in CANNOT_RUN_HERE.items() if re.search(pattern, line)), "")


def expectation(line: str) -> Expect:
    """The first EXPECTATIONS entry whose pattern the command (its comment left out) matches; else exit 0."""
    command = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
    return next((e for e in EXPECTATIONS if re.search(e.command, command)), Expect(".*"))


def fill(text: str, values: dict[str, str]) -> str:
    """The docs' placeholders (POD, NAME, <request>, ...) replaced by the reader's values, as whole words."""
    for name, value in values.items():
        text = re.sub(rf"(?<![\w$/.-]){re.escape(name)}(?![\w-])", lambda _m: value, text)
    return text


# ---------------------------------------------------------------- running the docs' blocks of one install


@dataclass
class DocRun:
    """The blocks of one install, run on a node line by line, each line held to what the docs say."""

    node: NodeRoot
    mode: str
    substitutions: dict[str, str]  # documented default -> what this cluster has instead
    placeholders: dict[str, str] = field(default_factory=dict)
    helm_values: str = ""  # added to every `helm install` line: this cluster's node layout
    ran: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    @property
    def blocks(self) -> list[Block]:
        return [b for b in all_blocks() if self.mode in b.modes]

    def block(self, doc: str, contains: str) -> Block:
        found = [b for b in self.blocks if b.doc == doc and contains in b.text]
        assert len(found) == 1, f"{doc}: {len(found)} {self.mode} blocks with `{contains}`, expected 1"
        return found[0]

    def rest(self, *later: Block) -> list[Block]:
        """The blocks not run yet and not kept for later, in the docs' order: the ones that only read."""
        return [b for b in self.blocks if b.where not in self.ran and b not in later]

    def as_run(self, line: str) -> str:
        for default, here in self.substitutions.items():
            line = line.replace(default, here)
        line = fill(line, self.placeholders)
        if self.helm_values and re.match(r"^helm (install|upgrade) ", line):
            command, hash_, comment = line.partition(" #")
            line = f"{command.rstrip()} -f {self.helm_values}" + (f" #{comment}" if hash_ else "")
        return line

    def run(self, block: Block, after: str = "", *, fail_fast: bool = True) -> list[LineRun]:
        """Every line of the block in one shell, each held to what the docs say. A block the next steps build on
        fails the test at once (`fail_fast`); a block that only looks is noted and the walk goes on, so that one
        run names every line that is wrong (assert_all_did_what_the_docs_say)."""
        documented = [line for line in command_lines(block.text) if not self._skip(block, line)]
        results = self.node.run_lines([self.as_run(line) for line in documented], cwd=str(REPO), after=after)
        self.ran.add(block.where)
        wrong = [f"{block.where}: {problem}" for line, result in zip(documented, results)
                 for problem in self.problems(line, result)]
        self.wrong += wrong
        if fail_fast and wrong:
            self.assert_all_did_what_the_docs_say()
        return results

    def assert_all_did_what_the_docs_say(self) -> None:
        assert not self.wrong, "documented commands that do not do what the docs say:\n\n" + "\n\n".join(self.wrong)

    def _skip(self, block: Block, line: str) -> bool:
        why = cannot_run_here(line)
        if why:
            self.skipped.append(f"{block.where}: `{line}`: {why}")
        return bool(why)

    def problems(self, line: str, result: LineRun) -> list[str]:
        expect = expectation(line)
        if result.rc != expect.rc:
            return [f"expected exit {expect.rc} {expect.says}\n{result.tail()}"]
        patterns = [re.sub(r"\{([A-Z_]+)\}", lambda m: re.escape(self.placeholders[m.group(1)]), p)
                    for p in expect.prints]
        return [f"expected output matching {pattern!r} {expect.says}\n{result.tail()}"
                for pattern in patterns if not re.search(pattern, result.out)]

    def assert_every_block_ran(self) -> None:
        unrun = [b.where for b in self.blocks if b.where not in self.ran]
        assert not unrun, f"{self.mode} blocks of the docs this test did not run: {unrun}"


def installs_lines() -> list[str]:
    return [line for block in all_blocks() if set(block.modes) & {"daemonset", "systemd"}
            for line in command_lines(block.text)]


def test_every_expectation_and_exception_is_about_a_line_the_docs_have() -> None:
    """A table entry that matches no documented line checks nothing: a typo, or a line the docs dropped."""
    lines = installs_lines()
    stale = [e.command for e in EXPECTATIONS if not any(re.search(e.command, line) for line in lines)]
    stale += [pattern for pattern in CANNOT_RUN_HERE if not any(re.search(pattern, line) for line in lines)]
    assert not stale, stale


def test_a_line_is_run_with_only_its_placeholders_and_this_clusters_layout_changed() -> None:
    docs = DocRun(node=None, mode="daemonset", substitutions={"/run/netclaim": "/tmp/c/run"},  # type: ignore[arg-type]
                  placeholders={"POD": "netclaim-x1", "NAME": "web-net"}, helm_values="/root/v.yaml")
    assert docs.as_run("kubectl -n $NS exec POD -c publisher -- status --socket /run/netclaim/publisher.sock") == \
        "kubectl -n $NS exec netclaim-x1 -c publisher -- status --socket /tmp/c/run/publisher.sock"
    # Whole words only: NAME in NETCLAIM_NODE_NAME or a path is not the placeholder.
    assert docs.as_run("echo $NAME NETCLAIM_NODE_NAME /x/NAME NAME") == "echo $NAME NETCLAIM_NODE_NAME /x/NAME web-net"
    # The values file goes before a comment, so the shell does not drop it.
    assert docs.as_run("helm install netclaim conf/helm/netclaim --set request=nic    # note") == \
        "helm install netclaim conf/helm/netclaim --set request=nic -f /root/v.yaml # note"
    assert docs.as_run("helm template netclaim conf/helm/netclaim > x.yaml") == \
        "helm template netclaim conf/helm/netclaim > x.yaml"


def an_operators_shell(node: NodeRoot, cluster: RealCluster) -> None:
    """What the docs assume the reader has: kubectl and helm on the PATH, a kubeconfig that may administer the
    cluster as ~/.kube/config, and the netclaim source tree as the working directory."""
    node.sh(f"ln -s {shlex.quote(cluster.values['NETCLAIM_KUBECTL'])} /usr/local/bin/kubectl && "
            f"ln -s {shlex.quote(helm_binary())} /usr/local/bin/helm")
    node.write("/root/.kube/config", Path(cluster.kubeconfig).read_text(), 0o600)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    yield from own_cluster("NETCLAIM_DOCS_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-cl-docs"))


@pytest.fixture(scope="module")
def image(cluster: RealCluster) -> str:
    """The image the docs' `scripts/build-image.sh` makes (built here first, so theirs is the cache's), made
    available to the node as the docs ask the reader to: imported into its containerd."""
    archive = build_image(VERSION)
    cluster.sh("import-image", archive, timeout=900)
    return archive


# ---------------------------------------------------------------- the DaemonSet install


def platform_values(cluster: RealCluster, ports: dict[str, int]) -> dict[str, Any]:
    """This cluster's node layout, as an operator gives their platform's (docs/platforms.md): the runtime's CNI
    dirs and netclaim's host dirs under the cluster's own directory (this machine's /etc/cni/net.d, /run and
    /var/lib are not the node's), ports picked free (this machine's ports are every test cluster's), and the API
    server as a node sees it (there is no kube-proxy here)."""
    return {
        "cni": {"confDir": cluster.values["NETCLAIM_CNI_CONF"], "binDir": cluster.values["NETCLAIM_CNI_BIN"]},
        "hostPaths": {"run": f"{cluster.dir}/netclaim-run", "state": f"{cluster.dir}/netclaim-state"},
        "metrics": {"port": ports["metrics"], "keeperPort": ports["keeper"], "probePort": ports["probe"],
                    "keeperProbePort": ports["keeperProbe"]},
        "apiServer": {"host": "127.0.0.1", "port": cluster.values["NETCLAIM_APISERVER"].rsplit(":", 1)[1]},
        # This kernel has no AppArmor: the kubelet refuses a pod that asks for a profile (docs/platforms.md).
        "liveWatch": {"openerAppArmorProfile": ""},
    }


def daemonset_substitutions(values: dict[str, Any], node_ip: str) -> dict[str, str]:
    """The chart's defaults the docs show, as this cluster's values set them."""
    return {"/etc/cni/net.d": values["cni"]["confDir"], "/opt/cni/bin": values["cni"]["binDir"],
            "/run/netclaim": values["hostPaths"]["run"], "/var/lib/netclaim": values["hostPaths"]["state"],
            "127.0.0.1:9466": f"127.0.0.1:{values['metrics']['probePort']}",
            "NODE_IP:9464": f"{node_ip}:{values['metrics']['port']}"}


def wait_rolled_out(cluster: RealCluster) -> str:
    """The release's pod on the node, once both its containers are ready; its name."""
    cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"daemonset/{RELEASE}", "--timeout=300s", timeout=330)
    return wait_until(lambda: (lambda p: p and p["status"].get("phase") == "Running" and p["metadata"]["name"])(
        daemonset_pod(cluster)), "the release's pod", timeout=60)


def uninstalled(cluster: RealCluster) -> None:
    wait_until(lambda: not daemonset_pod(cluster), "the release's pod to be gone", timeout=180)


def leave_the_node_chained(cluster: RealCluster, files: NodeFiles) -> None:
    """The state troubleshooting.md's hand cleanup starts from: netclaim gone, the node still chained. The
    chain keeper restarts without its RoleBinding (so no watch on its DaemonSet) and, at `helm uninstall`,
    gets 403 for the DaemonSet: no proof of an uninstall, so it keeps the node as it is."""
    account = service_account(cluster)
    cluster.kubectl("delete", "rolebinding", f"{RELEASE}-chain-keeper", "-n", NAMESPACE)
    wait_until(lambda: not can_i(cluster, "get", f"daemonsets/{RELEASE}", account), "the keeper's grant to be gone")
    sigterm_keeper(cluster)
    helm("uninstall", RELEASE, "-n", NAMESPACE, kubeconfig=cluster.kubeconfig)
    uninstalled(cluster)
    assert files.chained(files.conflist) and (files.bin / "netclaim").is_file(), "the keeper cleaned the node"


def teardowns_done(cluster: RealCluster, namespace: str, pods: list[str], socket_path: str) -> None:
    """The pods deleted, and no sandbox config cached by the runtime still runs netclaim."""
    for pod in pods:
        cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=true", "--timeout=120s", check=False,
                        timeout=180)
    wait_until(lambda: not cached_users(Path(CNI_CACHE), socket_path), "every sandbox that ran netclaim torn down",
               timeout=180)


def test_every_daemonset_command_of_the_docs_runs_as_written(cluster: RealCluster, image: str) -> None:
    files = NodeFiles(cluster)
    before = files.snapshot()
    ports = {name: free_port() for name in ("metrics", "keeper", "probe", "keeperProbe")}
    values = platform_values(cluster, ports)
    pod = f"docs-{suffix()}"
    with NodeRoot(cluster.node, binds=[cluster.dir, build_caches()]) as node:
        an_operators_shell(node, cluster)
        node.write(PLATFORM_VALUES, yaml.safe_dump(values))
        docs = DocRun(node, "daemonset", daemonset_substitutions(values, cluster.values["NETCLAIM_NODE_IP"]),
                      {"NAME": f"{pod}-net", "NODE_IP": cluster.values["NETCLAIM_NODE_IP"],
                       "<driverName>": cluster.driver, "<request>": "nic",
                       "<netclaim source tree or wheel>": "."}, helm_values=PLATFORM_VALUES)
        install = docs.block("docs/install.md", "helm install netclaim conf/helm/netclaim --namespace")
        uninstall = docs.block("docs/install.md", "helm uninstall")
        by_hand = docs.block("docs/troubleshooting.md", "chain-keeper --uninstall")
        try:
            # README: build the image, install the chart; a pod with a claim gets its status.
            docs.run(docs.block("README.md", "helm install"))
            docs.placeholders.update(POD=wait_rolled_out(cluster), NODE=cluster.node)
            pod_gets_status(cluster, PODS_NAMESPACE, pod)
            # Everything that only looks, in the docs' order.
            for block in docs.rest(install, uninstall, by_hand):
                docs.run(block, fail_fast=False)
            # troubleshooting.md: the node left chained by an uninstall that could not prove itself, cleaned by
            # hand once the pods that ran netclaim are gone.
            leave_the_node_chained(cluster, files)
            teardowns_done(cluster, PODS_NAMESPACE, [pod], f"{values['hostPaths']['run']}/publisher.sock")
            docs.run(by_hand)
            assert files.snapshot() == before, "the hand cleanup did not put the node back as it was"
            # install.md: its install, then its uninstall, which puts the node back as it was.
            docs.run(install)
            docs.placeholders["POD"] = wait_rolled_out(cluster)
            assert files.chained(files.conflist)
            docs.run(uninstall)
            uninstalled(cluster)
        finally:
            helm("uninstall", RELEASE, "-n", NAMESPACE, kubeconfig=cluster.kubeconfig, check=False)
            uninstalled(cluster)
            cluster.kubectl("delete", "pod", pod, "-n", PODS_NAMESPACE, "--wait=false", check=False)
            cluster.kubectl("delete", "resourceclaim", f"{pod}-net", "-n", PODS_NAMESPACE, "--wait=false", check=False)
    assert files.snapshot() == before, "the node is not as it was before the install"
    for d in (values["hostPaths"]["run"], values["hostPaths"]["state"]):
        assert not os.path.exists(d) or os.listdir(d) == [], (d, os.listdir(d))
    docs.assert_all_did_what_the_docs_say()
    docs.assert_every_block_ran()
    print("\n".join(["not run here:", *docs.skipped]))


# ---------------------------------------------------------------- the systemd install


def component(name: str) -> str:
    """A Go-built component (scripts/build/components.sh: cached, built once)."""
    proc = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), name], capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, f"{name} could not be built: {proc.stderr[-2000:]}"
    return proc.stdout.strip().splitlines()[-1]


def a_node_with_a_primary_network(node: NodeRoot, bridge: str, subnet: str) -> str:
    """What the node has before netclaim: a CNI chain (bridge + host-local, the reference plugins) in the conflist
    the docs name; its text. The bridge gets no address, so the node gets no route that could meet another's."""
    conflist = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "plugins": [
        {"type": "bridge", "bridge": bridge, "ipam": {"type": "host-local", "subnet": subnet}}]}, indent=2) + "\n"
    node.sh(f"install -D -m 0755 {component('cni-bridge')} /opt/cni/bin/bridge && "
            f"install -m 0755 {component('cni-host-local')} /opt/cni/bin/host-local")
    node.write("/etc/cni/net.d/10-podnet.conflist", conflist)
    return conflist


def kubeconfig_step(cluster: RealCluster) -> str:
    """install.md step 3's last line, `/etc/netclaim/kubeconfig (0600): server, CA and token: $TOKEN`, done."""
    ca = base64.b64encode(Path(cluster.values["NETCLAIM_APISERVER_CA"]).read_bytes()).decode()
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "cluster", "cluster": {"server": cluster.values["NETCLAIM_APISERVER"],
                                                         "certificate-authority-data": ca}}],
           "users": [{"name": "publisher", "user": {"token": "TOKEN"}}],
           "contexts": [{"name": "node", "context": {"cluster": "cluster", "user": "publisher"}}],
           "current-context": "node"}
    text = yaml.safe_dump(doc).replace("token: TOKEN", 'token: "$TOKEN"')
    return f'test -n "$TOKEN" && (umask 077 && cat >/etc/netclaim/kubeconfig <<EOF\n{text}EOF\n)'


def env_file_step(metrics_port: int) -> str:
    """install.md step 4's prose: the heartbeat Lease's settings in /etc/netclaim/publisher.env; and the metrics
    address on a port of its own (NETCLAIM_ARGS, the file's extra flags), this machine's ports being shared."""
    return ("printf '%s\\n' NETCLAIM_NODE_LEASE_NAMESPACE=netclaim-system NETCLAIM_NODE_LEASE_PREFIX=netclaim-node- "
            f"'NETCLAIM_ARGS=--metrics-address 127.0.0.1:{metrics_port}' >>/etc/netclaim/publisher.env")


def unit_command(unit: str, env_file: str, hostname: str) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """ExecStart as systemd expands it (Environment=, then EnvironmentFile=; ${VAR} one word, $VAR split), its
    environment, and the unit's [Service] section."""
    service = parse_unit_text(unit)["Service"]
    env = dict(a.replace("%H", hostname).partition("=")[::2] for a in service["Environment"])
    for line in env_file.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"')
    argv: list[str] = []
    for word in shlex.split(service["ExecStart"][0]):
        braced = re.fullmatch(r"\$\{(\w+)\}", word)
        bare = re.fullmatch(r"\$(\w+)", word)
        argv += [env.get(braced.group(1), "")] if braced else env.get(bare.group(1), "").split() if bare else [word]
    return argv, env, service


def systemctl_enable_now(node: NodeRoot, log: Path) -> Any:
    """What `systemctl daemon-reload && systemctl enable --now netclaim-publisher` does with the unit the docs
    installed: its directories with their modes, its umask, its environment, its ExecStart."""
    unit = node.read("/etc/systemd/system/netclaim-publisher.service")
    argv, env, service = unit_command(unit, node.read("/etc/netclaim/publisher.env"), node.hostname)
    for key, parent in (("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib"),
                        ("ConfigurationDirectory", "/etc")):
        mode = service[f"{key}Mode"][0]
        for name in service[key][0].split():
            node.sh(f"install -d -m {mode} {parent}/{name}")
    return node.start(*argv, env=env, umask=int(service["UMask"][0], 8), log=log)


def systemctl_units(blocks: list[Block]) -> set[str]:
    """The units the docs' systemctl lines start, stop, enable or disable."""
    names = set()
    for block in blocks:
        for line in logical_lines(block.text):
            for simple in RUN_SEPARATORS.split(line):
                command = program_words(words(simple.strip()))
                if command[:1] == ["systemctl"]:
                    names |= {w.removesuffix(".service") for w in command[2:] if not w.startswith("-")}
    return names


def sandbox_add(node: NodeRoot, cluster: RealCluster, pod: str, netns: str, verb: str = "add") -> None:
    """A sandbox of the pod through the node's conflist, by libcni (cnitool) with the CNI_ARGS a runtime passes."""
    cnitool = component("cnitool")
    uid = cluster.get("pod", pod, PODS_NAMESPACE)["metadata"]["uid"]
    env = {"CNI_PATH": "/opt/cni/bin", "NETCONFPATH": "/etc/cni/net.d",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={PODS_NAMESPACE};K8S_POD_NAME={pod};K8S_POD_UID={uid}"}
    node.sh(f"{cnitool} {verb} podnet /run/netns/{netns}", env=env, timeout=120)


def entry_of(cluster: RealCluster, claim: str, subnet_prefix: str) -> dict[str, Any] | None:
    mine = entries_of(cluster.claim_yaml(PODS_NAMESPACE, claim), cluster.driver)
    ok = [e for e in mine if ready_status(e) == "True"
          and any(ip.startswith(subnet_prefix) for ip in (e.get("networkData") or {}).get("ips", []))]
    return ok[0] if ok else None


def test_every_systemd_command_of_the_docs_runs_as_written(cluster: RealCluster, tmp_root: Path) -> None:
    tag = suffix()
    bridge, netns, pod = f"ncd-{tag}", f"ncd-{tag}", f"docs-{tag}"
    subnet_prefix = f"10.251.{int(tag[:2], 16)}."
    metrics_port = free_port()
    publisher_log = tmp_root / "publisher.log"
    with NodeRoot(cluster.node, binds=[build_caches()]) as node:
        an_operators_shell(node, cluster)
        primary = a_node_with_a_primary_network(node, bridge, subnet_prefix + "0/24")
        docs = DocRun(node, "systemd", {"127.0.0.1:9464": f"127.0.0.1:{metrics_port}"},
                      {"NAME": f"{pod}-net", "<netclaim source tree or wheel>": "."})
        steps = [docs.block("docs/install.md", needle) for needle in (
            "/opt/netclaim/venv/bin/pip install", "--driver-name net.example.com", "create token", "daemon-reload")]
        uninstall = docs.block("docs/install.md", "--uninstall")
        multi_network = [b for b in docs.blocks if b.doc == "docs/multi-network.md"]
        try:
            # README's summary of the install, then install.md's steps as written.
            docs.run(docs.block("README.md", "scripts/install.sh"))
            # The reader's part between the steps: the kubeconfig (step 3), the Lease settings (step 4's prose).
            for step, after in zip(steps, ("", "", kubeconfig_step(cluster), env_file_step(metrics_port))):
                docs.run(step, after=after)
            # The systemctl lines cannot run here: the units they name are the ones installed, and systemd's
            # own check passes on them; then what `systemctl enable --now` does.
            units = systemctl_units(docs.blocks)
            assert units == {"netclaim-publisher"}, units
            for unit in units:
                installed = f"/etc/systemd/system/{unit}.service"
                assert node.read(installed) == (CONF / "systemd" / f"{unit}.service").read_text(), installed
                node.sh(f"systemd-analyze verify {installed}")
            publisher = systemctl_enable_now(node, publisher_log)
            wait_until(lambda: node.sh("netclaim-publisher status -o json", check=False).returncode == 0,
                       "the publisher to answer and be ready", timeout=120)
            # A pod of this node with a claim; its sandbox's ADD runs the node's chain.
            cluster.claim(PODS_NAMESPACE, f"{pod}-net")
            cluster.pod(PODS_NAMESPACE, pod, claim=f"{pod}-net")
            cluster.wait_running(PODS_NAMESPACE, pod, timeout=180)
            node.sh(f"ip netns add {netns}")
            sandbox_add(node, cluster, pod, netns)
            wait_until(lambda: entry_of(cluster, f"{pod}-net", subnet_prefix), "the claim's status", timeout=90)
            for block in docs.rest(uninstall, *multi_network):
                docs.run(block, fail_fast=False)
            sandbox_add(node, cluster, pod, netns, verb="del")
            # install.md: the uninstall (its `systemctl disable --now`: the publisher stopped).
            docs.run(uninstall)
            assert terminate(publisher) and publisher.returncode == 0, publisher_log.read_text()[-3000:]
            assert node.read("/etc/cni/net.d/10-podnet.conflist") == primary
            assert node.sh("test -e /opt/cni/bin/netclaim", check=False).returncode == 1
            # multi-network.md, on a node whose runtime reads two network files.
            node.write("/etc/cni/net.d/11-storage.conflist", primary.replace('"podnet"', '"storage"'))
            for block in multi_network:
                docs.run(block)
            # "netclaim goes last into each conflist, each entry with its own request".
            lasts = {name: json.loads(node.read(f"/etc/cni/net.d/{name}"))["plugins"][-1]
                     for name in ("10-podnet.conflist", "11-storage.conflist")}
            assert {n: (e["type"], e.get("request")) for n, e in lasts.items()} == {
                "10-podnet.conflist": ("netclaim", "nic"), "11-storage.conflist": ("netclaim", "nic1")}, lasts
        finally:
            node.sh(f"ip netns del {netns}", check=False)
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)
            cluster.kubectl("delete", "pod", pod, "-n", PODS_NAMESPACE, "--wait=false", check=False)
            cluster.kubectl("delete", "resourceclaim", f"{pod}-net", "-n", PODS_NAMESPACE, "--wait=false", check=False)
            node.sh("cd / && kubectl delete --ignore-not-found -f " + " -f ".join(
                f"{REPO}/conf/kubernetes/{name}" for name in ("15-node-lease.yaml", "10-rbac.yaml")), check=False)
    docs.assert_all_did_what_the_docs_say()
    docs.assert_every_block_ran()
    print("\n".join(["not run here:", *docs.skipped]))
