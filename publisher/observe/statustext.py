"""`netclaim-publisher status` for people: the answer's problems and its text form.

Kept apart from publisher/cli.py so that the command line stays the list of commands and options;
`fleet` (publisher/observe/fleet.py) is the same view for every node at once.
"""

from __future__ import annotations

import time
from typing import Any


def problems(st: dict[str, Any]) -> list[str]:
    """What in a status answer needs a person: `status` exits 1 when this is not empty."""
    out = []
    if not st.get("ready", True):
        out.append(f"not ready: {st.get('not_ready_reason') or 'see /readyz'}")
    if not st.get("live", True):
        out.append(f"not live: {st.get('not_live_reason') or 'see /healthz'}")
    errors = [k for k, cs in (st.get("claims") or {}).items() if cs.get("state") == "error"]
    if errors:
        out.append(f"{len(errors)} claim(s) in error: {', '.join(errors[:5])}")
    if st.get("failed_events"):
        out.append(f"{len(st['failed_events'])} event(s) dropped recently")
    if st.get("spool_stuck_files"):
        out.append(f"{st['spool_stuck_files']} spool file(s) cannot be ingested")
    return out


def _age(ts: float | None) -> str:
    return "-" if not ts else f"{time.time() - ts:.1f}s ago"


def text(st: dict[str, Any], found: list[str]) -> str:
    """The human summary: counters, the oldest pending event, the last error, one line per claim."""
    lines = [f"node:            {st['node']}", f"journal depth:   {st['journal_depth']}"]
    oldest = st.get("oldest_pending")
    lines.append("oldest pending:  " + ("-" if not oldest else
                 f"{oldest['op']} {oldest['containerID'][:12]}/{oldest['ifname']} age {oldest['age_seconds']}s "
                 f"attempts {oldest['attempts']} {oldest['last_error']}"))
    lines.append(f"attachments:     {st['attachments']}")
    schema = st.get("journal_schema")
    if schema and schema.get("note"):  # the journal was another release's (a rollback): what was done
        lines.append(f"journal:         {schema['note']}")
    check = st.get("unchained_check")
    if check is not None:  # an older publisher's answer has none
        off = check.get("off_reason")
        lines.append("unchained check: " + (f"off: {off}" if off else ", ".join(check.get("driver_names") or [])))
    err = st.get("last_error")
    lines.append("last error:      " + ("-" if not err else
                                       f"{_age(err.get('time'))} {err.get('claim', '')} {err.get('error')}"))
    lines.append("claims:")
    for key, cs in st.get("claims", {}).items():
        line = f"  {key:<40} {cs['state']:<10} {','.join(cs['devices'])}"
        if cs.get("error"):
            line += f"  error: {cs['error']}"
        lines.append(line)
    if st.get("failed_events"):
        lines.append("recently dropped events:")
        lines += [f"  {f['op']} {f['containerID'][:12]}/{f['ifname']}: {f['error']}" for f in st["failed_events"]]
    lines.append("problems:        " + ("-" if not found else "; ".join(found)))
    return "\n".join(lines)
