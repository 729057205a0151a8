"""The publisher's socket (publisher.intake.server.SocketServer) on its own.

A real unix socket in a temp directory, the kernel's SO_PEERCRED, real frames
(cni_plugin.wire.frame); the journal is replaced by the one thing the server asks of it, a
submit callable, which records what it was given and can be held. So these tests see what the
server alone decides: an ack only after submit returned and carrying what submit said, an
error reply and a closed connection for a frame it must not read, and a refusal for a peer
whose uid it does not allow (the whole publisher's socket is tested in test_publisher_socket.py).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from peers import run_as_uid
from publisher_testkit import wait_until

from cni_plugin.wire.event import Event, PodRef
from cni_plugin.wire.frame import MAX_FRAME, encode_frame, event_request, read_frame
from publisher.intake.server import SocketServer
from publisher.observe.metrics import Metrics

OTHER_UID = 65534  # nobody: a peer that is not root


def add_event(cid: str) -> Event:
    return Event(op="ADD", container_id=cid, ifname="eth0", driver="net.example.com",
                 pod=PodRef("team-a", "web-0", "uid-1"), result={"interfaces": [], "ips": []})


@dataclass
class Submitted:
    """The submit callable the server is given: records each event; `hold` keeps it from returning."""

    events: list[Event] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    answer: Callable[[Event], tuple[bool, str]] = lambda ev: (True, ev.event_id)

    def __post_init__(self) -> None:
        self.hold.set()  # returns at once unless a test clears it

    def __call__(self, event: Event) -> tuple[bool, str]:
        self.events.append(event)
        self.hold.wait(60)
        return self.answer(event)


@dataclass
class Served:
    server: SocketServer
    submitted: Submitted
    metrics: Metrics

    @property
    def path(self) -> str:
        return self.server.path

    def counter(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(self.path)
        return sock


@pytest.fixture()
def serve(workdir: Path) -> Iterator[Callable[..., Served]]:
    """Start servers on sockets in the temp dir; every one is stopped at teardown."""
    started: list[SocketServer] = []

    def make(allowed_uids: tuple[int, ...] = ()) -> Served:
        submitted, metrics = Submitted(), Metrics()
        server = SocketServer(path=str(workdir / f"run{len(started)}" / "publisher.sock"), submit=submitted,
                              status=lambda **kw: {"brief": bool(kw.get("brief"))}, metrics=metrics,
                              allowed_uids=allowed_uids)
        started.append(server)
        server.start()
        return Served(server, submitted, metrics)

    yield make
    for server in started:
        server.stop()


def closed_by_server(sock: socket.socket) -> bool:
    return sock.recv(1) == b""


def test_an_event_is_acked_only_after_submit_returned_with_the_id_it_gave(serve: Callable[..., Served]) -> None:
    s = serve()
    s.submitted.hold.clear()
    ev = add_event("c-ack")
    with s.connect() as sock:
        sock.sendall(encode_frame(event_request(ev)))
        wait_until("submit to be called", lambda: s.submitted.events)
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # submit has not returned: no reply can be there
            sock.recv(1)
        sock.setblocking(True)
        sock.settimeout(10)
        s.submitted.hold.set()
        assert read_frame(sock) == {"ok": True, "id": ev.event_id}
        assert [e.event_id for e in s.submitted.events] == [ev.event_id]
        assert s.submitted.events[0].to_dict() == ev.to_dict()

        second = add_event("c-next")  # the connection stays open for the next request
        sock.sendall(encode_frame(event_request(second)))
        assert read_frame(sock) == {"ok": True, "id": second.event_id}


def test_a_submit_that_fails_is_an_error_reply_so_the_plugin_spools(serve: Callable[..., Served]) -> None:
    s = serve()

    def journal_unwritable(event: Event) -> tuple[bool, str]:
        raise OSError(28, "No space left on device")

    s.submitted.answer = journal_unwritable
    with s.connect() as sock:
        sock.sendall(encode_frame(event_request(add_event("c-full"))))
        reply = read_frame(sock)
        assert reply["ok"] is False and "journal commit failed" in reply["error"], reply
        assert closed_by_server(sock)


def test_a_frame_over_max_frame_is_refused_unread_and_the_connection_closed(serve: Callable[..., Served]) -> None:
    s = serve()
    with s.connect() as sock:
        sock.sendall(struct.pack("!I", MAX_FRAME + 1))  # the header alone: the body is never read
        reply = read_frame(sock)
        assert reply["ok"] is False and f"exceeds {MAX_FRAME}" in reply["error"], reply
        assert closed_by_server(sock)
    assert s.submitted.events == []
    assert s.counter("netclaim_events_rejected_total", {"reason": "bad_frame"}) == 1
    ev = add_event("c-after")  # the server keeps serving
    with s.connect() as sock:
        sock.sendall(encode_frame(event_request(ev)))
        assert read_frame(sock) == {"ok": True, "id": ev.event_id}


@pytest.mark.parametrize("body", [b"[12]", b'"event"', b"12"], ids=["list", "string", "number"])
def test_a_frame_that_is_no_object_gets_an_error_and_the_connection_closed(serve: Callable[..., Served],
                                                                           body: bytes) -> None:
    s = serve()
    with s.connect() as sock:
        sock.sendall(struct.pack("!I", len(body)) + body)
        reply = read_frame(sock)
        assert reply == {"ok": False, "error": "frame must be a JSON object"}
        assert closed_by_server(sock)
    assert s.submitted.events == []
    assert s.counter("netclaim_events_rejected_total", {"reason": "bad_frame"}) == 1


def test_an_event_that_is_no_object_gets_an_error_and_the_connection_closed(serve: Callable[..., Served]) -> None:
    s = serve()
    with s.connect() as sock:
        sock.sendall(encode_frame({"kind": "event", "event": ["ADD"]}))
        reply = read_frame(sock)
        assert reply["ok"] is False and "must be a JSON object" in reply["error"], reply
        assert closed_by_server(sock)
    assert s.submitted.events == []
    assert s.counter("netclaim_events_rejected_total", {"reason": "bad_event"}) == 1


def send_as(uid: int, path: str, message: dict[str, Any]) -> dict[str, Any]:
    """One request from a child process running as `uid`; its reply."""

    def send() -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(encode_frame(message))
            return read_frame(sock)

    return run_as_uid(uid, send)


def reachable_by_everyone(s: Served) -> None:
    """Let another uid reach the socket file, so that SO_PEERCRED is what decides."""
    d = os.path.dirname(s.path)
    for p in (os.path.dirname(d), d):
        os.chmod(p, 0o711)
    os.chmod(s.path, 0o666)


def test_a_peer_whose_uid_is_not_allowed_is_refused_before_anything_is_read(serve: Callable[..., Served]) -> None:
    s = serve()
    reachable_by_everyone(s)
    ev = add_event("c-nobody")
    reply = send_as(OTHER_UID, s.path, event_request(ev))
    assert reply == {"ok": False, "error": f"peer uid {OTHER_UID} gid {OTHER_UID} is not allowed"}
    assert s.submitted.events == []
    assert s.counter("netclaim_peers_refused_total") == 1

    allowed = serve(allowed_uids=(OTHER_UID,))  # the same peer, allowed by configuration
    reachable_by_everyone(allowed)
    assert send_as(OTHER_UID, allowed.path, event_request(ev)) == {"ok": True, "id": ev.event_id}
    assert [e.event_id for e in allowed.submitted.events] == [ev.event_id]
    assert allowed.counter("netclaim_peers_refused_total") == 0


def test_root_is_allowed_whatever_uids_are_configured(serve: Callable[..., Served]) -> None:
    s = serve(allowed_uids=(OTHER_UID,))
    ev = add_event("c-root")
    with s.connect() as sock:
        sock.sendall(encode_frame(event_request(ev)))
        assert read_frame(sock) == {"ok": True, "id": ev.event_id}
    assert s.counter("netclaim_peers_refused_total") == 0
