"""Write the provenance predicate release.sh --sign-key attests on the pushed image (SLSA v0.2).

    provenance.py --version V --commit SHA [--source-uri URI] --builder ID --epoch S [--dirty] [--tool NAME=VERSION]... LOCK...

It says what a verifier needs to rebuild the image and compare digests: the source commit (a
material and the config source of the build), the sha256 of each lock file the image was built from
(conf/image/*.lock: the Debian packages and the wheels), the builder's id and the tools that made
the release. Printed as JSON on stdout, for `cosign attest --type slsaprovenance --predicate`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BUILD_TYPE = "urn:netclaim:scripts/release.sh:v1"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def predicate(args: argparse.Namespace) -> dict[str, Any]:
    """The SLSA v0.2 predicate: builder, build type, invocation, metadata and materials."""
    source = {"uri": args.source_uri, "digest": {"sha1": args.commit}}
    when = datetime.fromtimestamp(args.epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    locks = [{"uri": f"conf/image/{Path(lock).name}", "digest": {"sha256": sha256(Path(lock))}} for lock in args.lock]
    return {
        "builder": {"id": args.builder},
        "buildType": BUILD_TYPE,
        "invocation": {
            "configSource": {**source, "entryPoint": "scripts/release.sh"},
            "parameters": {"version": args.version},
            "environment": {"tools": dict(t.split("=", 1) for t in args.tool), "dirty": args.dirty},
        },
        "metadata": {"buildFinishedOn": when, "reproducible": True,
                     "completeness": {"parameters": True, "environment": False, "materials": True}},
        "materials": [source, *locks],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--source-uri", default="git+netclaim", help="where the commit lives (a git URL)")
    parser.add_argument("--builder", required=True)
    parser.add_argument("--epoch", type=int, required=True, help="SOURCE_DATE_EPOCH of the release")
    parser.add_argument("--dirty", action="store_true", help="the work tree differed from the commit")
    parser.add_argument("--tool", action="append", default=[], help="NAME=VERSION of a tool that made the release")
    parser.add_argument("lock", nargs="+", help="the image's lock files")
    print(json.dumps(predicate(parser.parse_args(argv)), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
