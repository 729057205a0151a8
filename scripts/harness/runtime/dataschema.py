"""Every entry of netclaim's that a test reads is held to the schema netclaim ships for `data`.

conf/schema/netclaim.dev_v1_CNIResult.schema.json is what consumers are told `data` holds. The
suite's readers of claim status (publisher_testkit's Cluster, realcluster.entries_of, the e2e
Cluster) pass what they read through `check_entries`, so a writer of `data` anywhere in the
product that forgets apiVersion, emits a field the schema does not document, or gives a field
another type, fails the test that reads the entry, with the schema's complaint. The list of pods
on a shared device (`attachments`, opt-in) is also held to what the schema cannot express: one item
per pod, sorted by pod name, the shown sandbox among them (`attachments_errors`).

Which entries are netclaim's: `data` that names a `netclaim.dev/` apiVersion, and `data` in the
shape netclaim wrote before it carried one (`containerID` and `network` without `apiVersion`),
which is exactly the mistake to catch. Other writers' `data` (another driver's, dranet's) is
not looked at. A test that writes an entry in netclaim's old form itself, as an older release
would have (tests/publisher/repair/test_publisher_after_a_rollback.py), says so with `planted`;
the real clusters' reader (realcluster.entries_of) reads clusters that may run the previous
release, and holds its unversioned data to the fields of v1 only (`previous_release`).
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any

SCHEMA_NAME = "netclaim.dev_v1_CNIResult.schema.json"
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "conf" / "schema" / SCHEMA_NAME
API_GROUP = "netclaim.dev/"

_planted: set[str] = set()
_planted_lock = threading.Lock()


class DataSchemaError(Exception):
    """An entry's `data` that netclaim wrote breaks its schema. Not an AssertionError on purpose:
    the harness's wait loops retry on those, and this must fail the test at once."""


def _key(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def planted(data: Any) -> None:
    """`data` a test wrote itself as another writer (an older release's form): not checked."""
    with _planted_lock:
        _planted.add(_key(data))


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema  # the test extra (setup.cfg); imported here so the harness loads without it

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema() -> dict[str, Any]:
    return _validator().schema


def data_errors(data: Any) -> list[str]:
    """What is wrong with `data` against the schema ([] when nothing): the validator's errors, and
    top-level fields the schema does not document (it lets readers meet them; netclaim must not
    write one without documenting it)."""
    validator = _validator()
    errors = [f"{'/'.join(str(p) for p in e.absolute_path) or '(data)'}: {e.message}"
              for e in validator.iter_errors(data)]
    if isinstance(data, dict):
        known = validator.schema["properties"]
        errors += [f"{key}: not documented in {SCHEMA_NAME}" for key in data if key not in known]
        errors += attachments_errors(data)
    return errors


def attachments_errors(data: dict[str, Any]) -> list[str]:
    """What the schema cannot say about `attachments` (--shared-attachments): one item per pod,
    sorted by pod name, and the shown sandbox (`containerID`) among them; a list cut to fit says so
    in `trimmed`, a whole one has at least two pods."""
    items = data.get("attachments")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return []  # the validator has said what is wrong
    errors = []
    pods = [i.get("pod") for i in items]
    if not all(isinstance(p, str) for p in pods) or pods != sorted(set(pods)):
        errors.append(f"attachments: not one item per pod sorted by pod name: {pods}")
    if data.get("containerID") not in [i.get("containerID") for i in items]:
        errors.append(f"attachments: the shown sandbox {data.get('containerID')!r} is not listed")
    if len(items) < 2 and "attachments" not in (data.get("trimmed") or []):
        errors.append("attachments: a list of one pod that was not cut (one pod shows no list)")
    return errors


def is_netclaims(data: Any) -> bool:
    """`data` netclaim wrote: its apiVersion, or the unversioned shape of before."""
    if not isinstance(data, dict):
        return False
    version = data.get("apiVersion")
    if isinstance(version, str):
        return version.startswith(API_GROUP)
    return "apiVersion" not in data and "containerID" in data and "network" in data


def check_entries(entries: list[dict[str, Any]], previous_release: bool = False) -> list[dict[str, Any]]:
    """`entries` (status.devices items) unchanged, once every netclaim `data` among them matches
    the schema; raises DataSchemaError naming the entry and what is wrong.

    `previous_release`: the reader's cluster may run the release before the schema (0.1.0: the
    upgrade and rollback of tests/deploy/test_release.py), whose `data` has no apiVersion and kind;
    such data is held to the schema as this release rewrites it (the two fields put first).
    """
    for entry in entries:
        data = entry.get("data") if isinstance(entry, dict) else None
        if not is_netclaims(data):
            continue
        with _planted_lock:
            if _key(data) in _planted:
                continue
        if previous_release and "apiVersion" not in data:
            data = {"apiVersion": API_GROUP + "v1", "kind": "CNIResult", **data}
        errors = data_errors(data)
        if errors:
            where = "/".join(str(entry.get(k, "")) for k in ("driver", "pool", "device"))
            raise DataSchemaError(f"entry {where}: its data does not match {SCHEMA_NAME}: {'; '.join(errors)}")
    return entries


def check_status(status: dict[str, Any]) -> dict[str, Any]:
    """A claim's status unchanged, once its entries passed check_entries."""
    check_entries((status or {}).get("devices") or [])
    return status
