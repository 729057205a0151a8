"""The publisher's list-and-watch loop and API client after an API server restart, at 5,000 nodes.

The real `follow()` (publisher/kube/listwatch.py) runs against a stand-in API whose
behaviour is scripted per test; time is simulated (`SimTime`: the loop's
backoff waits move a simulated clock instead of sleeping), so each test reads
minutes of a node's life in milliseconds and asserts what the API server would
see: how many LISTs and WATCHes a node sends per minute, and when. The API
client's parts (publisher/kube/calls.py, publisher/kube/ratelimit.py) are the real ones;
only the HTTP layer under them is a stand-in (`FakeHttp`), because a real
kube-apiserver cannot be made to answer 429 with a chosen Retry-After.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from publisher.kube.calls import Kube, TransientError
from publisher.kube.listwatch import follow
from publisher.kube.ratelimit import TokenBucket

RTT = 0.01  # simulated seconds one request takes


class SimTime:
    """The loop's `stopping` event and clock in one: wait() moves simulated time instead of sleeping.

    `until` ends the run once simulated time reaches it; `max_calls` ends it after that many
    requests even if time stands still (a loop that never waits would otherwise run forever)."""

    def __init__(self, until: float, max_calls: int = 5000) -> None:
        self.now = 0.0
        self.until = until
        self.max_calls = max_calls
        self.calls = 0
        self._stopped = False

    def clock(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self._stopped or self.now >= self.until or self.calls >= self.max_calls

    def set(self) -> None:
        self._stopped = True

    def wait(self, seconds: float | None = None) -> bool:
        self.now += seconds or 0.0
        return self.is_set()

    def request(self) -> None:
        self.calls += 1
        self.now += RTT


class StandInApi:
    """A node's LIST and WATCH as the API server answers them; `watch_behaviour(n)` scripts the n-th watch
    (it returns how long the watch lives and whether it delivers an event, or raises)."""

    def __init__(self, sim: SimTime, watch_behaviour: Callable[[int], tuple[float, bool]],
                 list_refused_until: float = -1.0, list_refused_from: float = 0.0) -> None:
        self.sim = sim
        self.watch_behaviour = watch_behaviour
        self.list_refused_from = list_refused_from
        self.list_refused_until = list_refused_until
        self.lists: list[float] = []  # simulated time each LIST was sent
        self.good_lists: list[float] = []
        self.watches: list[tuple[float, str]] = []  # (time, resourceVersion asked for)
        self.rv = 100

    def relist(self) -> str:
        self.lists.append(self.sim.now)
        self.sim.request()
        if self.list_refused_from <= self.sim.now < self.list_refused_until:
            raise TransientError(0, "connection refused")
        self.good_lists.append(self.sim.now)
        return str(self.rv)

    def watch(self, rv: str) -> str:
        self.watches.append((self.sim.now, rv))
        self.sim.request()
        lives, delivers = self.watch_behaviour(len(self.watches))
        self.sim.now += lives
        if delivers:
            self.rv += 1
            return str(self.rv)
        return rv


def run_follow(api: StandInApi, rng: random.Random | None = None) -> list[Exception]:
    failures: list[Exception] = []
    follow(api.sim, api.relist, api.watch, failures.append, clock=api.sim.clock, rng=rng or random.Random(7))
    return failures


def per_minute(times: list[float]) -> Counter:
    return Counter(int(t // 60) for t in times)


def refused(_: int) -> tuple[float, bool]:
    raise TransientError(503, "the server is currently unable to handle the request")


def broken(_: int) -> tuple[float, bool]:
    raise TransientError(0, "connection reset by peer")


def test_a_watch_that_ends_at_once_is_not_reopened_in_a_tight_loop():
    # A proxy (or a stopping API server) that ends every watch stream cleanly at once, for 10 minutes.
    for seed in range(5):
        api = StandInApi(SimTime(until=600), lambda n: (0.0, False))
        run_follow(api, random.Random(seed))
        busiest = max(per_minute([t for t, _ in api.watches]).values())
        assert busiest <= 20, f"{busiest} WATCH requests in one minute from one node (seed {seed})"
        assert len(api.watches) <= 100, f"{len(api.watches)} WATCHes in 10 minutes (seed {seed})"


def test_a_watch_refused_after_each_list_backs_off():
    # RBAC with `list` but not `watch`, or an overloaded API server refusing only watches: every LIST
    # is good, every WATCH is refused. A good LIST must not reset the backoff.
    api = StandInApi(SimTime(until=600), refused)
    failures = run_follow(api)
    assert len(failures) == len(api.watches) > 0
    later = per_minute(api.lists)
    assert max(later[m] for m in range(2, 10)) <= 10, f"LISTs per minute from one node: {dict(later)}"
    gaps = [b - a for a, b in zip(api.lists, api.lists[1:])]
    assert sum(gaps[-10:]) / 10 >= 5.0, f"the last gaps between LISTs: {[round(g, 2) for g in gaps[-10:]]}"


class Midpoint(random.Random):
    """Jitter that always draws the middle of its range: the backoff's window itself is then visible."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def test_only_a_watch_that_lived_a_while_resets_the_backoff():
    # 8 refused watches (the backoff grows), then one that breaks after 10 s, then one that
    # breaks after 3 minutes: only the second may bring the node back to a quick relist.
    def behaviour(n: int) -> tuple[float, bool]:
        if n <= 8:
            refused(n)
        if n in (9, 10):
            api.sim.now += 10.0 if n == 9 else 180.0
            broken(n)
        return 3600.0, True

    api = StandInApi(SimTime(until=4000), behaviour)
    run_follow(api, Midpoint())
    broke_after_10s, broke_after_3min = api.watches[8][0] + RTT + 10.0, api.watches[9][0] + RTT + 180.0
    relist_after_10s = next(t for t in api.lists if t >= broke_after_10s) - broke_after_10s
    relist_after_3min = next(t for t in api.lists if t >= broke_after_3min) - broke_after_3min
    assert relist_after_3min <= 1.0, f"relisted {relist_after_3min:.2f} s after a 3-minute watch broke"
    assert relist_after_10s >= 5.0, f"relisted {relist_after_10s:.2f} s after a 10 s watch broke (backoff reset)"


def test_a_watch_that_delivered_events_is_reopened_at_once_from_where_it_got():
    # A watch that ends early but delivered something (a server renewing streams) costs no wait.
    api = StandInApi(SimTime(until=600, max_calls=51), lambda n: (0.2, True))
    failures = run_follow(api)
    assert failures == [] and len(api.lists) == 1
    assert [rv for _, rv in api.watches[:4]] == ["100", "101", "102", "103"]
    assert api.watches[49][0] < 50 * (0.2 + RTT) + 0.01, "a wait came between watches that delivered events"


def test_nodes_that_fail_at_the_same_instant_relist_spread_out():
    # An API server restart breaks 100 nodes' watches at the same instant: their next LISTs must
    # not all arrive in the same moment.
    second_lists = []
    for node in range(100):
        api = StandInApi(SimTime(until=60, max_calls=3), broken)
        run_follow(api, random.Random(node))
        second_lists.append(api.lists[1] - api.watches[0][0])
    spread = max(second_lists) - min(second_lists)
    crowd = max(Counter(int(t * 10) for t in second_lists).values())
    assert spread >= 0.4, f"100 nodes relisted within {spread:.3f} s of each other"
    assert crowd <= 25, f"{crowd} of 100 nodes relisted within the same 0.1 s"


@pytest.mark.parametrize("outage", [5.0, 15.0])
def test_nodes_relist_spread_over_the_seconds_after_an_api_server_restart(outage):
    # The bench's restart (scripts/bench.py watches) in simulated time, for 5 fleets of 100 nodes:
    # every watch breaks at the same instant, LISTs are refused for `outage` seconds, then answered.
    # No second after the API is back may take more than 20 % of a fleet's relists, and an
    # outage may cost a node only a few requests.
    restart = 10.0
    for fleet in range(5):
        back_at, requests = [], []
        for node in range(100):
            def behaviour(n: int) -> tuple[float, bool]:
                if n == 1:
                    api.sim.now = restart
                    broken(n)
                return 3600.0, True

            api = StandInApi(SimTime(until=restart + outage + 120), behaviour,
                             list_refused_from=restart, list_refused_until=restart + outage)
            run_follow(api, random.Random(fleet * 1000 + node))
            back_at.append(next(t for t in api.good_lists if t >= restart) - (restart + outage))
            requests.append(sum(t >= restart for t in api.lists) + sum(t >= restart for t, _ in api.watches))
        busiest = max(Counter(int(t) for t in back_at).values())
        assert busiest <= 20, f"{busiest} of 100 nodes relisted in one second after a {outage:g} s outage " \
                              f"(fleet {fleet})"
        assert sum(requests) / 100 <= 8.0, f"{sum(requests) / 100} requests per node through a {outage:g} s outage"
        assert max(back_at) <= 60.0, f"a node relisted {max(back_at):.1f} s after the API was back"


# ---------------------------------------------------------------- the API client under it


class FakeAnswer:
    """An HTTP answer as urllib3 gives it (stand-in HTTP layer)."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.data = json.dumps(body).encode()
        self.headers = headers or {}

    def read(self) -> bytes:
        return self.data

    def release_conn(self) -> None:
        pass


class FakeHttp:
    """Stand-in for publisher/apiclient.ApiClient: answers from a script, records when each request came."""

    def __init__(self, answer: Callable[[int, str], FakeAnswer], clock: Callable[[], float]) -> None:
        self.answer = answer
        self.clock = clock
        self.sent: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, query: Any = None, headers: Any = None, body: Any = None,
                timeout: Any = None, stream: bool = False) -> FakeAnswer:
        with self._lock:
            self.sent.append((self.clock(), method, path))
            n = len(self.sent)
        return self.answer(n, path)


POD_LIST = {"kind": "PodList", "metadata": {"resourceVersion": "42"}, "items": []}
TOO_MANY = {"kind": "Status", "code": 429, "message": "Too many requests, please try again later."}


def throttled_once(n: int, path: str) -> FakeAnswer:
    return FakeAnswer(429, TOO_MANY, {"Retry-After": "7"}) if n == 1 else FakeAnswer(200, POD_LIST)


def test_a_429_with_retry_after_delays_the_next_relist_that_long():
    sim = SimTime(until=120, max_calls=2)
    http = FakeHttp(throttled_once, sim.clock)
    kube = Kube(http)
    failures: list[Exception] = []

    def relist() -> str:
        sim.request()
        return kube.list_pods_on_node("node-a")["metadata"]["resourceVersion"]

    follow(sim, relist, lambda rv: "", failures.append, clock=sim.clock, rng=random.Random(1))
    assert [getattr(f, "code", None) for f in failures] == [429]
    (first, *_), (second, *_) = http.sent[:2]
    assert second - first >= 7.0, f"relisted {second - first:.2f} s after a 429 with Retry-After: 7"


def test_the_real_client_carries_a_429s_retry_after_to_the_error(tmp_path):
    # The header path under FakeHttp, for real: urllib3 over TLS to a local server that throttles.
    import http.server
    import ssl
    import subprocess

    from publisher.kube.apiclient import ApiClient, Endpoint

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)

    class Throttled(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(TOO_MANY).encode()
            self.send_response(429)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Throttled)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kube = Kube(ApiClient(Endpoint(server=f"https://127.0.0.1:{server.server_address[1]}",
                                       ca_pem=cert.read_bytes())))
        try:
            kube.list_pods_on_node("node-a")
        except TransientError as exc:
            assert (exc.code, exc.retry_after) == (429, 7.0)
        else:
            raise AssertionError("a 429 was not raised as TransientError")
    finally:
        server.shutdown()
        server.server_close()


def dirty_claim_service(tmp_path: Path, answer: Callable[[int, str], FakeAnswer]) -> Any:
    from publisher.observe.metrics import Metrics
    from publisher.service import Service, Settings

    kube = Kube(FakeHttp(answer, lambda: 0.0))
    return Service(Settings(node_name="node-a", state_dir=str(tmp_path / "state"), spool_dir=str(tmp_path / "spool"),
                            workers=1, emit_events=False), kube, Metrics())


def test_a_claim_refused_with_retry_after_is_not_retried_before_it(tmp_path):
    from publisher.clock import node_seconds

    svc = dirty_claim_service(tmp_path, lambda n, path: FakeAnswer(429, TOO_MANY, {"Retry-After": "7"}))
    try:
        svc.journal.finish(None, "", "", dirty=[("ns", "claim-a")])
        before = node_seconds()
        svc.housekeeping.retry_dirty()
        assert svc.journal.dirty_claims(before + 6.5) == [], "the claim is due again before its Retry-After"
        assert [c[:2] for c in svc.journal.dirty_claims(node_seconds() + 7.5 + 5.0)] == [("ns", "claim-a")]
    finally:
        svc.stop()


def test_an_event_refused_with_retry_after_is_not_retried_before_it(tmp_path):
    from cni_plugin.wire.event import Event, PodRef
    from publisher.clock import node_seconds

    svc = dirty_claim_service(tmp_path, lambda n, path: FakeAnswer(429, TOO_MANY, {"Retry-After": "7"}))
    try:
        ev = Event(op="ADD", container_id="c1", ifname="eth0", driver="nic.example.com", network="net",
                   request="nic", pod=PodRef("ns", "pod-a", "uid-a"), result={"cniVersion": "1.1.0"},
                   cni_version="1.1.0")
        assert svc.journal.append(ev)
        (pending,) = svc.journal.ready(0, 1, 1e18)
        before = node_seconds()
        svc.rules.process(pending)
        assert svc.journal.ready(0, 1, before + 6.5) == [], "the event is due again before its Retry-After"
        assert len(svc.journal.ready(0, 1, node_seconds() + 7.5 + 5.0)) == 1
    finally:
        svc.stop()


# ---------------------------------------------------------------- the client-side rate limit


def test_the_rate_limit_lets_a_burst_of_10_through_then_5_per_second():
    sim = SimTime(until=1e9)
    http = FakeHttp(lambda n, path: FakeAnswer(200, POD_LIST), sim.clock)
    kube = Kube(http, limiter=TokenBucket(5.0, 10, clock=sim.clock, sleep=sim.wait))
    for _ in range(30):
        kube.list_pods_on_node("node-a")
    times = [t for t, _, _ in http.sent]
    assert times[:10] == [0.0] * 10, "the burst of 10 was not let through at once"
    assert [round(b - a, 6) for a, b in zip(times[10:], times[11:])] == [0.2] * 19
    assert round(times[10], 6) == 0.2 and round(times[-1], 6) == 4.0


def test_a_request_waiting_for_a_token_holds_no_lock_others_need():
    # Two requests wait for tokens at the same time: the second reserves its slot while the first
    # still sleeps (a lock held across the wait would queue it behind that sleep).
    sleeping: list[float] = []
    release = threading.Event()

    def sleep(seconds: float) -> None:
        sleeping.append(seconds)
        release.wait(60)

    http = FakeHttp(lambda n, path: FakeAnswer(200, POD_LIST), lambda: 0.0)
    kube = Kube(http, limiter=TokenBucket(5.0, 1, clock=lambda: 0.0, sleep=sleep))
    kube.list_pods_on_node("node-a")  # the burst of 1
    threads = [threading.Thread(target=kube.list_pods_on_node, args=("node-a",)) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = threading.Event()
    for _ in range(600):
        if len(sleeping) == 2:
            break
        deadline.wait(0.1)
    release.set()
    for t in threads:
        t.join(30)
    assert sorted(round(s, 6) for s in sleeping) == [0.2, 0.4], sleeping
    assert len(http.sent) == 3
