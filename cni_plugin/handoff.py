"""Hand an event to the publisher: socket + ack, else the spool dir.

The pod never waits on the API server, but the event must not be lost, so
"handed off" means one of two durable states: the publisher acknowledged it
(it is in its journal) or it is fsynced in the spool dir, which the publisher
replays. The socket wait is bounded by `ackTimeoutMs`.
"""

from __future__ import annotations

import _socket

from . import wire
from .errors import TRY_AGAIN_LATER, CNIError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .config import NetConf
    from .log import Log

ACKED = "acked"
SPOOLED = "spooled"
LOST = "lost"


def send(socket_path: str, event: wire.Event, timeout: float) -> str:
    """Deliver over the unix socket; returns the acked event id or raises."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(wire.encode_frame(wire.event_request(event)))
        reply = wire.read_frame(sock)
    finally:
        sock.close()
    if reply.get("ok") is not True:
        raise wire.WireError(f"publisher rejected the event: {reply.get('error', 'no reason given')}")
    return str(reply.get("id", event.event_id))


def deliver(event: wire.Event, conf: NetConf, log: Log, *, may_fail: bool) -> str:
    """ACKED or SPOOLED; LOST only under failurePolicy Ignore (or when `may_fail`
    is False, e.g. DEL, which must always succeed). Raises CNIError 11 otherwise."""
    try:
        send(conf.socket_path, event, conf.ack_timeout)
        return ACKED
    except (OSError, EOFError, wire.WireError) as exc:
        socket_error = f"{type(exc).__name__}: {exc}"
    try:
        path = wire.write_spool(conf.spool_dir, event)
        log.info("event spooled", op=event.op, eventID=event.event_id, spoolFile=path, socketError=socket_error)
        return SPOOLED
    except OSError as exc:
        spool_error = f"{type(exc).__name__}: {exc}"
    log.error("event not handed off", op=event.op, eventID=event.event_id,
              socketError=socket_error, spoolError=spool_error)
    if may_fail and conf.failure_policy == "Fail":
        raise CNIError(TRY_AGAIN_LATER, "cannot hand the event to netclaim-publisher (socket and spool both failed)",
                       f"socket: {socket_error}; spool: {spool_error}")
    return LOST
