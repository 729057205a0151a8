"""A release as an operator receives it, installed by digest, and the upgrade from the previous one.

scripts/release.sh VERSION makes the release into a directory of the test's own (the image,
the plugins and helm come from the build caches, keyed by their inputs). Checked on the files
themselves: every artefact is there, SHA256SUMS verifies, the chart's values pin the digest of
the image index in the archive, which holds linux/amd64 and linux/arm64, each SBOM is an SPDX
2.3 document that describes its artefact (name and SHA-256) and lists what it is made of, the
notes are the changelog's section, and a second run writes the same bytes. The build caches are the
user's to write: a cached image archive or plugin changed after its build is refused, naming it, and
no release is written (on a copy of the archive, or of the plugin's entry, in a cache of the test's own).

Then on the real single-node cluster (scripts/cluster.sh), as an operator without a registry:
the archive is imported into the node's containerd (scripts/cluster.sh import-image) and its
index also named by its digest, as a pull by digest names it (`ctr images tag`); the packaged
chart is installed with no image value at all; a claimed pod's status is published by that install.

The upgrade: the previous release (0.1.0) is built from git history by its own
scripts/build-image.sh and installed with its own chart; claimed pods start and get their
status; `helm upgrade` to this release's chart (by digest) with the pods running. The old pods'
entries stay as they were all along (watched during the upgrade: never cleared, never doubled),
the journal is the same file, migrated, and the new publisher reports those claims published;
a pod started during the roll gets its entry, and deleting an old pod retires its entry. Then
`helm rollback` to the previous release and `helm upgrade` to this one again, each with pods running
and one started during the roll. After each roll no container of the DaemonSet's pod has restarted
(no crash loop on a journal another release wrote), every running claimed pod's entry shows its live
sandbox (containerID and the netns's addresses and MAC) on the first look 10 s after the rollout
is done, a claim allocated to another node (its entry written by another field manager) keeps its
status and managedFields byte for byte, and after the second upgrade the publisher has posted a
Warning Event `RolledBack` (the previous release wrote into its journal meanwhile).

NETCLAIM_RELEASE_CLUSTER_DIR picks the cluster dir (default: nc-cl-release in the temp dir);
NETCLAIM_CLUSTER_KEEP=1 leaves it up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import cni_plugin
from publisher.journal.schema import SCHEMA_VERSION
from chartlib import helm, render
from deploylib import REPO, Looker, netclaim_publisher_bin, python_env
from test_daemonset_cluster import NAMESPACE, RELEASE, NodeFiles, daemonset_pod, free_port, uninstall_release

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from runtime.realcluster import ClusterError, RealCluster, ready_status, wait_until  # noqa: E402
from runtime.realcluster import entries_of_any_release as entries_of  # noqa: E402  0.1.0's data has no apiVersion

pytestmark = pytest.mark.containerd

VERSION = cni_plugin.__version__
# The previous release: its commit (tests/plugin/test_wire_rollout.py pins the same one) and version.
PREVIOUS = "0.1.0"
PREVIOUS_COMMIT = "9cdf7f85d28f3af5e9a2499690ae2d730cd5552a"
NAME = f"netclaim-{VERSION}"
ARTEFACTS = {f"{NAME}.oci.tar", f"{NAME}.oci.tar.digest", f"{NAME}.tgz", f"{NAME}-linux-amd64",
             f"{NAME}-linux-arm64", "RELEASE-NOTES.md", "SHA256SUMS", "kubectl-netclaim",
             "netclaim.dev_v1_CNIResult.schema.json"}
SBOM_OF = [f"{NAME}.oci.tar", f"{NAME}.tgz", f"{NAME}-linux-amd64", f"{NAME}-linux-arm64"]
INDEX = "application/vnd.oci.image.index.v1+json"
# What the publisher's venv holds (setup.cfg's install_requires and netclaim itself), by normalised name.
PUBLISHER_DISTRIBUTIONS = {"netclaim", "urllib3", "pyyaml", "click", "prometheus-client"}
SPDX_ID = re.compile(r"^SPDXRef-[A-Za-z0-9.-]+$")


def release_sh(out: Path) -> subprocess.CompletedProcess[str]:
    # --allow-dirty: a developer's tree, or another lane writing into the checkout meanwhile; the
    # refusal itself is tests/deploy/test_version.py's.
    return subprocess.run([str(REPO / "scripts" / "release.sh"), VERSION, "--out", str(out), "--allow-dirty"],
                          capture_output=True, text=True, timeout=3600)


def commit_epoch() -> int:
    return int(subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=60).stdout)


@dataclass
class Release:
    dir: Path
    took: float

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def digest(self) -> str:
        return self.path(f"{NAME}.oci.tar.digest").read_text().strip()

    def sbom(self, artefact: str) -> dict[str, Any]:
        return json.loads(self.path(f"{artefact}.spdx.json").read_text())


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    out = tmp_path_factory.mktemp("release") / VERSION
    started = time.monotonic()
    proc = release_sh(out)
    took = time.monotonic() - started
    if proc.returncode != 0:
        pytest.fail(f"scripts/release.sh {VERSION} failed ({proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    print(f"scripts/release.sh took {took:.0f} s")
    return Release(out, took)


def archive_index(archive: Path) -> tuple[str, dict[str, Any]]:
    """The digest of the one image index the archive names, and that index (checked against its digest)."""
    with tarfile.open(archive) as tar:
        [top] = json.loads(tar.extractfile("./index.json").read())["manifests"]  # type: ignore[union-attr]
        assert top["mediaType"] == INDEX, top
        blob = tar.extractfile("./blobs/sha256/" + top["digest"].split(":", 1)[1]).read()  # type: ignore[union-attr]
    assert "sha256:" + hashlib.sha256(blob).hexdigest() == top["digest"]
    return top["digest"], json.loads(blob)


def chart_file(tgz: Path, name: str) -> str:
    with tarfile.open(tgz) as tar:
        return tar.extractfile(f"netclaim/{name}").read().decode()  # type: ignore[union-attr]


# ---------------------------------------------------------------- the artefacts


def test_every_artefact_is_there_and_sha256sums_verifies(release: Release) -> None:
    names = {p.name for p in release.dir.iterdir()}
    assert names == ARTEFACTS | {f"{a}.spdx.json" for a in SBOM_OF}, sorted(names)
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=release.dir, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {line.split(None, 1)[1].lstrip("*") for line in release.path("SHA256SUMS").read_text().splitlines()}
    assert listed == names - {"SHA256SUMS"}
    # Reproducible metadata: the commit's time on every file, executables only where they belong.
    epoch = commit_epoch()
    for path in release.dir.iterdir():
        assert int(path.stat().st_mtime) == epoch, path.name
        executable = path.name in (f"{NAME}-linux-amd64", f"{NAME}-linux-arm64")
        assert path.stat().st_mode & 0o777 == (0o755 if executable else 0o644), path.name


def test_the_chart_pins_the_archives_index_and_the_index_has_both_platforms(release: Release) -> None:
    digest, index = archive_index(release.path(f"{NAME}.oci.tar"))
    assert release.digest == digest
    assert sorted((m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]) == [
        ("linux", "amd64"), ("linux", "arm64")]
    tgz = release.path(f"{NAME}.tgz")
    meta = yaml.safe_load(chart_file(tgz, "Chart.yaml"))
    assert (meta["name"], meta["version"], meta["appVersion"]) == ("netclaim", VERSION, VERSION)
    assert yaml.safe_load(chart_file(tgz, "values.yaml"))["image"]["digest"] == digest
    # Rendered with no image value: every container runs the pinned index.
    docs = render(chart=tgz)
    images = {c["image"] for d in docs if d["kind"] == "DaemonSet"
              for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"]["initContainers"]}
    assert images == {f"netclaim@{digest}"}
    # The archive's entries carry the commit's time, not the time of packaging.
    with tarfile.open(tgz) as tar:
        assert {m.mtime for m in tar.getmembers()} == {commit_epoch()}


def spdx_document(doc: dict[str, Any], artefact: Path) -> dict[str, dict[str, Any]]:
    """Checks an SPDX 2.3 JSON document describing `artefact`; its packages by SPDXID."""
    for key in ("spdxVersion", "dataLicense", "SPDXID", "name", "documentNamespace", "creationInfo", "packages",
                "relationships"):
        assert key in doc, f"{artefact.name}: SPDX field {key} missing"
    assert (doc["spdxVersion"], doc["dataLicense"], doc["SPDXID"]) == ("SPDX-2.3", "CC0-1.0", "SPDXRef-DOCUMENT")
    assert doc["name"] == artefact.name
    assert re.match(r"^https?://\S+$", doc["documentNamespace"]) and "#" not in doc["documentNamespace"]
    created = doc["creationInfo"]["created"]
    assert created == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(commit_epoch())), created
    assert doc["creationInfo"]["creators"] and all(re.match(r"^(Tool|Organization|Person): \S", c)
                                                   for c in doc["creationInfo"]["creators"])
    packages: dict[str, dict[str, Any]] = {}
    for pkg in doc["packages"]:
        assert SPDX_ID.match(pkg["SPDXID"]), pkg["SPDXID"]
        assert pkg["SPDXID"] not in packages, f"{pkg['SPDXID']} twice"
        for key in ("name", "downloadLocation", "licenseConcluded", "licenseDeclared", "copyrightText"):
            assert pkg.get(key), f"{artefact.name}: {pkg['SPDXID']} has no {key}"
        assert pkg.get("versionInfo"), f"{pkg['SPDXID']} has no version"
        for ref in pkg.get("externalRefs", []):
            assert ref["referenceType"] == "purl" and ref["referenceLocator"].startswith("pkg:"), ref
        packages[pkg["SPDXID"]] = pkg
    for rel in doc["relationships"]:
        for end in (rel["spdxElementId"], rel["relatedSpdxElement"]):
            assert end == "SPDXRef-DOCUMENT" or end in packages, f"{artefact.name}: relationship to unknown {end}"
    [described] = [r["relatedSpdxElement"] for r in doc["relationships"]
                   if r["spdxElementId"] == "SPDXRef-DOCUMENT" and r["relationshipType"] == "DESCRIBES"]
    root = packages[described]
    assert root["name"] == artefact.name and root["versionInfo"] == VERSION
    assert root["checksums"] == [{"algorithm": "SHA256",
                                  "checksumValue": hashlib.sha256(artefact.read_bytes()).hexdigest()}]
    return packages


def contained(doc: dict[str, Any], parent: str) -> list[str]:
    return [r["relatedSpdxElement"] for r in doc["relationships"]
            if r["spdxElementId"] == parent and r["relationshipType"] in ("CONTAINS", "STATIC_LINK")]


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_each_sbom_is_spdx_that_names_its_artefact_and_what_it_holds(release: Release) -> None:
    # The image: per platform, the Debian packages (Python 3.11 among them) and the publisher's distributions.
    doc = release.sbom(f"{NAME}.oci.tar")
    packages = spdx_document(doc, release.path(f"{NAME}.oci.tar"))
    [index] = [p for p in packages.values()
               if p["name"] == "netclaim" and p.get("primaryPackagePurpose") == "CONTAINER"]
    assert "sha256:" + index["checksums"][0]["checksumValue"] == release.digest
    platforms = {packages[p]["name"]: p for p in contained(doc, index["SPDXID"])}
    assert sorted(platforms) == ["netclaim linux/amd64", "netclaim linux/arm64"]
    for plat, plat_id in platforms.items():
        inside = [packages[p] for p in contained(doc, plat_id)]
        debs = {p["name"]: p for p in inside
                if p.get("externalRefs", [{}])[0].get("referenceLocator", "").startswith("pkg:deb/")}
        assert {"python3.11-minimal", "libpython3.11-stdlib", "libc6"} <= set(debs), (plat, sorted(debs))
        assert debs["python3.11-minimal"]["versionInfo"].startswith("3.11."), debs["python3.11-minimal"]
        dists = {normal(p["name"]): p for p in inside if "/venv" in p.get("comment", "")}
        assert PUBLISHER_DISTRIBUTIONS <= set(dists), (plat, sorted(dists))
        assert dists["netclaim"]["versionInfo"] == VERSION
        arch = plat.rsplit("/", 1)[1]
        assert all(f"arch={arch}" in p["externalRefs"][0]["referenceLocator"]
                   or "arch=all" in p["externalRefs"][0]["referenceLocator"] for p in debs.values()), plat
        [plugin] = [p for p in inside if p["name"] == "netclaim CNI plugin"]
        plugin_file = release.path(f"{NAME}-linux-{arch}")
        assert plugin["checksums"][0]["checksumValue"] == hashlib.sha256(plugin_file.read_bytes()).hexdigest()

    # Each plugin: the frozen modules, the Python they come from and the static libraries.
    for arch in ("amd64", "arm64"):
        artefact = release.path(f"{NAME}-linux-{arch}")
        doc = release.sbom(artefact.name)
        packages = spdx_document(doc, artefact)
        by_name = {p["name"]: p for p in packages.values()}
        assert by_name["python3.11"]["versionInfo"].startswith("3.11."), by_name["python3.11"]
        assert "json" in by_name["python3.11"]["comment"].split()
        assert "cni_plugin.main" in by_name["netclaim"]["comment"].split()
        assert {"libpython3.11-dev"} <= set(by_name), sorted(by_name)
        assert any(n.startswith("libc6-dev") for n in by_name), sorted(by_name)

    # The chart: itself, and the image it pins.
    artefact = release.path(f"{NAME}.tgz")
    doc = release.sbom(artefact.name)
    packages = spdx_document(doc, artefact)
    [(root, image)] = [(r["spdxElementId"], r["relatedSpdxElement"]) for r in doc["relationships"]
                       if r["relationshipType"] == "DEPENDS_ON"]
    assert packages[root]["name"] == artefact.name
    assert "sha256:" + packages[image]["checksums"][0]["checksumValue"] == release.digest
    assert release.digest.replace(":", "%3A") in packages[image]["externalRefs"][0]["referenceLocator"]


def test_the_notes_are_the_changelogs_section(release: Release) -> None:
    notes = release.path("RELEASE-NOTES.md").read_text()
    changelog = (REPO / "docs" / "CHANGELOG.md").read_text()
    section = re.search(rf"^## \[{re.escape(VERSION)}\] - (\S+)\n(.*?)(?=^## \[|^\[[^\]]+\]: )", changelog,
                        re.M | re.S)
    assert section, f"docs/CHANGELOG.md has no section for {VERSION}"
    assert notes.startswith(f"# netclaim {VERSION} ({section.group(1)})\n")
    assert section.group(2).strip() in notes
    assert release.digest in notes
    assert f"## [{PREVIOUS}]" not in notes


def test_a_second_run_reuses_the_builds_and_writes_the_same_bytes(release: Release,
                                                                  tmp_path: Path) -> None:
    started = time.monotonic()
    proc = release_sh(tmp_path / VERSION)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"first run {release.took:.0f} s, second run {took:.0f} s")
    assert "cached:" in proc.stderr, "the image was built again although its inputs did not change"
    try:
        assert (tmp_path / VERSION / "SHA256SUMS").read_bytes() == release.path("SHA256SUMS").read_bytes()
    finally:
        shutil.rmtree(tmp_path / VERSION, ignore_errors=True)  # another image archive's worth of disk


def test_a_cached_image_changed_after_its_build_is_refused_and_nothing_is_released(tmp_path: Path) -> None:
    build = [str(REPO / "scripts" / "build-image.sh"), "--multi-arch", "--tag", VERSION]
    proc = subprocess.run(build, capture_output=True, text=True, timeout=3600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    archive = Path(proc.stdout.strip().splitlines()[-1])
    # A copy of the archive and what its build left beside it, in an image cache of the test's own;
    # the plugins and helm come from the usual caches, untouched.
    cache = tmp_path / "image-cache"
    cache.mkdir()
    for path in archive.parent.glob(f"{archive.name}*"):
        shutil.copy2(path, cache / path.name)
    copy = cache / archive.name
    env = dict(os.environ, NETCLAIM_IMAGE_CACHE=str(cache))
    try:
        # Control: the copy as built is reused, not built again.
        reused = subprocess.run(build, capture_output=True, text=True, timeout=3600, env=env, check=False)
        assert reused.returncode == 0, reused.stderr[-4000:]
        assert f"cached: {copy}" in reused.stderr and reused.stdout.strip().splitlines()[-1] == str(copy)

        with open(copy, "r+b") as fh:  # its last byte changed, as a writer of the cache could
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([last[0] ^ 0x01]))
        out = tmp_path / "release" / VERSION
        proc = subprocess.run([str(REPO / "scripts" / "release.sh"), VERSION, "--out", str(out), "--allow-dirty"],
                              capture_output=True, text=True, timeout=3600, env=env, check=False)
        assert proc.returncode != 0, f"a changed cached image was released:\n{proc.stderr[-4000:]}"
        assert f"cached image {copy} does not match the digest recorded when it was built" in proc.stderr, \
            proc.stderr[-4000:]
        assert f"remove {copy} to rebuild" in proc.stderr
        assert not out.exists() and list(out.parent.iterdir()) == [], "something was written for the release"
    finally:
        copy.unlink(missing_ok=True)  # an image archive's worth of disk


def test_a_cached_plugin_changed_after_its_build_is_refused_and_nothing_is_released(tmp_path: Path) -> None:
    proc = subprocess.run([str(REPO / "scripts" / "build-plugin.sh")], capture_output=True, text=True, timeout=1800,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    entry = Path(proc.stdout.strip().splitlines()[-1]).parent
    helm_bin = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), "helm"], capture_output=True,
                              text=True, timeout=1800, check=True).stdout.strip().splitlines()[-1]
    # A cache of the test's own holding a copy of the x86_64 plugin's entry, its executable's last byte
    # changed; the image's caches are empty and offline, so nothing else is built or fetched.
    cache = tmp_path / "cache"
    copy = cache / "netclaim" / "plugin" / entry.name
    shutil.copytree(entry, copy)
    data = bytearray((copy / "netclaim").read_bytes())
    data[-1] ^= 0x01
    (copy / "netclaim").write_bytes(bytes(data))
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), HELM=helm_bin, NETCLAIM_OFFLINE="1",
               NETCLAIM_IMAGE_CACHE=str(tmp_path / "image-cache"), NETCLAIM_PACKAGE_STORE=str(tmp_path / "store"))
    out = tmp_path / "release" / VERSION
    proc = subprocess.run([str(REPO / "scripts" / "release.sh"), VERSION, "--out", str(out), "--allow-dirty"],
                          capture_output=True, text=True, timeout=3600, env=env, check=False)
    assert proc.returncode != 0, proc.stderr[-4000:]
    assert f"cached plugin {copy / 'netclaim'} does not match the digest recorded when it was built" in proc.stderr, \
        proc.stderr[-4000:]
    assert not out.exists() and list(out.parent.iterdir()) == [], "something was written for the release"


# ---------------------------------------------------------------- on the real cluster


@pytest.fixture(scope="module")
def cluster(release_cluster: RealCluster) -> RealCluster:
    """The cluster this module shares with test_release_registry.py (tests/deploy/conftest.py)."""
    return release_cluster


def ctr(cluster: RealCluster, *args: str, timeout: int = 900) -> str:
    proc = subprocess.run([cluster.values["NETCLAIM_CTR"], "--address", cluster.values["NETCLAIM_CONTAINERD_ADDRESS"],
                           "-n", "k8s.io", *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"ctr {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


def import_by_digest(cluster: RealCluster, archive: Path, digest: str) -> None:
    """What a node without a registry needs to run the chart's netclaim@sha256:...: the archive imported
    into containerd's k8s.io namespace (scripts/cluster.sh import-image: every platform), then the index
    also named by its digest, docker.io/library/netclaim@<digest>, the name a pull by digest leaves (the
    runtime resolves an image reference only against the names it holds; `ctr images import --digests`
    names the archive's own top-level index instead, another digest)."""
    cluster.sh("import-image", str(archive), timeout=900)
    ctr(cluster, "images", "tag", "--force", f"docker.io/library/netclaim:{VERSION}",
        f"docker.io/library/netclaim@{digest}")
    rows = {line.split()[0]: line.split()[2] for line in ctr(cluster, "images", "ls").splitlines()[1:] if line.strip()}
    assert rows.get(f"docker.io/library/netclaim@{digest}") == digest, rows


def site_values(files: NodeFiles, cluster: RealCluster, ports: dict[str, int], release: str) -> list[str]:
    """What this node needs of either chart (its CNI dirs, host paths, ports, API server): no image value."""
    sets = {"driverName": cluster.driver, "cni.confDir": str(files.conf), "cni.binDir": str(files.bin),
            "hostPaths.run": str(files.run), "hostPaths.state": str(files.state), "priorityClassName": "",
            "metrics.port": str(ports["metrics"]), "metrics.keeperPort": str(ports["keeper"]),
            # No kube-proxy here: the API server as the node sees it.
            "apiServer.host": "127.0.0.1"}
    if release != PREVIOUS:  # the probe listeners came after 0.1.0 (whose chart refuses keys it does not know)
        sets.update({"metrics.probePort": str(ports["probe"]), "metrics.keeperProbePort": str(ports["keeperProbe"])})
        # This kernel has no AppArmor: the kubelet refuses a pod that asks for a profile.
        sets["liveWatch.openerAppArmorProfile"] = ""
    out = []
    for key, value in sets.items():
        out += ["--set", f"{key}={value}"]
    out += ["--set-string", "cni.pollInterval=0.5",
            "--set-string", f"apiServer.port={cluster.values['NETCLAIM_APISERVER'].rsplit(':', 1)[1]}"]
    return out


def ports() -> dict[str, int]:
    return {name: free_port() for name in ("metrics", "keeper", "probe", "keeperProbe")}


def start_claimed_pod(cluster: RealCluster, ns: str, name: str) -> None:
    cluster.claim(ns, f"{name}-net")
    cluster.pod(ns, name, claim=f"{name}-net")


def a_claimed_pod_is_published(cluster: RealCluster, files: NodeFiles, ns: str) -> None:
    """Once the install has chained the node, a claimed pod started on it gets the entry of its sandbox's eth0."""
    wait_until(lambda: files.chained(files.conflist), "netclaim chained into the primary conflist")
    start_claimed_pod(cluster, ns, "a")
    entry = published(cluster, ns, "a")
    assert entry["networkData"]["interfaceName"] == "eth0"
    assert entry["data"]["containerID"] == cluster.sandbox(ns, "a")["id"]


def remove_install(cluster: RealCluster, ns: str) -> None:
    """The pod of a_claimed_pod_is_published, the release and the namespace go, for the next install on the cluster."""
    cluster.kubectl("delete", "pod", "a", "-n", ns, "--wait=true", "--timeout=120s", check=False, timeout=180)
    uninstall_release(cluster, cluster.kubeconfig, 3000)
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def published(cluster: RealCluster, ns: str, name: str) -> dict[str, Any]:
    """The pod's one Ready entry with addresses, once it is there."""
    cluster.wait_running(ns, name, timeout=180)

    def entry() -> dict[str, Any] | None:
        mine = entries_of(cluster.claim_yaml(ns, f"{name}-net"), cluster.driver)
        ok = [e for e in mine if ready_status(e) == "True" and (e.get("networkData") or {}).get("ips")]
        return ok[0] if len(mine) == 1 and ok else None

    return wait_until(entry, f"the status of {ns}/{name}-net", timeout=90)


def running_image(cluster: RealCluster) -> tuple[str, set[str]]:
    """The DaemonSet pod's uid and its containers' images, once it runs."""
    pod = wait_until(lambda: (lambda p: p if p and p["status"].get("phase") == "Running" else None)(
        daemonset_pod(cluster)), "the DaemonSet's pod to run", timeout=180)
    spec = pod["spec"]
    return pod["metadata"]["uid"], {c["image"] for c in spec["containers"] + spec["initContainers"]}


def test_the_released_chart_installs_by_digest_and_publishes(release: Release, cluster: RealCluster) -> None:
    files = NodeFiles(cluster)
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    digest = release.digest
    import_by_digest(cluster, release.path(f"{NAME}.oci.tar"), digest)
    ns = cluster.namespace(f"rel-{uuid.uuid4().hex[:6]}")
    try:
        helm("install", RELEASE, str(release.path(f"{NAME}.tgz")), "-n", NAMESPACE, "--create-namespace",
             *site_values(files, cluster, ports(), VERSION), "--wait", "--timeout", "300s",
             kubeconfig=cluster.kubeconfig, timeout=400)
        _uid, images = running_image(cluster)
        assert images == {f"netclaim@{digest}"}
        a_claimed_pod_is_published(cluster, files, ns)
    finally:
        remove_install(cluster, ns)


# ---------------------------------------------------------------- the upgrade from the previous release


@dataclass
class Previous:
    tree: Path
    archive: Path

    @property
    def chart(self) -> Path:
        return self.tree / "conf" / "helm" / "netclaim"


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Previous:
    """The previous release's tree from git history, and its image built by its own scripts/build-image.sh."""
    git = ["git", "-C", str(REPO)]
    if subprocess.run([*git, "cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}"], timeout=60).returncode != 0:
        pytest.fail(f"{PREVIOUS}'s commit {PREVIOUS_COMMIT} is not in this checkout's history: this test needs a "
                    "full clone (git fetch --unshallow)", pytrace=False)
    tree = tmp_path_factory.mktemp(f"netclaim-{PREVIOUS}")
    archive = subprocess.run([*git, "archive", "--format=tar", PREVIOUS_COMMIT], capture_output=True, timeout=300,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True, timeout=300)
    version = re.search(r'^__version__ = "([^"]+)"$', (tree / "cni_plugin" / "__init__.py").read_text(), re.M)
    assert version and version.group(1) == PREVIOUS, f"{PREVIOUS_COMMIT} is not {PREVIOUS}"
    proc = subprocess.run([str(tree / "scripts" / "build-image.sh")], capture_output=True, text=True, timeout=3600,
                          cwd=tree)
    if proc.returncode != 0:
        pytest.fail(f"{PREVIOUS}'s own scripts/build-image.sh failed on this machine ({proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}", pytrace=False)
    return Previous(tree, Path(proc.stdout.strip().splitlines()[-1]))


class EntryWatch(Looker):
    """Reads the claims every half second while the release changes under them: is an entry ever gone,
    doubled, or different from what it was before the upgrade?"""

    every = 0.5

    def __init__(self, cluster: RealCluster, ns: str, before: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.cluster, self.ns, self.before = cluster, ns, before
        self.lapses: list[str] = []
        self.reads = 0

    def look(self) -> None:
        for name, entry in self.before.items():
            try:
                now = entries_of(self.cluster.claim_yaml(self.ns, f"{name}-net"), self.cluster.driver)
            except Exception as exc:  # an API hiccup is no lapse of the entry
                print(f"claim read failed: {exc}")
                continue
            self.reads += 1
            if len(now) != 1:
                self.lapses.append(f"{name}: {len(now)} entries")
            elif (now[0]["networkData"] != entry["networkData"] or ready_status(now[0]) != "True"
                  or now[0]["data"]["containerID"] != entry["data"]["containerID"]):
                self.lapses.append(f"{name}: entry changed to {now[0]}")


def publisher_status(files: NodeFiles) -> dict[str, Any]:
    proc = subprocess.run([str(netclaim_publisher_bin()), "status", "--socket", str(files.run / "publisher.sock"),
                           "-o", "json"], capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def journal_facts(path: Path) -> tuple[int, set[str], set[tuple[str, str]]]:
    """Schema version, the attachments table's columns and its claims, read-only."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        columns = {row[1] for row in db.execute("PRAGMA table_info(attachments)")}
        claims = {(ns, name) for ns, name in db.execute("SELECT claim_namespace, claim_name FROM attachments")}
    finally:
        db.close()
    return version, columns, claims


ELSEWHERE = "netclaim-elsewhere"  # a node name no node has: a claim allocated there is another node's
GRACE = 10.0  # seconds after a roll is done within which every entry shows its pod's live sandbox


def daemonset_name(cluster: RealCluster) -> str:
    [name] = cluster.kubectl("get", "daemonset", "-n", NAMESPACE, "-o", "name").split()
    return name


def roll_done(cluster: RealCluster, images: set[str], old_uid: str) -> tuple[str, float]:
    """Waits (generously) for the DaemonSet's rollout to end in one new pod running `images`, Ready, with no
    container restarted (a publisher that crash-loops on the journal another release wrote shows here);
    its uid and the monotonic time the rollout was seen done."""
    cluster.kubectl("rollout", "status", daemonset_name(cluster), "-n", NAMESPACE, "--timeout=300s", timeout=330)
    done = time.monotonic()

    def rolled() -> str | None:
        pod = daemonset_pod(cluster)
        fresh = pod and pod["metadata"]["uid"] != old_uid and ready_status(pod["status"]) == "True"
        return pod["metadata"]["uid"] if fresh else None

    uid = wait_until(rolled, "the rolled DaemonSet pod Ready", timeout=180)
    assert_no_restart(cluster, uid, images)
    return uid, done


def assert_no_restart(cluster: RealCluster, uid: str, images: set[str]) -> None:
    pod = daemonset_pod(cluster)
    assert pod and pod["metadata"]["uid"] == uid, "the DaemonSet's pod was replaced"
    spec, status = pod["spec"], pod["status"]
    assert {c["image"] for c in spec["containers"] + spec["initContainers"]} == images
    restarts = {c["name"]: c.get("restartCount", 0)
                for c in status.get("containerStatuses", []) + status.get("initContainerStatuses", [])}
    assert set(restarts.values()) == {0}, f"DaemonSet containers restarted: {restarts}"
    assert ready_status(status) == "True", status.get("conditions")


def live_sandbox_problem(cluster: RealCluster, ns: str, pods: list[str]) -> str:
    """'' when each pod's one entry is Ready and shows its live sandbox: data.containerID is the pod's ready
    sandbox and networkData is what the pod's netns holds on that interface; else what differs."""
    for name in pods:
        mine = entries_of(cluster.claim_yaml(ns, f"{name}-net"), cluster.driver)
        if len(mine) != 1:
            return f"{name}: {len(mine)} entries"
        entry, sandbox = mine[0], cluster.sandbox(ns, name)["id"]
        if ready_status(entry) != "True" or entry["data"]["containerID"] != sandbox:
            return f"{name}: entry {entry} is not the Ready entry of sandbox {sandbox}"
        net = entry["networkData"]
        iface = cluster.interface(ns, name, net["interfaceName"])
        if sorted(net.get("ips") or []) != sorted(iface.cidrs) or net.get("hardwareAddress", "").lower() != iface.mac:
            return f"{name}: networkData {net} but the pod's netns has {iface}"
    return ""


def live_within_grace(cluster: RealCluster, ns: str, pods: list[str], started: str, done: float) -> float:
    """Once pod `started` (started during the roll) runs, looks until every entry shows its pod's live
    sandbox; the first look GRACE seconds after the roll was done (or after `started` ran, if later) must
    pass. The delay from the roll done to the look that passed."""
    cluster.wait_running(ns, started, timeout=180)
    since = max(done, time.monotonic())
    pods.append(started)
    while True:
        looked = time.monotonic()
        try:
            problem = live_sandbox_problem(cluster, ns, pods)
        except (ClusterError, subprocess.CalledProcessError, AssertionError, KeyError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if not problem:
            return looked - done
        assert looked - since < GRACE, f"{looked - since:.1f} s after the roll: {problem}"
        time.sleep(0.5)


def claim_elsewhere(cluster: RealCluster, ns: str) -> str:
    """A claim allocated to another node, whose entry another field manager wrote: this node's publisher has
    no business with it. Its status and managedFields, as the API server holds them."""
    cluster.claim(ns, "elsewhere-net")
    result = {"request": "nic", "driver": cluster.driver, "pool": ELSEWHERE, "device": "nic0"}
    allocation = {"status": {"allocation": {
        "devices": {"results": [result]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [ELSEWHERE]}]}]}}}}
    cluster.kubectl("patch", "resourceclaim", "elsewhere-net", "-n", ns, "--subresource=status", "--type=merge",
                    "--field-manager=elsewhere-scheduler", "-p", json.dumps(allocation))
    entry = {k: result[k] for k in ("driver", "pool", "device")}
    entry["networkData"] = {"interfaceName": "eth0", "ips": ["10.250.0.9/24"], "hardwareAddress": "0a:58:0a:fa:00:09"}
    entry["conditions"] = [{"type": "Ready", "status": "True", "reason": "NetworkConfigured", "message": "eth0",
                            "lastTransitionTime": "2026-12-01T00:00:00Z"}]
    cluster.kubectl("patch", "resourceclaim", "elsewhere-net", "-n", ns, "--subresource=status", "--type=merge",
                    "--field-manager=elsewhere-driver", "-p", json.dumps({"status": {"devices": [entry]}}))
    return elsewhere_now(cluster, ns)


def elsewhere_now(cluster: RealCluster, ns: str) -> str:
    claim = json.loads(cluster.kubectl("get", "resourceclaim", "elsewhere-net", "-n", ns, "-o", "json",
                                       "--show-managed-fields"))
    return json.dumps({"status": claim["status"], "managedFields": claim["metadata"]["managedFields"]},
                      sort_keys=True)


def rolled_back_warnings(cluster: RealCluster) -> list[dict[str, Any]]:
    events = json.loads(cluster.kubectl("get", "events", "-A", "-o", "json"))["items"]
    return [e for e in events if e.get("reason") == "RolledBack" and e.get("type") == "Warning"]


def test_upgrade_from_the_previous_release_with_pods_running(release: Release, previous: Previous,
                                                             cluster: RealCluster) -> None:
    files = NodeFiles(cluster)
    before_install = files.snapshot()
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    cluster.sh("import-image", str(previous.archive), timeout=900)
    import_by_digest(cluster, release.path(f"{NAME}.oci.tar"), release.digest)
    node_ports = ports()
    ns = cluster.namespace(f"upg-{uuid.uuid4().hex[:6]}")
    pods = ["a", "b"]
    old_images, new_images = {f"netclaim:{PREVIOUS}"}, {f"netclaim@{release.digest}"}
    delays: dict[str, float] = {}
    try:
        # The previous release, installed as it was: its own chart and image.
        helm("install", RELEASE, str(previous.chart), "-n", NAMESPACE, "--create-namespace",
             *site_values(files, cluster, node_ports, PREVIOUS), "--set", "image.pullPolicy=Never",
             "--wait", "--timeout", "300s", kubeconfig=cluster.kubeconfig, timeout=400)
        old_uid, images = running_image(cluster)
        assert images == old_images
        wait_until(lambda: files.chained(files.conflist), "netclaim chained by the previous release")
        elsewhere = claim_elsewhere(cluster, ns)
        for name in pods:
            start_claimed_pod(cluster, ns, name)
        before = {name: published(cluster, ns, name) for name in pods}
        journal = files.state / "publisher" / "journal.db"
        inode = journal.stat().st_ino
        old_version, old_columns, _ = journal_facts(journal)
        assert "device_id" not in old_columns and old_version < SCHEMA_VERSION, (old_version, old_columns)

        # This release's chart, by digest, with the pods running and pod c started during the roll.
        with EntryWatch(cluster, ns, before) as watch:
            helm("upgrade", RELEASE, str(release.path(f"{NAME}.tgz")), "-n", NAMESPACE,
                 *site_values(files, cluster, node_ports, VERSION), kubeconfig=cluster.kubeconfig, timeout=400)
            start_claimed_pod(cluster, ns, "c")
            new_uid, done = roll_done(cluster, new_images, old_uid)
            # The new publisher took over the journal: same file, migrated, every claim of the old pods in it.
            status = wait_until(lambda: (lambda s: s if all(s["claims"].get(f"{ns}/{n}-net", {}).get("state")
                                                            == "published" for n in pods) else None)(
                publisher_status(files)), "the new publisher to report the old pods' claims published", timeout=60)
            assert status["attachments"] >= len(pods), status
        print(f"claims read {watch.reads} times during the upgrade")
        assert watch.reads > 0
        assert watch.lapses == [], watch.lapses[:10]
        delays["upgrade"] = live_within_grace(cluster, ns, pods, "c", done)
        assert journal.stat().st_ino == inode, "the journal was replaced, not migrated"
        version, columns, claims = journal_facts(journal)
        assert version == SCHEMA_VERSION and "device_id" in columns, (version, columns)
        assert {(ns, f"{n}-net") for n in pods} <= claims
        for name in ("a", "b"):
            [entry] = entries_of(cluster.claim_yaml(ns, f"{name}-net"), cluster.driver)
            assert entry["networkData"] == before[name]["networkData"]
            assert entry["data"]["containerID"] == before[name]["data"]["containerID"]

        # After the upgrade: an old pod's deletion retires its entry.
        cluster.delete_pod(ns, "a")
        pods.remove("a")
        wait_until(lambda: entries_of(cluster.claim_yaml(ns, "a-net"), cluster.driver) == [],
                   "the deleted old pod's entry to be retired", timeout=90)
        [entry] = entries_of(cluster.claim_yaml(ns, "b-net"), cluster.driver)
        assert entry["networkData"] == before["b"]["networkData"]
        assert (ns, "a-net") not in journal_facts(journal)[2]

        # `helm rollback` to the previous release, with pods running and pod r started during the roll: its
        # publisher opens the journal this release migrated and wrote.
        helm("rollback", RELEASE, "1", "-n", NAMESPACE, kubeconfig=cluster.kubeconfig, timeout=400)
        start_claimed_pod(cluster, ns, "r")
        back_uid, done = roll_done(cluster, old_images, new_uid)
        delays["rollback"] = live_within_grace(cluster, ns, pods, "r", done)
        assert_no_restart(cluster, back_uid, old_images)

        # This release again, with pods running and pod u started during the roll: it finds the rows the
        # previous release wrote into its journal.
        helm("upgrade", RELEASE, str(release.path(f"{NAME}.tgz")), "-n", NAMESPACE,
             *site_values(files, cluster, node_ports, VERSION), kubeconfig=cluster.kubeconfig, timeout=400)
        start_claimed_pod(cluster, ns, "u")
        again_uid, done = roll_done(cluster, new_images, back_uid)
        delays["upgrade again"] = live_within_grace(cluster, ns, pods, "u", done)
        assert_no_restart(cluster, again_uid, new_images)
        print("entries live after each roll: " + ", ".join(f"{k} {v:.1f} s" for k, v in delays.items()))
        assert journal.stat().st_ino == inode, "the journal was replaced"

        assert elsewhere_now(cluster, ns) == elsewhere, "another node's claim was written"
        warnings = wait_until(lambda: rolled_back_warnings(cluster), "a Warning Event with reason RolledBack",
                              timeout=120)
        print(f"RolledBack: {warnings[0].get('message')}")
    finally:
        for name in ("a", "b", "c", "r", "u"):
            cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=true", "--timeout=120s", check=False,
                            timeout=180)
        keeper_said = uninstall_release(cluster, cluster.kubeconfig, 3000)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    assert files.snapshot() == before_install, keeper_said
