"""Watch ResourceClaims and note the moment an entry becomes visible.

ADD-to-visible latency is "how long after the pod's network was ready could a
client of the API see it": a watch (not polling) records, per claim, the first
time its status shows a Ready=True entry of our driver. Clocks are the same
machine's, so wall time is comparable with the caller's timestamps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes import client, watch

from .jsonlog import log


def ready_entry(status: dict[str, Any], driver: str) -> dict[str, Any] | None:
    for entry in status.get("devices") or []:
        if entry.get("driver") != driver:
            continue
        for cond in entry.get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                return entry
    return None


class ClaimWatcher:
    """A background watch on one namespace's claims; first Ready time per (claim, IPs)."""

    def __init__(self, api: client.ApiClient, namespace: str, driver: str) -> None:
        self.api = api
        self.resource = client.ResourceV1Api(api)
        self.namespace = namespace
        self.driver = driver
        self.seen: dict[tuple[str, tuple[str, ...]], float] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        # The client cannot map a v1 ResourceClaim watch to its model class; raw dicts suffice.
        self._watch = watch.Watch(return_type="object")
        self._thread = threading.Thread(target=self._loop, name="claim-watch", daemon=True)

    def start(self) -> "ClaimWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(
                    self.resource.list_namespaced_resource_claim, self.namespace, timeout_seconds=30
                ):
                    self._note(event["object"], time.time())
                    if self._stop.is_set():
                        return
            except Exception as exc:  # API restarts: re-watch; callers time out if it never recovers
                if self._stop.is_set():
                    return
                log("watch.error", namespace=self.namespace, error=f"{type(exc).__name__}: {exc}")
                time.sleep(0.5)

    def _note(self, obj: Any, when: float) -> None:
        raw = self.api.sanitize_for_serialization(obj)
        entry = ready_entry(raw.get("status") or {}, self.driver)
        if entry is None:
            return
        key = (raw["metadata"]["name"], tuple(sorted((entry.get("networkData") or {}).get("ips") or [])))
        with self._cond:
            self.seen.setdefault(key, when)
            self._cond.notify_all()

    def wait(self, claim: str, ips: list[str], timeout: float = 60.0) -> float:
        """Wall time at which `claim` first showed a Ready entry with exactly these IPs."""
        key = (claim, tuple(sorted(ips)))
        with self._cond:
            if not self._cond.wait_for(lambda: key in self.seen, timeout):
                raise TimeoutError(f"claim {self.namespace}/{claim} did not show {list(key[1])} within {timeout}s")
            return self.seen[key]


def _parse_ts(value: Any) -> float | None:
    """The plugin logs ISO-8601 UTC with milliseconds ("2026-01-02T03:04:05.678Z")."""
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    import calendar

    try:
        main, _, frac = value.rstrip("Z").partition(".")
        secs = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S"))
        return secs + (float("0." + frac) if frac else 0.0)
    except ValueError:
        return None


def plugin_add_time(log_file: str, container_id: str) -> float | None:
    """When netclaim's ADD for this sandbox started: its first log line naming the containerID.

    This is the start of ADD-to-visible. The plugin runs as the last step of
    the sandbox's network setup, so its clock reading is the honest "the
    pod's network exists now" moment, unlike RunPodSandbox's return, which
    comes after the sandbox's task start and can be later than the API write.
    """
    import json

    try:
        lines = open(log_file, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return None
    times = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("containerID") != container_id:
            continue
        if (rec.get("command") or rec.get("op")) == "ADD":
            ts = _parse_ts(rec.get("ts"))
            if ts is not None:
                times.append(ts)
    return min(times) if times else None
