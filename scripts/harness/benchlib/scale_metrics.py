"""Scrape the servers' own Prometheus metrics and take differences between two moments (bench scale)."""

from __future__ import annotations

import os
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
APISERVER_METRICS = ("apiserver_request_total", "process_cpu_seconds_total", "apiserver_longrunning_requests",
                     "apiserver_registered_watchers")
ETCD_METRICS = ("etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total",
                "process_cpu_seconds_total")



# ------------------------------------------------------------------ metrics


def scrape(url: str, names: tuple[str, ...], headers: dict[str, str] | None = None,
           context: Any = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of `names` at a Prometheus text endpoint: {(name, labels): value}."""
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30, context=context) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        m = SAMPLE_RE.match(line)
        if m and m.group(1) in names:
            labels = tuple(sorted(LABEL_RE.findall(m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def total(samples: dict, name: str, **match: str) -> float:
    """Sum of `name`'s samples whose labels include `match`."""
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == want for k, want in match.items()))


def _api_requests(samples: dict) -> dict[str, float]:
    """apiserver_request_total by 'VERB resource[/subresource]', non-resource URLs left out."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        lab = dict(labels)
        if n != "apiserver_request_total" or not lab.get("resource"):
            continue
        key = f"{lab.get('verb')} {lab['resource']}" + (f"/{lab['subresource']}" if lab.get("subresource") else "")
        out[key] = out.get(key, 0.0) + v
    return out


@dataclass
class Snapshot:
    """Every counter the bench reads, at one moment."""

    t: float
    apiserver: dict
    etcd: dict
    publishers: dict[str, dict[str, float]]  # node -> {"cpu_s", "rss_mib", "api_requests"}


@dataclass
class Delta:
    """What changed between two snapshots."""

    seconds: float
    apiserver_cpu_s: float
    etcd_cpu_s: float
    etcd_puts: float
    etcd_deletes: float
    requests: dict[str, float]
    publisher_cpu_s: float
    publisher_requests: float

    @staticmethod
    def between(a: Snapshot, b: Snapshot) -> "Delta":
        ra, rb = _api_requests(a.apiserver), _api_requests(b.apiserver)
        requests = {k: rb[k] - ra.get(k, 0.0) for k in rb if rb[k] - ra.get(k, 0.0) > 0}
        nodes = [n for n in b.publishers if n in a.publishers]
        return Delta(
            seconds=b.t - a.t,
            apiserver_cpu_s=total(b.apiserver, "process_cpu_seconds_total") - total(a.apiserver, "process_cpu_seconds_total"),
            etcd_cpu_s=total(b.etcd, "process_cpu_seconds_total") - total(a.etcd, "process_cpu_seconds_total"),
            etcd_puts=total(b.etcd, "etcd_mvcc_put_total") - total(a.etcd, "etcd_mvcc_put_total"),
            etcd_deletes=total(b.etcd, "etcd_mvcc_delete_total") - total(a.etcd, "etcd_mvcc_delete_total"),
            requests=requests,
            publisher_cpu_s=sum(b.publishers[n]["cpu_s"] - a.publishers[n]["cpu_s"] for n in nodes),
            publisher_requests=sum(b.publishers[n]["api_requests"] - a.publishers[n]["api_requests"] for n in nodes),
        )

    def net_of_idle(self, idle: "Delta", count: int) -> dict[str, float]:
        """Per-event figures with the idle background for the same duration taken off."""
        scale = self.seconds / idle.seconds if idle.seconds else 0.0
        requests = sum(self.requests.values()) - scale * sum(idle.requests.values())
        return {
            "api_requests": round(requests / count, 2),
            "apiserver_cpu_ms": round((self.apiserver_cpu_s - scale * idle.apiserver_cpu_s) / count * 1000, 2),
            "etcd_cpu_ms": round((self.etcd_cpu_s - scale * idle.etcd_cpu_s) / count * 1000, 2),
            "etcd_writes": round((self.etcd_puts + self.etcd_deletes
                                  - scale * (idle.etcd_puts + idle.etcd_deletes)) / count, 2),
            "publisher_cpu_ms": round((self.publisher_cpu_s - scale * idle.publisher_cpu_s) / count * 1000, 2),
            "publisher_api_requests": round((self.publisher_requests - scale * idle.publisher_requests) / count, 2),
        }


def proc_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds user+system, RSS MiB) of a live process, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return cpu, rss
