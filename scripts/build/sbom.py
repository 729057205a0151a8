#!/usr/bin/env python3
"""SPDX 2.3 JSON software bills of materials for netclaim's release artefacts (scripts/release.sh).

    sbom.py image  ARCHIVE --version V --out FILE [--created EPOCH] [--source TEXT]
    sbom.py plugin BINARY  --version V --out FILE --arch amd64|arm64 --build-info FILE --modules FILE [...]
    sbom.py chart  TGZ     --version V --out FILE --image-digest sha256:... --image-name NAME [...]

Each document describes one artefact (its file name and SHA-256) and what it is made of,
read from the artefact itself wherever it says so:

- image: the OCI archive's image index, one package per platform manifest, and in each
  platform the Debian packages of its root file system (var/lib/dpkg/status), the Python
  distributions of the publisher's venv (*.dist-info/METADATA) and the plugin executable;
- plugin: the static executable, the netclaim and standard-library modules frozen into it
  (the build's modules.txt) and the static libraries it links (the build's build-info.txt:
  Debian's libpython3.11-dev and glibc);
- chart: the packaged chart and the image its values pin (by digest).

Licences are given only where the artefact declares an SPDX identifier (a distribution's
License-Expression or License field); everything else says NOASSERTION, as the image
leaves Debian's copyright files out. Standard library only; the output depends on the
inputs and --created alone (sorted keys, no wall-clock time), so a release is reproducible.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, Any, Iterable
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
INDEX = "application/vnd.oci.image.index.v1+json"
VENV_SITE = re.compile(r"^opt/netclaim/venv/lib/python3\.[0-9]+/site-packages/([^/]+)\.dist-info/METADATA$")
PLUGIN_IN_IMAGE = "opt/netclaim/bin/netclaim"
# Licence identifiers taken as declared when a distribution's License field is exactly one of them.
KNOWN_LICENSES = {"Apache-2.0", "MIT", "BSD-2-Clause", "BSD-3-Clause", "ISC", "MPL-2.0", "PSF-2.0",
                  "Python-2.0", "LGPL-2.1-or-later", "GPL-2.0-or-later", "Unlicense"}
EXPRESSION = re.compile(r"^[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*$")


def project_home() -> str:
    text = (REPO / "conf" / "helm" / "netclaim" / "Chart.yaml").read_text()
    found = re.search(r"^home:\s*(\S+)\s*$", text, re.M)
    return found.group(1) if found else "https://spdx.org/spdxdocs"


def spdx_id(*parts: str) -> str:
    """SPDXRef-<parts joined by "-">; a character SPDX ids cannot hold becomes ".<hex>." (libstdc++6:
    libstdc.2b..2b.6), so two names never share an id."""
    return "SPDXRef-" + "-".join(re.sub(r"[^A-Za-z0-9.-]", lambda m: f".{ord(m.group()):x}.", p) for p in parts if p)


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def package(spdxid: str, name: str, version: str, *, sha256: str = "", purl: str = "", license: str = "NOASSERTION",
            supplier: str = "NOASSERTION", purpose: str = "", comment: str = "", file_name: str = "") -> dict[str, Any]:
    pkg: dict[str, Any] = {
        "SPDXID": spdxid, "name": name, "versionInfo": version or "NOASSERTION",
        "downloadLocation": "NOASSERTION", "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
        "licenseDeclared": license, "copyrightText": "NOASSERTION", "supplier": supplier,
    }
    if sha256:
        pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": sha256}]
    if purl:
        pkg["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                "referenceLocator": purl}]
    if purpose:
        pkg["primaryPackagePurpose"] = purpose
    if comment:
        pkg["comment"] = comment
    if file_name:
        pkg["packageFileName"] = file_name
    return pkg


def relation(a: str, kind: str, b: str) -> dict[str, str]:
    return {"spdxElementId": a, "relationshipType": kind, "relatedSpdxElement": b}


def document(artefact: Path, root: dict[str, Any], packages: list[dict[str, Any]],
             relationships: list[dict[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(args.created))
    checksum = root["checksums"][0]["checksumValue"]
    comment = f"netclaim {args.version}" + (f", {args.source}" if args.source else "")
    unique: dict[str, dict[str, Any]] = {}
    for pkg in [root, *packages]:
        if pkg["SPDXID"] in unique:
            raise SystemExit(f"sbom: two packages with the id {pkg['SPDXID']}")
        unique[pkg["SPDXID"]] = pkg
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": artefact.name,
        "documentNamespace": f"{project_home()}/spdx/{artefact.name}-{checksum}",
        "creationInfo": {"created": created, "creators": [f"Tool: netclaim-sbom-{args.version}",
                                                          "Organization: netclaim"], "comment": comment},
        "packages": list(unique.values()),
        "relationships": [relation("SPDXRef-DOCUMENT", "DESCRIBES", root["SPDXID"]), *relationships],
    }


# ------------------------------------------------------------------ the image


class Layout:
    """The OCI layout inside an archive; every blob checked against its digest when read."""

    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path)
        self.names = set(self.tar.getnames())

    def file(self, name: str) -> bytes:
        member = self.tar.extractfile("./" + name) if ("./" + name) in self.names else None
        if member is None and name in self.names:
            member = self.tar.extractfile(name)
        if member is None:
            raise SystemExit(f"sbom: {name} missing from the image archive")
        return member.read()

    def stream(self, digest: str) -> IO[bytes]:
        algo, _, hexdigest = digest.partition(":")
        name = f"blobs/{algo}/{hexdigest}"
        member = self.tar.extractfile("./" + name) if ("./" + name) in self.names else self.tar.extractfile(name)
        if member is None:
            raise SystemExit(f"sbom: blob {digest} missing from the image archive")
        return member

    def blob(self, digest: str) -> bytes:
        algo, _, hexdigest = digest.partition(":")
        data = self.file(f"blobs/{algo}/{hexdigest}")
        if hashlib.sha256(data).hexdigest() != hexdigest:
            raise SystemExit(f"sbom: blob {digest} does not match its digest")
        return data


def deb822(text: str) -> Iterable[dict[str, str]]:
    """Stanzas of a dpkg status file (continuation lines folded into their field)."""
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package"):
            yield fields


def dist_license(meta: email.message.Message) -> str:
    expression = (meta.get("License-Expression") or "").strip()
    if expression and EXPRESSION.match(expression):
        return expression
    declared = (meta.get("License") or "").strip()
    return declared if declared in KNOWN_LICENSES else "NOASSERTION"


def platform_contents(layout: Layout, manifest: dict[str, Any]) -> tuple[str, dict[str, str], str]:
    """(dpkg status, {dist-info dir: METADATA}, plugin sha256) of one platform, later layers winning."""
    status, metadata, plugin = "", {}, ""
    for layer in manifest["layers"]:
        # Streamed (a layer is tens of MB): read once, in order.
        with tarfile.open(fileobj=layout.stream(layer["digest"]), mode="r|*") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if not member.isfile():
                    continue
                found = VENV_SITE.match(name)
                if name == "var/lib/dpkg/status":
                    status = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
                elif found:
                    metadata[found.group(1)] = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
                elif name == PLUGIN_IN_IMAGE:
                    plugin = hashlib.sha256(tar.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
    return status, metadata, plugin


def image(args: argparse.Namespace) -> dict[str, Any]:
    archive = Path(args.artefact)
    layout = Layout(archive)
    [top] = json.loads(layout.file("index.json"))["manifests"]
    if top["mediaType"] != INDEX:
        raise SystemExit(f"sbom: {archive.name} holds {top['mediaType']}, not an image index")
    root = package("SPDXRef-Archive", archive.name, args.version, sha256=sha256_file(archive), purpose="CONTAINER",
                   supplier="Organization: netclaim", file_name=archive.name,
                   comment="OCI archive (OCI image layout) of the netclaim image")
    index_hex = top["digest"].split(":", 1)[1]
    index_id = spdx_id("Image", "index")
    packages = [package(index_id, "netclaim", args.version, sha256=index_hex, supplier="Organization: netclaim",
                        purpose="CONTAINER",
                        purl=f"pkg:oci/netclaim@{quote(top['digest'])}?tag={quote(args.version)}",
                        comment=f"image index {top['digest']}")]
    relationships = [relation(root["SPDXID"], "CONTAINS", index_id)]
    for entry in json.loads(layout.blob(top["digest"]))["manifests"]:
        arch = entry["platform"]["architecture"]
        plat = f"{entry['platform']['os']}/{arch}"
        plat_id = spdx_id("Image", arch)
        packages.append(package(plat_id, f"netclaim {plat}", args.version, sha256=entry["digest"].split(":", 1)[1],
                                supplier="Organization: netclaim", purpose="CONTAINER",
                                purl=f"pkg:oci/netclaim@{quote(entry['digest'])}?arch={arch}",
                                comment=f"image manifest {entry['digest']} for {plat}"))
        relationships.append(relation(index_id, "CONTAINS", plat_id))
        status, metadata, plugin = platform_contents(layout, json.loads(layout.blob(entry["digest"])))
        if not status:
            raise SystemExit(f"sbom: no var/lib/dpkg/status in the {plat} image")
        debs = [s for s in deb822(status) if s.get("Status", "").endswith((" installed", " unpacked"))]
        for deb in sorted(debs, key=lambda s: s["Package"]):
            deb_id = spdx_id(arch, "deb", deb["Package"])
            source = deb.get("Source", "").split(" ")[0]
            packages.append(package(
                deb_id, deb["Package"], deb["Version"], supplier="Organization: Debian",
                purl=(f"pkg:deb/debian/{quote(deb['Package'])}@{quote(deb['Version'])}"
                      f"?arch={deb.get('Architecture', arch)}&distro=debian-12"),
                comment=(f"dpkg: {deb['Status']}" + (f"; source package {source}" if source else ""))))
            relationships.append(relation(plat_id, "CONTAINS", deb_id))
        if not metadata:
            raise SystemExit(f"sbom: no Python distribution in the {plat} image's venv")
        for _dir, text in sorted(metadata.items()):
            meta = email.parser.Parser().parsestr(text, headersonly=True)
            name, version = meta["Name"], meta["Version"]
            dist_id = spdx_id(arch, "python", name)
            normal = re.sub(r"[-_.]+", "-", name).lower()
            purl = (f"pkg:generic/netclaim@{quote(version)}" if normal == "netclaim"
                    else f"pkg:pypi/{normal}@{quote(version)}")
            packages.append(package(dist_id, name, version, purl=purl, license=dist_license(meta),
                                    supplier="Organization: netclaim" if normal == "netclaim" else "NOASSERTION",
                                    purpose="LIBRARY" if normal != "netclaim" else "APPLICATION",
                                    comment="Python distribution in /opt/netclaim/venv"))
            relationships.append(relation(plat_id, "CONTAINS", dist_id))
        if plugin:
            plugin_id = spdx_id(arch, "plugin")
            packages.append(package(plugin_id, "netclaim CNI plugin", args.version, sha256=plugin,
                                    license="Apache-2.0", supplier="Organization: netclaim", purpose="APPLICATION",
                                    comment=f"/{PLUGIN_IN_IMAGE}, the static plugin for {arch}"))
            relationships.append(relation(plat_id, "CONTAINS", plugin_id))
    return document(archive, root, packages, relationships, args)


# ------------------------------------------------------------------ the static plugin


def build_info(path: Path) -> dict[str, str]:
    info = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key:
            info[key] = value.strip()
    return info


def plugin(args: argparse.Namespace) -> dict[str, Any]:
    binary = Path(args.artefact)
    info = build_info(Path(args.build_info))
    modules = [m for m in Path(args.modules).read_text().split() if m]
    own = sorted(m for m in modules if m == "cni_plugin" or m.startswith("cni_plugin."))
    stdlib = sorted(m for m in modules if m not in own)
    arch = args.arch
    root = package("SPDXRef-Plugin", binary.name, args.version, sha256=sha256_file(binary), license="Apache-2.0",
                   supplier="Organization: netclaim", purpose="APPLICATION", file_name=binary.name,
                   comment=f"the netclaim CNI plugin, one statically linked executable for linux/{arch}")
    deb_arch = "arm64" if arch == "arm64" else "amd64"
    python_version = info.get("python", "NOASSERTION")
    packages = [
        package("SPDXRef-netclaim-modules", "netclaim", args.version, license="Apache-2.0",
                supplier="Organization: netclaim", purl=f"pkg:generic/netclaim@{quote(args.version)}",
                comment="frozen modules: " + " ".join(own)),
        package("SPDXRef-python3.11", "python3.11", python_version, license="PSF-2.0", purpose="LIBRARY",
                supplier="Organization: Debian",
                purl=f"pkg:generic/cpython@{quote(python_version)}",
                comment="the CPython interpreter and standard library, frozen modules: " + " ".join(stdlib)),
    ]
    relationships = [relation(root["SPDXID"], "CONTAINS", "SPDXRef-netclaim-modules"),
                     relation(root["SPDXID"], "CONTAINS", "SPDXRef-python3.11")]
    for key, value in sorted(info.items()):
        if not key.startswith("deb:"):
            continue
        name = key[4:]
        deb_id = spdx_id("deb", name)
        packages.append(package(deb_id, name, value, supplier="Organization: Debian",
                                purl=f"pkg:deb/debian/{quote(name)}@{quote(value)}?arch="
                                     f"{'amd64' if name.endswith('-cross') else deb_arch}&distro=debian-12",
                                comment="static library linked into the executable"))
        relationships.append(relation(root["SPDXID"], "STATIC_LINK", deb_id))
    return document(binary, root, packages, relationships, args)


# ------------------------------------------------------------------ the chart


def chart(args: argparse.Namespace) -> dict[str, Any]:
    tgz = Path(args.artefact)
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", args.image_digest):
        raise SystemExit(f"sbom: --image-digest must be sha256:<64 hex>, not {args.image_digest!r}")
    with tarfile.open(tgz) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        values = tar.extractfile("netclaim/values.yaml").read().decode()  # type: ignore[union-attr]
    if f'digest: "{args.image_digest}"' not in values:
        raise SystemExit(f"sbom: {tgz.name}'s values.yaml does not pin {args.image_digest}")
    root = package("SPDXRef-Chart", tgz.name, args.version, sha256=sha256_file(tgz), license="Apache-2.0",
                   supplier="Organization: netclaim", purpose="INSTALL", file_name=tgz.name,
                   comment=f"Helm chart netclaim {args.version}; {len(names)} files")
    image_id = spdx_id("Image", "index")
    packages = [package(image_id, "netclaim", args.version, sha256=args.image_digest.split(":", 1)[1],
                        supplier="Organization: netclaim", purpose="CONTAINER",
                        purl=f"pkg:oci/netclaim@{quote(args.image_digest)}?tag={quote(args.version)}",
                        comment=f"the image the chart pins (image.digest {args.image_digest}); "
                                f"its contents: {args.image_name}.spdx.json")]
    return document(tgz, root, packages, [relation(root["SPDXID"], "DEPENDS_ON", image_id)], args)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["image", "plugin", "chart"])
    parser.add_argument("artefact")
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--created", type=int, default=0, help="seconds since the epoch (SOURCE_DATE_EPOCH)")
    parser.add_argument("--source", default="", help="where it was built from, e.g. the git commit")
    parser.add_argument("--arch", choices=["amd64", "arm64"], default="amd64")
    parser.add_argument("--build-info")
    parser.add_argument("--modules")
    parser.add_argument("--image-digest")
    parser.add_argument("--image-name", default="")
    args = parser.parse_args(argv)
    doc = {"image": image, "plugin": plugin, "chart": chart}[args.kind](args)
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
