"""Hand an event to the publisher: socket + ack, else the spool dir.

The pod never waits on the API server, but the event must not be lost, so
"handed off" means one of two states: the publisher acknowledged it (it is
committed to its journal) or it is in the spool dir, written whole and renamed
into place, which the publisher replays. Neither waits for an fsync: what an
OS crash can take from either belongs to sandboxes the same crash destroyed
(docs/plugin.md, "The spool writes no fsync").

`ackTimeoutMs` is ONE budget for connect + send + ack together: every
socket call gets only what is left of it, so a publisher that trickles its
reply cannot stretch RunPodSandbox by a timeout per call. When the spool
cannot take the event either, `handoffWaitMs` is the last chance: a
publisher restart on a node with a read-only or full spool would otherwise
lose every event of the second its socket is absent. A wait that ends without
the publisher is remembered (`publisher-absent` in `stateDir`), and for
QUIET_PERIOD after it no hand-off waits again unless a publisher has bound or
removed the socket since: a node left chained without its publisher (its spool
soon at the cap) costs one pod start in QUIET_PERIOD the wait, not every pod
start and stop.

The socket counts only when root serves it (SO_PEERCRED of the listener):
an event sent to a socket someone else bound at the configured path would
be lost (and leak pod details), so that is "publisher unavailable" and the
event is spooled. An event over MAX_EVENT_BYTES goes nowhere: under
failurePolicy Fail it is a config error (7: the prevResult is too large for
netclaim to report, and retrying cannot change that), under Ignore a logged drop.
"""

from __future__ import annotations

import _socket
import sys
import time

from .lean import posixos as os
from .lean.errors import TRY_AGAIN_LATER, CNIError, config_error
from .lean.jsonio import JSONError, dumps, loads
from .lean.safefs import open_dir, open_private_dir, read_at, write_file_at
from .wire.event import Event, EventTooLarge, WireError, encode_event
from .wire.frame import event_frame, read_frame
from .wire.spool import SpoolFull, write_spool

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .config import NetConf
    from .log import Log

ACKED = "acked"
SPOOLED = "spooled"
DROPPED = "dropped"  # spool at its cap: counted in the overflow marker
LOST = "lost"
TOO_LARGE = "too-large"  # over MAX_EVENT_BYTES: refused on both channels


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


_UCRED_SIZE = 12  # struct ucred: pid, uid, gid (three C ints)


def check_peer(sock: _socket.socket, socket_path: str) -> None:
    """PermissionError unless root (or this process's own uid) serves the socket."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED_SIZE)
    uid = int.from_bytes(raw[4:8], sys.byteorder)
    if uid not in (0, os.geteuid()):
        raise PermissionError(1, f"{socket_path} is served by uid {uid}, not root: not the publisher")


def send(socket_path: str, data: bytes | Event, timeout: float) -> str:
    """Deliver an event (or its encode_event bytes) within `timeout` seconds in all.

    Returns the acked event id or raises.
    """
    if isinstance(data, Event):
        data = encode_event(data)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        conn = _Deadline(sock, timeout)
        conn.connect(socket_path)
        check_peer(sock, socket_path)
        conn.sendall(event_frame(data))
        reply = read_frame(conn)
    finally:
        sock.close()
    if reply.get("ok") is not True:
        raise WireError(f"publisher rejected the event: {reply.get('error', 'no reason given')}")
    return str(reply.get("id", ""))


def socket_accepts(socket_path: str, timeout: float) -> bool:
    """Does root's publisher listen on the socket? (connect, check the peer, close; no frame sent)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        check_peer(sock, socket_path)
        return True
    except (OSError, ValueError):
        return False
    finally:
        sock.close()


def deliver(event: Event, conf: NetConf, log: Log, *, may_fail: bool) -> str:
    """ACKED, SPOOLED, or (only under failurePolicy Ignore, or when `may_fail`
    is False, e.g. DEL, which must always succeed) DROPPED/LOST/TOO_LARGE.
    Raises CNIError otherwise: 7 for an event over the cap, 11 when neither
    channel took it. 11, not 5: the cause is the node's state (publisher
    down and spool full, read-only or unsafe), not this pod's input; it
    clears when the publisher returns or space is freed, and the runtime
    retries the sandbox. The errno text is in `details`."""
    try:
        data = encode_event(event)
    except EventTooLarge as exc:
        return _too_large(event, conf, log, str(exc), may_fail)
    try:
        send(conf.socket_path, data, conf.ack_timeout)
        return ACKED
    except (OSError, EOFError, WireError) as exc:
        socket_error = f"{type(exc).__name__}: {exc}"
    outcome = LOST
    try:
        if not conf.spool_dir:
            raise OSError(22, "no valid spoolDir")
        path = write_spool(conf.spool_dir, event, conf.spool_max_files, conf.spool_max_bytes, data=data)
        log.info("event spooled", op=event.op, eventID=event.event_id, spoolFile=path, socketError=socket_error)
        return SPOOLED
    except SpoolFull as exc:
        outcome = DROPPED
        spool_error = f"SpoolFull: {exc.strerror}"
    except OSError as exc:
        spool_error = f"{type(exc).__name__}: {exc}"
    failed_at = last_failed_wait(conf) if conf.handoff_wait > 0 else None
    skipped: dict[str, object] = {}
    if failed_at is None:
        waited = _wait_for_publisher(conf, data)
        if waited is not None:
            _forget_failed_wait(conf)
            log.info("event handed off after waiting for the publisher", op=event.op, eventID=event.event_id,
                     waitedMs=round(waited * 1000), socketError=socket_error, spoolError=spool_error)
            return ACKED
        waited_ms = round(conf.handoff_wait * 1000)
        if waited_ms:
            problem = _remember_failed_wait(conf)
            if problem:
                skipped["waitMarkerError"] = problem
    else:
        waited_ms = 0
        skipped = {"waitSkipped": True, "lastFailedWaitAt": _iso(failed_at)}
    log.error("event not handed off", op=event.op, eventID=event.event_id, outcome=outcome,
              socketError=socket_error, spoolError=spool_error, waitedMs=waited_ms, **skipped)
    if may_fail and conf.failure_policy == "Fail":
        wait = (f"no wait: one ended without the publisher at {_iso(failed_at)}" if failed_at is not None
                else f"waited {waited_ms} ms")
        raise CNIError(TRY_AGAIN_LATER, "cannot hand the event to netclaim-publisher (socket and spool both failed)",
                       f"socket: {socket_error}; spool: {spool_error}; {wait}")
    return outcome


_RETRY_EVERY = 0.05


def _wait_for_publisher(conf: NetConf, data: bytes) -> float | None:
    """The last chance before an event is lost: keep trying the socket for `handoffWaitMs`.

    Only reached when neither channel took the event, which a publisher restart
    on a node whose spool is read-only or full produces for about a second; the
    pod waits at most this long, and only on a node already in that state and
    not within QUIET_PERIOD of a wait that ended without the publisher.
    Returns the seconds waited once the publisher acked, None when it never did.
    """
    start = time.monotonic()
    deadline = start + conf.handoff_wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(_RETRY_EVERY, left))
        try:
            send(conf.socket_path, data, max(0.001, min(conf.ack_timeout, deadline - time.monotonic())))
            return time.monotonic() - start
        except (OSError, EOFError, WireError):
            continue


# ---------------------------------------------------------------- a wait that ended without the publisher
#
# A publisher restart lasts about a second; a publisher that is gone for good (a node left chained
# after `helm uninstall` missed it, a crash-looping container, a disabled unit) fills the spool to
# its cap, and without a memory of the failed wait every later ADD, DEL and CHECK would wait
# `handoffWaitMs` for nothing. So a wait that ends without the publisher leaves the marker
# `publisher-absent` ({"socketPath", "waitFailedAt"}), and a hand-off that finds neither channel
# within QUIET_PERIOD of it loses (or, under Fail, refuses) its event at once, still counted in the
# spool's overflow marker, unless a publisher has bound or removed the socket since (the socket's
# directory changed after the failed wait: a publisher started or stopped), which earns one more
# wait; a wait that reaches the publisher removes the marker.
#
# The marker lives in `stateDir`, not in the spool: a read-only spool is exactly when the wait
# matters, so the spool is no place to remember it; stateDir is the plugin's own 0700 directory
# (opened like the state files: no link followed, every ancestor trusted), which the publisher
# never reads, and its names (`<network>:...state.json`) cannot collide with this one. When
# stateDir cannot be written either, nothing is remembered and every hand-off waits, as before.
# No fsync: a crash that loses the marker costs one more wait.

QUIET_PERIOD = 120.0  # seconds after a failed wait in which no hand-off waits again
ABSENT_NAME = "publisher-absent"
_ABSENT_LIMIT = 4096  # the marker is ~100 bytes; anything bigger is not ours


def last_failed_wait(conf: NetConf) -> float | None:
    """When (time.time()) a wait for this socket's publisher ended without it, if that was within
    QUIET_PERIOD and no publisher has bound or removed the socket since; else None (the hand-off waits)."""
    if not conf.state_dir:
        return None
    try:
        dfd = open_dir(conf.state_dir, 0o700, create=False)
    except OSError:
        return None
    try:
        raw = read_at(dfd, ABSENT_NAME, _ABSENT_LIMIT)
        marker = loads(raw.decode())
    except (OSError, UnicodeDecodeError, JSONError):
        return None
    finally:
        os.close(dfd)
    if not isinstance(marker, dict) or marker.get("socketPath") != conf.socket_path:
        return None
    failed_at = marker.get("waitFailedAt")
    if isinstance(failed_at, bool) or not isinstance(failed_at, (int, float)):
        return None
    if not 0 <= time.time() - failed_at < QUIET_PERIOD:  # older, or a clock set back: wait again
        return None
    if _bound_since(conf.socket_path, failed_at):
        return None
    return float(failed_at)


def _bound_since(socket_path: str, when: float) -> bool:
    """Has a publisher bound or removed its socket after `when`?

    Either changes the socket's directory (its mtime), which nothing else the
    publisher does touches: a publisher that came back and stopped again (a
    clean stop removes the socket) is as good a reason to wait as one that is
    restarting now. A directory that is gone says nothing of the kind.
    """
    try:
        return os.lstat(os.path.dirname(socket_path) or "/").st_mtime > when
    except OSError:
        return False


def _remember_failed_wait(conf: NetConf) -> str:
    """Write the marker (0600 in the 0700 stateDir, temp file + rename); "" or why it could not be."""
    if not conf.state_dir:
        return "no valid stateDir"
    try:
        dfd = open_private_dir(conf.state_dir)
        try:
            # The time after the directory exists: creating stateDir in the socket's directory is no publisher.
            marker = {"socketPath": conf.socket_path, "waitFailedAt": time.time()}
            write_file_at(dfd, ABSENT_NAME, dumps(marker).encode(), sync=False)
        finally:
            os.close(dfd)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _forget_failed_wait(conf: NetConf) -> None:
    """The publisher acked: the next hand-off that finds neither channel waits again."""
    if not conf.state_dir:
        return
    try:
        dfd = open_dir(conf.state_dir, 0o700, create=False)
    except OSError:
        return
    try:
        os.unlink(ABSENT_NAME, dir_fd=dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _too_large(event: Event, conf: NetConf, log: Log, problem: str, may_fail: bool) -> str:
    """An event over the cap is never handed off: a config error under Fail, a logged drop otherwise."""
    log.error("event not handed off: too large", op=event.op, eventID=event.event_id, outcome=TOO_LARGE,
              error=problem)
    if may_fail and conf.failure_policy == "Fail":
        raise config_error("prevResult", f"too large to report: {problem}")
    return TOO_LARGE
