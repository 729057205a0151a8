"""Hand an event to the publisher: socket + ack, else the spool dir.

The pod never waits on the API server, but the event must not be lost, so
"handed off" means one of two durable states: the publisher acknowledged it
(it is in its journal) or it is fsynced in the spool dir, which the publisher
replays. `ackTimeoutMs` is ONE budget for connect + send + ack together: every
socket call gets only what is left of it, so a publisher that trickles its
reply cannot stretch RunPodSandbox by a timeout per call.
"""

from __future__ import annotations

import time

import _socket

from . import wire
from .errors import TRY_AGAIN_LATER, CNIError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .config import NetConf
    from .log import Log

ACKED = "acked"
SPOOLED = "spooled"
DROPPED = "dropped"  # spool at its cap: counted in the overflow marker
LOST = "lost"


class _Deadline:
    """A socket whose every call times out at one shared deadline."""

    def __init__(self, sock: _socket.socket, timeout: float) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + timeout

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("ackTimeoutMs elapsed")
        self.sock.settimeout(left)

    def connect(self, address: str) -> None:
        self._arm()
        self.sock.connect(address)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self.sock.sendall(data)  # one timeout for the whole sendall (Python >= 3.5)

    def recv(self, n: int) -> bytes:
        self._arm()
        return self.sock.recv(n)


def send(socket_path: str, event: wire.Event, timeout: float) -> str:
    """Deliver over the unix socket within `timeout` seconds in all; returns the acked event id or raises."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        conn = _Deadline(sock, timeout)
        conn.connect(socket_path)
        conn.sendall(wire.encode_frame(wire.event_request(event)))
        reply = wire.read_frame(conn)
    finally:
        sock.close()
    if reply.get("ok") is not True:
        raise wire.WireError(f"publisher rejected the event: {reply.get('error', 'no reason given')}")
    return str(reply.get("id", event.event_id))


def socket_accepts(socket_path: str, timeout: float) -> bool:
    """Does something listen on the publisher socket? (connect, then close; no frame sent)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        return True
    except (OSError, ValueError):
        return False
    finally:
        sock.close()


def deliver(event: wire.Event, conf: NetConf, log: Log, *, may_fail: bool) -> str:
    """ACKED, SPOOLED, or (only under failurePolicy Ignore, or when `may_fail`
    is False, e.g. DEL, which must always succeed) DROPPED/LOST. Raises CNIError 11 otherwise."""
    try:
        send(conf.socket_path, event, conf.ack_timeout)
        return ACKED
    except (OSError, EOFError, wire.WireError) as exc:
        socket_error = f"{type(exc).__name__}: {exc}"
    outcome = LOST
    try:
        if not conf.spool_dir:
            raise OSError(22, "no valid spoolDir")
        path = wire.write_spool(conf.spool_dir, event, conf.spool_max_files, conf.spool_max_bytes)
        log.info("event spooled", op=event.op, eventID=event.event_id, spoolFile=path, socketError=socket_error)
        return SPOOLED
    except wire.SpoolFull as exc:
        outcome = DROPPED
        spool_error = f"SpoolFull: {exc.strerror}"
    except OSError as exc:
        spool_error = f"{type(exc).__name__}: {exc}"
    log.error("event not handed off", op=event.op, eventID=event.event_id, outcome=outcome,
              socketError=socket_error, spoolError=spool_error)
    if may_fail and conf.failure_policy == "Fail":
        raise CNIError(TRY_AGAIN_LATER, "cannot hand the event to netclaim-publisher (socket and spool both failed)",
                       f"socket: {socket_error}; spool: {spool_error}")
    return outcome
