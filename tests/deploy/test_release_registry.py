"""A release pushed to a registry, signed and attested, as an operator pulls and verifies it.

A real OCI distribution registry (scripts/build/components.sh registry) listens on 127.0.0.1 with a
storage dir of the test's own; `scripts/release.sh VERSION --push 127.0.0.1:PORT --sign-key KEY`
(a key pair made by `cosign generate-key-pair`) pushes into it. Then, as an operator would check:
the registry serves the image index by the digest the release names and both platform manifests
(with their configs and layers); `helm pull oci://.../charts/netclaim --plain-http` gets the
release's chart archive byte for byte; `cosign verify --key cosign.pub` passes for the image and the
chart digests; `cosign verify-attestation --type spdxjson` gives the release's SBOMs, and
`--type slsaprovenance` a statement naming the commit and the image's lock files. A tag moved to
another manifest, and a key that did not sign, each make cosign exit non-zero, saying why.

Then, on the real cluster the release tests share (tests/deploy/conftest.py `release_cluster`), the
release is installed from the registry as docs/install.md says, pinned by digest: `helm install
oci://REGISTRY/charts/netclaim@sha256:... --plain-http --set image.registry=REGISTRY`. The node's
containerd first forgets every netclaim image (test_release.py imported the release's archive), so
the DaemonSet's pod can only run what the node pulls from the registry: the index, the node platform's
manifest, config and layers come back into its content store, its containers report the image by the
registry's name and digest, and a claimed pod's status is published by that install.

Key signing here is offline (nothing goes to a transparency log), so verification passes
--insecure-ignore-tlog; a loopback registry speaks plain HTTP (cosign's --allow-http-registry, helm's
--plain-http; the node's containerd falls back to plain HTTP for a loopback host by itself, so the node
needs no registry configuration).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from chartlib import helm
from deploylib import REPO
from test_daemonset_cluster import NAMESPACE, RELEASE, NodeFiles
from test_release import a_claimed_pod_is_published, ctr, ports, remove_install, running_image, site_values

import cni_plugin

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from runtime.realcluster import RealCluster, free_port, wait_until

VERSION = cni_plugin.__version__
NAME = f"netclaim-{VERSION}"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
PASSWORD = "release-test-password"
HTTP = ["--allow-http-registry", "--allow-insecure-registry"]


def built(target: str) -> str:
    """A binary scripts/build/components.sh builds (or finds cached)."""
    proc = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), target], check=False,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"components.sh {target} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry on a free loopback port, storing into a dir of its own: its host:port."""
    binary = built("registry")
    base = tmp_path_factory.mktemp("registry")
    addr = f"127.0.0.1:{free_port()}"
    config = base / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {base}/data\n"
                      f"  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n")
    with open(base / "registry.log", "wb") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    try:
        def up() -> bool:
            assert proc.poll() is None, (base / "registry.log").read_text()[-2000:]
            try:
                return requests.get(f"http://{addr}/v2/", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False
        wait_until(up, "the registry to answer /v2/", timeout=120)
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@dataclass
class Cosign:
    binary: str
    home: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
               "COSIGN_PASSWORD": PASSWORD, "TUF_ROOT": str(self.home / "tuf")}
        return subprocess.run([self.binary, *args], check=False, capture_output=True, text=True, env=env, timeout=600,
                              cwd=self.home)

    def key_pair(self, name: str) -> tuple[Path, Path]:
        """A new key pair (cosign generate-key-pair) under NAME.key and NAME.pub."""
        proc = self.run("generate-key-pair", "--output-key-prefix", name)
        assert proc.returncode == 0, proc.stderr
        return self.home / f"{name}.key", self.home / f"{name}.pub"


@pytest.fixture(scope="module")
def cosign(tmp_path_factory: pytest.TempPathFactory) -> Cosign:
    return Cosign(built("cosign"), tmp_path_factory.mktemp("cosign"))


@dataclass
class Pushed:
    dir: Path
    image: str      # REGISTRY/netclaim@sha256:...
    chart: str      # REGISTRY/charts/netclaim@sha256:...
    public_key: Path

    @property
    def digest(self) -> str:
        return self.dir.joinpath(f"{NAME}.oci.tar.digest").read_text().strip()


@pytest.fixture(scope="module")
def pushed(registry: str, cosign: Cosign, tmp_path_factory: pytest.TempPathFactory) -> Pushed:
    """scripts/release.sh VERSION --push REGISTRY --sign-key KEY into a dir of the test's own."""
    key, pub = cosign.key_pair("release")
    out = tmp_path_factory.mktemp("release") / VERSION
    # --allow-dirty: a developer's tree, or another lane writing into the checkout meanwhile.
    proc = subprocess.run([str(REPO / "scripts" / "release.sh"), VERSION, "--out", str(out), "--allow-dirty",
                           "--push", registry, "--sign-key", str(key)], check=False, capture_output=True, text=True,
                          timeout=3600, env={**os.environ, "COSIGN_PASSWORD": PASSWORD, "COSIGN": cosign.binary})
    if proc.returncode != 0:
        pytest.fail(f"release.sh --push failed ({proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == str(out), proc.stdout
    refs = dict(line.split(" ", 1) for line in lines[:-1] if line.startswith(("image ", "chart ")))
    return Pushed(out, refs["image"], refs["chart"], pub)


def get(url: str, accept: str) -> requests.Response:
    reply = requests.get(url, headers={"Accept": accept}, timeout=60)
    assert reply.status_code == 200, f"GET {url}: {reply.status_code} {reply.text[:300]}"
    return reply


def test_the_registry_serves_the_index_by_digest_and_both_platform_manifests(pushed: Pushed, registry: str) -> None:
    assert pushed.image == f"{registry}/netclaim@{pushed.digest}"
    base = f"http://{registry}/v2/netclaim"
    index = get(f"{base}/manifests/{pushed.digest}", INDEX)
    assert "sha256:" + hashlib.sha256(index.content).hexdigest() == pushed.digest
    assert get(f"{base}/manifests/{VERSION}", INDEX).headers["Docker-Content-Digest"] == pushed.digest
    platforms = set()
    for child in index.json()["manifests"]:
        manifest = get(f"{base}/manifests/{child['digest']}", MANIFEST)
        assert "sha256:" + hashlib.sha256(manifest.content).hexdigest() == child["digest"]
        platforms.add(f"{child['platform']['os']}/{child['platform']['architecture']}")
        for blob in [manifest.json()["config"], *manifest.json()["layers"]]:
            head = requests.head(f"{base}/blobs/{blob['digest']}", timeout=60)
            assert head.status_code == 200 and int(head.headers["Content-Length"]) == blob["size"], blob
    assert platforms == {"linux/amd64", "linux/arm64"}


def test_helm_pull_gets_the_released_chart_byte_for_byte(pushed: Pushed, registry: str, tmp_path: Path) -> None:
    proc = helm("pull", f"oci://{registry}/charts/netclaim", "--version", VERSION, "--plain-http",
                "--destination", str(tmp_path))
    assert pushed.chart.split("@", 1)[1] in proc.stdout + proc.stderr
    assert (tmp_path / f"{NAME}.tgz").read_bytes() == (pushed.dir / f"{NAME}.tgz").read_bytes()


def test_cosign_verify_passes_for_the_image_and_the_chart_digests(pushed: Pushed, cosign: Cosign) -> None:
    for ref in (pushed.image, pushed.chart):
        proc = cosign.run("verify", "--key", str(pushed.public_key), "--insecure-ignore-tlog", *HTTP, ref)
        assert proc.returncode == 0, f"cosign verify {ref}: {proc.stderr}"
        [claim] = json.loads(proc.stdout)   # one signature, on that digest
        assert claim["critical"]["image"]["docker-manifest-digest"] == ref.split("@", 1)[1]


def attested(cosign: Cosign, pushed: Pushed, ref: str, kind: str) -> list[dict[str, Any]]:
    """The in-toto statements of type KIND that verify on REF with the release's key."""
    proc = cosign.run("verify-attestation", "--key", str(pushed.public_key), "--insecure-ignore-tlog", *HTTP,
                      "--type", kind, ref)
    assert proc.returncode == 0, f"cosign verify-attestation --type {kind} {ref}: {proc.stderr}"
    return [json.loads(base64.b64decode(json.loads(line)["payload"]))
            for line in proc.stdout.splitlines() if line.strip()]


def test_the_attested_sboms_and_provenance_are_the_releases(pushed: Pushed, cosign: Cosign) -> None:
    sboms = attested(cosign, pushed, pushed.image, "spdxjson")
    assert {s["subject"][0]["digest"]["sha256"] for s in sboms} == {pushed.digest.split(":", 1)[1]}
    predicates = [s["predicate"] for s in sboms]
    for artefact in (f"{NAME}.oci.tar", f"{NAME}-linux-amd64", f"{NAME}-linux-arm64"):
        assert json.loads((pushed.dir / f"{artefact}.spdx.json").read_text()) in predicates, artefact
    [chart_sbom] = attested(cosign, pushed, pushed.chart, "spdxjson")
    assert chart_sbom["predicate"] == json.loads((pushed.dir / f"{NAME}.tgz.spdx.json").read_text())

    [provenance] = attested(cosign, pushed, pushed.image, "slsaprovenance")
    materials = {m["uri"]: m["digest"] for m in provenance["predicate"]["materials"]}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    assert provenance["predicate"]["invocation"]["configSource"]["digest"] == {"sha1": commit}
    for lock in sorted((REPO / "conf" / "image").glob("*.lock")):
        assert materials[f"conf/image/{lock.name}"] == {"sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}
    assert provenance["predicate"]["builder"]["id"]


def test_another_key_fails_verification_and_says_so(pushed: Pushed, cosign: Cosign) -> None:
    _, other = cosign.key_pair("other")
    for ref in (pushed.image, pushed.chart):
        proc = cosign.run("verify", "--key", str(other), "--insecure-ignore-tlog", *HTTP, ref)
        assert proc.returncode != 0, proc.stdout
        assert "no matching signatures" in proc.stderr, proc.stderr


def test_a_tag_moved_to_another_manifest_fails_verification_and_says_so(pushed: Pushed, registry: str,
                                                                       cosign: Cosign) -> None:
    base = f"http://{registry}/v2/netclaim/manifests"
    tag = f"{registry}/netclaim:{VERSION}"
    assert cosign.run("verify", "--key", str(pushed.public_key), "--insecure-ignore-tlog", *HTTP,
                      tag).returncode == 0, "the tag verifies before it is moved"
    index = get(f"{base}/{pushed.digest}", INDEX)
    arm64 = next(m for m in index.json()["manifests"] if m["platform"]["architecture"] == "arm64")
    other = get(f"{base}/{arm64['digest']}", MANIFEST).content
    try:
        moved = requests.put(f"{base}/{VERSION}", data=other, headers={"Content-Type": MANIFEST}, timeout=60)
        assert moved.status_code == 201, moved.text
        proc = cosign.run("verify", "--key", str(pushed.public_key), "--insecure-ignore-tlog", *HTTP, tag)
        assert proc.returncode != 0, proc.stdout
        assert "no signatures found" in proc.stderr or "no matching signatures" in proc.stderr, proc.stderr
    finally:
        requests.put(f"{base}/{VERSION}", data=index.content, headers={"Content-Type": INDEX}, timeout=60)


# ---------------------------------------------------------------- installed from the registry, on the real cluster


def node_blobs(registry: str, digest: str) -> set[str]:
    """What a node of this machine's platform (linux/amd64) pulls of the index `digest`: the index, the amd64
    manifest, its config and its layers, as the registry lists them."""
    base = f"http://{registry}/v2/netclaim"
    index = get(f"{base}/manifests/{digest}", INDEX).json()
    [amd64] = [m["digest"] for m in index["manifests"] if m["platform"]["architecture"] == "amd64"]
    manifest = get(f"{base}/manifests/{amd64}", MANIFEST).json()
    return {digest, amd64, manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])}


def node_holds(cluster: RealCluster, digest: str, blobs: set[str]) -> tuple[list[str], set[str]]:
    """What the node's containerd (k8s.io) holds of the image index `digest`: the image names that point at
    it, and which of `blobs` are in its content store."""
    names = [row.split()[0] for row in ctr(cluster, "images", "ls").splitlines()[1:]
             if len(row.split()) > 2 and row.split()[2] == digest]
    return names, blobs & set(ctr(cluster, "content", "ls", "-q").split())


def forget_netclaim(cluster: RealCluster) -> None:
    """Removes every netclaim image from the node's containerd (each of its names, the runtime's sha256: ids
    too) and waits for its garbage collection, so that their blobs are gone as well: test_release.py imported
    the release's archive here, and another build of it (a tree changed between the two release runs) shares
    its base layer."""
    rows = [row.split()[:3] for row in ctr(cluster, "images", "ls").splitlines()[1:] if len(row.split()) > 2]
    targets = {digest for name, _, digest in rows if re.search(r"(^|/)netclaim[:@]", name)}
    names = [name for name, _, digest in rows if digest in targets]
    if names:
        ctr(cluster, "images", "rm", "--sync", *names)


def test_installed_from_the_registry_by_digest_the_node_pulls_the_image_and_publishes(
        pushed: Pushed, registry: str, release_cluster: RealCluster) -> None:
    cluster = release_cluster
    files = NodeFiles(cluster)
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    blobs = node_blobs(registry, pushed.digest)
    forget_netclaim(cluster)
    assert node_holds(cluster, pushed.digest, blobs) == ([], set()), "the node still holds the release's image"
    pulled = f"{registry}/netclaim@{pushed.digest}"
    ns = cluster.namespace(f"reg-{uuid.uuid4().hex[:6]}")
    try:
        # As docs/install.md says, pinned by the digest of the chart whose signature a user verified; the pushed
        # chart pins the image's. containerd pulls from a loopback registry in plain HTTP with no configuration.
        proc = helm("install", RELEASE, f"oci://{pushed.chart}", "--plain-http", "-n", NAMESPACE, "--create-namespace",
                    "--set", f"image.registry={registry}", "--set", "request=nic",
                    *site_values(files, cluster, ports(), VERSION), "--wait", "--timeout", "300s",
                    kubeconfig=cluster.kubeconfig, timeout=400)
        assert f"Digest: {pushed.chart.split('@', 1)[1]}" in proc.stdout + proc.stderr, proc.stderr
        _uid, images = running_image(cluster)
        assert images == {pulled}
        # The node pulled it: every blob of its platform is back, the image is named by the registry's reference,
        # and the DaemonSet's containers report that reference as the image they run.
        names, held = node_holds(cluster, pushed.digest, blobs)
        assert pulled in names and held == blobs, (names, blobs - held)
        pod = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=netclaim",
                                         "-o", "json"))["items"][0]
        statuses = pod["status"]["containerStatuses"] + pod["status"]["initContainerStatuses"]
        assert {c["imageID"] for c in statuses} == {pulled}, statuses
        repo_digests = {d for image in json.loads(cluster.crictl("images", "--digests", "-o", "json"))["images"]
                        for d in image.get("repoDigests") or []}
        assert pulled in repo_digests, sorted(repo_digests)

        a_claimed_pod_is_published(cluster, files, ns)
    finally:
        remove_install(cluster, ns)
