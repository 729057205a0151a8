"""Push the image index of an OCI archive (release.sh's netclaim-VERSION.oci.tar) to a registry.

    oci_push.py ARCHIVE REGISTRY/REPOSITORY:TAG [--plain-http]

Everything is pushed by digest, as the OCI distribution API asks: each blob (layers, configs) with a
monolithic upload (POST, then PUT ?digest=), each platform manifest by its digest, then the index by
its digest, and last the tag, so a puller never sees a tag whose index misses a part. Blobs the
registry already holds are not sent again. Prints the index digest. No docker, no daemon: the
archive is read as it is, and the digests in it are checked against the bytes before they are sent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import requests

INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
TIMEOUT = 300


@dataclass(frozen=True)
class Target:
    """Where to push: the registry's base URL, the repository and the tag."""

    base: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, ref: str, plain_http: bool) -> Target:
        """REGISTRY/REPOSITORY:TAG; the registry is the part before the first slash."""
        host, _, rest = ref.partition("/")
        repository, sep, tag = rest.rpartition(":")
        if not host or not sep or not repository or "/" in tag:
            raise SystemExit(f"oci_push: want REGISTRY/REPOSITORY:TAG, not {ref}")
        return cls(f"{'http' if plain_http else 'https'}://{host}", repository, tag)

    def url(self, kind: str, ref: str = "") -> str:
        return f"{self.base}/v2/{self.repository}/{kind}/{ref}"


class Layout:
    """An OCI image layout in a tar archive, each blob read and checked against its digest."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.prefix = "./" if "./index.json" in tar.getnames() else ""

    def read(self, name: str) -> bytes:
        member = self.tar.extractfile(self.prefix + name)
        if member is None:
            raise SystemExit(f"oci_push: {name} is not a file in the archive")
        return member.read()

    def blob(self, digest: str) -> bytes:
        algorithm, _, hexdigest = digest.partition(":")
        data = self.read(f"blobs/{algorithm}/{hexdigest}")
        if algorithm != "sha256" or hashlib.sha256(data).hexdigest() != hexdigest:
            raise SystemExit(f"oci_push: blob {digest} in the archive does not match its digest")
        return data

    def top(self) -> dict[str, Any]:
        """The one image index index.json names."""
        manifests = json.loads(self.read("index.json"))["manifests"]
        if len(manifests) != 1 or manifests[0]["mediaType"] not in INDEX_TYPES:
            raise SystemExit("oci_push: the archive's index.json must name exactly one image index")
        return dict(manifests[0])


def push_blob(session: requests.Session, target: Target, digest: str, data: bytes) -> None:
    """Upload one blob unless the registry has it already (HEAD), in one POST + PUT."""
    if session.head(target.url("blobs", digest), timeout=TIMEOUT).status_code == 200:
        return
    start = session.post(target.url("blobs", "uploads/"), timeout=TIMEOUT)
    start.raise_for_status()
    location = urljoin(target.base, start.headers["Location"])
    done = session.put(location + ("&" if "?" in location else "?") + f"digest={digest}", data=data,
                       headers={"Content-Type": "application/octet-stream"}, timeout=TIMEOUT)
    if done.status_code != 201:
        raise SystemExit(f"oci_push: blob {digest}: {done.status_code} {done.text[:300]}")


def put_manifest(session: requests.Session, target: Target, ref: str, media_type: str, data: bytes) -> str:
    """PUT a manifest under REF (a digest or the tag) and return the digest the registry reports."""
    reply = session.put(target.url("manifests", ref), data=data, headers={"Content-Type": media_type},
                        timeout=TIMEOUT)
    if reply.status_code != 201:
        raise SystemExit(f"oci_push: manifest {ref}: {reply.status_code} {reply.text[:300]}")
    return reply.headers.get("Docker-Content-Digest", "")


def push_manifest(session: requests.Session, target: Target, layout: Layout, descriptor: dict[str, Any]) -> None:
    """Push what a manifest names (blobs, or child manifests of an index), then the manifest by digest."""
    data = layout.blob(descriptor["digest"])
    manifest = json.loads(data)
    if descriptor["mediaType"] in INDEX_TYPES:
        for child in manifest["manifests"]:
            push_manifest(session, target, layout, child)
    else:
        for part in [manifest["config"], *manifest["layers"]]:
            push_blob(session, target, part["digest"], layout.blob(part["digest"]))
    got = put_manifest(session, target, descriptor["digest"], descriptor["mediaType"], data)
    if got and got != descriptor["digest"]:
        raise SystemExit(f"oci_push: the registry stored {descriptor['digest']} as {got}")


def push(archive: str, ref: str, plain_http: bool) -> str:
    """Push the archive's image index and everything under it; tag it last. Returns the index digest."""
    target = Target.parse(ref, plain_http)
    with tarfile.open(archive) as tar, requests.Session() as session:
        layout = Layout(tar)
        top = layout.top()
        push_manifest(session, target, layout, top)
        put_manifest(session, target, target.tag, top["mediaType"], layout.blob(top["digest"]))
    return str(top["digest"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archive")
    parser.add_argument("ref", help="REGISTRY/REPOSITORY:TAG")
    parser.add_argument("--plain-http", action="store_true", help="HTTP, not HTTPS (a loopback registry)")
    args = parser.parse_args(argv)
    print(push(args.archive, args.ref, args.plain_http))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
