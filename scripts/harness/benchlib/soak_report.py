"""The soak's figures: invariants with their verdicts, per-fault outcomes, series, summary, plot, markdown."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any, Protocol

from . import soak_checks as checks
from . import soak_tokens as tokens



class Soak(Protocol):
    """What the report reads of a finished soak (soak.Soak); a protocol so the report need not import it."""

    args: Any
    t0: float
    node: Any
    observer: Any
    workload: Any
    records: list[Any]
    teardown_notes: list[str]
    keeper_log: list[Any]

ORDINARY_SHARE_MIN = 0.8
SPOOL_SLACK = 5.0  # an ADD that started inside a fault may finish (and be read) a little after its end
BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"
# Every verdict `build` returns, in this order (the pytest module makes one test of each).
INVARIANTS = (
    "run completed (every fault of one cycle injected)",
    "faults injected without injector errors",
    "claims show their pod's own sandbox (10 s after the last fault)",
    "no entry names a gone sandbox after 10 s",
    "every entry's data matches the netclaim.dev/v1 schema",
    "zero Warning Events about ordinary pods",
    "zero failed events for ordinary pods",
    "publisher RSS/threads/fds flat",
    "/readyz false while a fault blocks progress",
    "/readyz true within 10 s after each fault",
    "no node service dies on its own",
    "netclaim re-chained within 10 s of a conflist rewrite",
    "no ADD spooled outside the faults (target 0)",
    ">= 80 % of pod starts ordinary",
    "publisher and keeper work on with each rotated token (no 401 past the re-read interval + 10 s)",
)


def _rel(t: float, t0: float) -> float:
    return round(t - t0, 1)


def _violations(soak: "Soak") -> list[checks.Violation]:
    obs = soak.observer
    return [] if obs is None else obs.own.violations + obs.stale.violations


def _fault_rows(soak: "Soak", spool: list[dict[str, Any]]) -> list[dict[str, Any]]:
    obs, t0, recs = soak.observer, soak.t0, soak.records
    samples = obs.samples if obs else []
    crashes = soak.node.crashes if soak.node else []
    rows = []
    for i, r in enumerate(recs):
        until = recs[i + 1].start if i + 1 < len(recs) else float("inf")
        mine = [v for v in _violations(soak) if r.start <= v.first_seen < until or
                (v.first_seen < r.start and r.end <= v.counted_at < until)]
        blocked = r.blocks == "always" or (r.blocks == "maybe" and any(
            a["handoff"] != "acked" and a["after"] <= r.end and a["read"] >= r.start for a in spool))
        ready = checks.readiness_verdict({"start": r.start, "end": r.end}, samples, soak.args.interval, blocked)
        died = [c for c in crashes if r.start <= c.at < until]
        broken = [e for e in (obs.schema.first if obs else []) if r.start <= e.first_seen < until]
        rechain_ok = not (r.name == "conflist-rewrite" and not any(
            n.startswith("re-chained after") and float(n.split()[2].rstrip("s")) <= checks.GRACE for n in r.notes))
        survived = (not mine and not broken and ready["ok_after"] and ready["ok_during"] and not died
                    and not r.errors and rechain_ok)
        rows.append({"name": r.name, "start_s": _rel(r.start, t0), "end_s": _rel(r.end, t0),
                     "duration_s": round(r.end - r.start, 1), "notes": r.notes, "errors": r.errors,
                     "readiness": ready, "violations": len(mine), "schema_errors": len(broken),
                     "crashes": [c.component for c in died],
                     "rechained_in_time": rechain_ok, "survived": survived})
    return rows


def _series(samples: list[checks.Sample], t0: float) -> dict[str, list[Any]]:
    rows = [s for s in samples if s.rss_kib is not None]
    return {"t_s": [_rel(s.t, t0) for s in rows], "pid": [s.pid for s in rows],
            "rss_mib": [round(s.rss_kib / 1024, 2) for s in rows], "threads": [s.threads for s in rows],
            "fds": [s.fds for s in rows],
            "ready": [[_rel(s.t, t0), s.ready] for s in samples if s.ready != "ready"]}


def _flatness(soak: "Soak") -> dict[str, Any]:
    obs = soak.observer
    if obs is None or not obs.samples:
        return {"judged": False, "why": "no samples"}
    last_pid = next((s.pid for s in reversed(obs.samples) if s.pid and s.rss_kib), None)
    born = next((s.t for s in obs.samples if s.pid == last_pid), obs.samples[0].t)
    flat_from = 300.0 if soak.args.minutes >= 10 else 120.0
    since = max(soak.t0 + flat_from, born + 60.0)
    out = checks.flatness(obs.samples, since, obs.samples[-1].t)
    out["rule"] = (f"last publisher process, from max(minute {flat_from / 60:g}, its start + 60 s) to the end: "
                   "median of the first minute vs the last minute; RSS <= +5 %, threads and fds <= +5 % or +2")
    out["since_s"], out["until_s"] = _rel(out["since"], soak.t0), _rel(out["until"], soak.t0)
    return out


def _classify(obs: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Warning Events about ordinary pods, failed events whose sandbox belonged to an ordinary pod)."""
    def ordinary(ref: dict[str, Any] | None) -> bool:
        return bool(ref) and ref.get("kind") == "Pod" and str(ref.get("name", "")).startswith("plain-")
    warnings = [w for w in obs.warnings.values() if ordinary(w.get("regarding")) or ordinary(w.get("related"))]
    failed = []
    for f in obs.failed.values():
        cid = str(f.get("containerID") or "")
        sb = next((s for i, s in obs.sandboxes.items() if cid and i.startswith(cid[:12])), None)
        if sb is not None and sb.kind == checks.ORDINARY:
            failed.append({**f, "pod": sb.pod})
    return warnings, failed


def _rotations(soak: "Soak") -> dict[str, Any]:
    obs, node = soak.observer, soak.node
    rotations = list(node.tokens.rotations) if node is not None and node.tokens is not None else []
    end = obs.samples[-1].t if obs and obs.samples else soak.t0
    verdict = tokens.rotation_verdict(rotations, obs.creds if obs else [], obs.shown if obs else {},
                                      getattr(soak, "keeper_log", []),
                                      [r.end for r in soak.records if r.name == "apiserver-restart"], end, soak.t0)
    for row in verdict["rotations"]:
        row["written_s"] = _rel(row.pop("written"), soak.t0)
    return verdict


def build(soak: "Soak", failure: str) -> dict[str, Any]:
    obs, t0 = soak.observer, soak.t0
    windows = [(r.start, r.end) for r in soak.records]
    adds = obs.plugin_log.adds if obs else []
    spool = checks.spool_share(adds, windows, SPOOL_SLACK)
    faults = _fault_rows(soak, adds)
    flat = _flatness(soak)
    warnings, failed = _classify(obs) if obs else ([], [])
    started = soak.workload.started if obs else {}
    n_ord, n_claim = len(started.get(checks.ORDINARY, ())), len(started.get(checks.CLAIMED, ()))
    share = n_ord / (n_ord + n_claim) if n_ord + n_claim else 0.0
    violations = _violations(soak)
    crashes = soak.node.crashes if soak.node else []
    rotation = _rotations(soak)
    invariants = {
        "run completed (every fault of one cycle injected)": {"ok": not failure and bool(faults), "detail": failure},
        "faults injected without injector errors": {"ok": not any(f["errors"] for f in faults),
                                                    "detail": [(f["name"], f["errors"]) for f in faults if f["errors"]]},
        "claims show their pod's own sandbox (10 s after the last fault)": {
            "ok": not obs or not obs.own.violations, "detail": len(obs.own.violations) if obs else 0},
        "no entry names a gone sandbox after 10 s": {"ok": not obs or not obs.stale.violations,
                                                     "detail": len(obs.stale.violations) if obs else 0},
        "every entry's data matches the netclaim.dev/v1 schema": (
            obs.schema.verdict(t0) if obs else {"ok": True, "detail": "no look"}),
        "zero Warning Events about ordinary pods": {"ok": not warnings, "detail": warnings[:10]},
        "zero failed events for ordinary pods": {"ok": not failed, "detail": failed[:10]},
        "publisher RSS/threads/fds flat": {"ok": bool(flat.get("judged") and flat.get("ok")), "detail": flat},
        "/readyz false while a fault blocks progress": {
            "ok": all(f["readiness"]["ok_during"] for f in faults),
            "detail": [f["name"] for f in faults if not f["readiness"]["ok_during"]]},
        "/readyz true within 10 s after each fault": {
            "ok": all(f["readiness"]["ok_after"] for f in faults),
            "detail": [f["name"] for f in faults if not f["readiness"]["ok_after"]]},
        "no node service dies on its own": {"ok": not crashes, "detail": [
            {"component": c.component, "at_s": _rel(c.at, t0), "log_tail": c.log_tail[-600:],
             "restart_error": c.restart_error} for c in crashes]},
        "netclaim re-chained within 10 s of a conflist rewrite": {
            "ok": all(f["rechained_in_time"] for f in faults),
            "detail": [f["notes"] for f in faults if f["name"] == "conflist-rewrite"]},
        "no ADD spooled outside the faults (target 0)": {"ok": spool["not_acked_outside_faults"] == 0,
                                                         "detail": spool["outside_detail"]},
        ">= 80 % of pod starts ordinary": {"ok": share >= ORDINARY_SHARE_MIN,
                                           "detail": f"{n_ord} ordinary, {n_claim} claimed"},
        "publisher and keeper work on with each rotated token (no 401 past the re-read interval + 10 s)": {
            "ok": rotation["ok"], "detail": rotation},
    }
    assert tuple(invariants) == INVARIANTS, "INVARIANTS lists every verdict"
    return {
        "date": dt.datetime.fromtimestamp(t0, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": soak.args.minutes,
        "duration_s": round((obs.samples[-1].t if obs and obs.samples else t0) - t0, 1),
        "cluster_dir": soak.args.dir,
        "ok": all(v["ok"] for v in invariants.values()),
        "invariants": invariants,
        "faults": faults,
        "schema_errors": obs.schema.count if obs else 0,
        "faults_survived": f"{sum(f['survived'] for f in faults)}/{len(faults)}",
        "violations": [{**checks.as_dicts([v])[0], "first_seen_s": _rel(v.first_seen, t0),
                        "counted_at_s": _rel(v.counted_at, t0), "last_seen_s": _rel(v.last_seen, t0)}
                       for v in violations],
        "workload": {"pod_starts_ordinary": n_ord, "pod_starts_claimed": n_claim, "ordinary_share": round(share, 3),
                     "scale_steps": soak.workload.steps if obs else 0},
        "spool": spool,
        "token_rotations": rotation["rotations"],
        "publisher_counters": obs.counters.total if obs else {},
        "warning_events": list(obs.warnings.values())[:50] if obs else [],
        "failed_events": list(obs.failed.values())[:50] if obs else [],
        "looks": {"complete": obs.looks if obs else 0, "incomplete": obs.incomplete if obs else 0,
                  "last_errors": obs.last_errors if obs else []},
        "resources": {"flatness": flat, "series": _series(obs.samples, t0) if obs else {}},
        "teardown": soak.teardown_notes,
    }


def summary(fig: dict[str, Any]) -> str:
    lines = [f"netclaim soak: {fig['minutes']:g} min requested, {fig['duration_s']:.0f} s run, "
             f"{'PASS' if fig['ok'] else 'FAIL'}", f"faults survived: {fig['faults_survived']}"]
    for f in fig["faults"]:
        r = f["readiness"]
        lines.append(f"  {'ok ' if f['survived'] else 'BAD'} {f['name']:<20} t={f['start_s']:>6}s {f['duration_s']:>5}s "
                     f"violations={f['violations']} schema_errors={f['schema_errors']} "
                     f"ready_after={r['ready_after_s']}s "
                     f"not_ready_during={r['not_ready_during']}/{r['samples_during']}"
                     + (f" crashes={f['crashes']}" if f["crashes"] else "") + (f" errors={f['errors']}" if f["errors"] else ""))
    lines.append("invariants:")
    for name, v in fig["invariants"].items():
        detail = "" if v["ok"] else f"  <- {str(v['detail'])[:400]}"
        lines.append(f"  {'ok  ' if v['ok'] else 'FAIL'} {name}{detail}")
    s, w = fig["spool"], fig["workload"]
    lines.append(f"ADDs: {s['adds']}, not acked (spooled/dropped/lost): {s['adds_not_acked']} "
                 f"({s['share_not_acked'] * 100:.1f} %), outside faults: {s['not_acked_outside_faults']}")
    lines.append(f"pod starts: {w['pod_starts_ordinary']} ordinary, {w['pod_starts_claimed']} claimed "
                 f"({w['ordinary_share'] * 100:.0f} % ordinary)")
    flat = fig["resources"]["flatness"]
    if flat.get("judged"):
        lines.append("publisher (pid %s, %.0fs..%.0fs): " % (flat["pid"], flat["since_s"], flat["until_s"]) + ", ".join(
            f"{k} {flat[k]['start']:.0f} -> {flat[k]['end']:.0f} ({flat[k]['growth_pct']:+.1f} %)"
            for k in ("rss_kib", "threads", "fds")))
    else:
        lines.append(f"publisher flatness not judged: {flat.get('why')}")
    for v in fig["violations"][:15]:
        lines.append(f"  violation [{v['invariant']}] first {v['first_seen_s']}s, counted {v['counted_at_s']}s, "
                     f"last {v['last_seen_s']}s{' (still open)' if v['open'] else ''}: {v['detail'][:300]}")
    lines += [f"teardown: {n}" for n in fig["teardown"]]
    return "\n".join(lines)


def plot(fig: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = fig["resources"]["series"]
    minutes = [t / 60 for t in s.get("t_s", [])]
    axes = plt.subplots(3, 1, figsize=(12, 8), sharex=True)[1]
    for ax, (key, label) in zip(axes, (("rss_mib", "RSS (MiB)"), ("threads", "threads"), ("fds", "open fds"))):
        ax.plot(minutes, s.get(key, []), ".", markersize=2, color="#3b75af")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for f in fig["faults"]:
            ax.axvspan(f["start_s"] / 60, f["end_s"] / 60, color="#d62728" if not f["survived"] else "#999999",
                       alpha=0.15, linewidth=0)
        flat = fig["resources"]["flatness"]
        if flat.get("judged"):
            ax.axvspan(flat["since_s"] / 60, flat["until_s"] / 60, color="#2ca02c", alpha=0.06, linewidth=0)
    for f in fig["faults"]:
        axes[0].text(f["start_s"] / 60, 1.0, f["name"], rotation=90, fontsize=6, va="bottom",
                     transform=axes[0].get_xaxis_transform())
    axes[-1].set_xlabel("minutes (grey: faults survived, red: not; green: window judged for flatness)")
    plt.suptitle(f"netclaim-publisher over a {fig['duration_s'] / 60:.0f}-minute node-life soak "
                 f"(faults survived {fig['faults_survived']})", y=0.995)
    plt.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    plt.savefig(path, dpi=100)
    plt.close("all")


def write_doc(fig: dict[str, Any], doc: Path, png: Path | None) -> None:
    """Replace (or append) the soak section of a markdown file."""
    s, w, flat = fig["spool"], fig["workload"], fig["resources"]["flatness"]
    rows = [
        BEGIN, "## Node-life soak", "",
        f"`scripts/bench.py soak --minutes {fig['minutes']:g}` on {fig['date']}: {fig['duration_s'] / 60:.0f} min "
        f"on a real single-node cluster (scripts/cluster.sh), {'all invariants held' if fig['ok'] else 'invariants FAILED'}.",
        "",
        "Three Deployments (two of ordinary pods, one whose pods get a claim from a ResourceClaimTemplate of the",
        "DRA test driver) scale every 12 s while faults are injected one at a time, each followed by 15 s of",
        "quiet; the invariants are checked every 2 s from the API, crictl and each pod's own netns",
        "(scripts/harness/benchlib/soak.py). The cycle includes credential rotation: the publisher's and the",
        "chain keeper's token files are replaced the way kubelet rotates a projected token and the old token is",
        "revoked, without restarting either; each must reload and work on (soak_tokens.py). At every look each",
        "netclaim entry's `data` is held to the schema netclaim ships, with no grace, faults or not.",
        "A fault counts as survived when no violation and no schema error was first seen between its",
        "start and the next fault, /readyz behaved, no node service died and the injector worked; a wrong",
        "state that an earlier fault caused shows up at the next claimed pod start, so read the violations too.",
        "", "| figure | value |", "|---|---|",
        f"| faults survived | {fig['faults_survived']} |",
        f"| wrong entries seen (violations) | {len(fig['violations'])} |",
        f"| entries' data errors against the netclaim.dev/v1 schema | {fig['schema_errors']} |",
        f"| pod starts (ordinary / claimed) | {w['pod_starts_ordinary']} / {w['pod_starts_claimed']} |",
        f"| ADDs not acked (had to spool) | {s['adds_not_acked']} of {s['adds']} ({s['share_not_acked'] * 100:.1f} %), "
        f"{s['not_acked_outside_faults']} outside faults (target 0) |",
    ]
    if flat.get("judged"):
        for k, label in (("rss_kib", "RSS KiB"), ("threads", "threads"), ("fds", "open fds")):
            rows.append(f"| publisher {label}, start -> end of the judged window | {flat[k]['start']:.0f} -> "
                        f"{flat[k]['end']:.0f} ({flat[k]['growth_pct']:+.1f} %) |")
    rows += ["", "| invariant | held |", "|---|---|"]
    rows += [f"| {name} | {'yes' if v['ok'] else '**no**'} |" for name, v in fig["invariants"].items()]
    if fig["violations"]:
        rows += ["", "Violations (first seen / counted / last seen, seconds into the run):", ""]
        rows += [f"- {v['invariant']}: {v['first_seen_s']} / {v['counted_at_s']} / {v['last_seen_s']}"
                 f"{' (still open at the end)' if v['open'] else ''}: {v['detail'][:300]}" for v in fig["violations"][:10]]
    rows += ["", "| fault | duration s | survived | notes |", "|---|---|---|---|"]
    rows += [f"| {f['name']} | {f['duration_s']} | {'yes' if f['survived'] else '**no**'} | "
             f"{'; '.join(f['notes'])[:160]} |" for f in fig["faults"]]
    if png is not None:
        rows += ["", f"![publisher RSS, threads and fds over the soak]({os.path.relpath(png, doc.parent)})"]
    rows += ["", END]
    text = doc.read_text() if doc.exists() else ""
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + "\n".join(rows) + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(rows) + "\n"
    doc.write_text(text)
