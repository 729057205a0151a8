"""Receive: the unix socket the plugin hands its events to.

Only root may talk to it by default (SO_PEERCRED), because an event makes the
publisher write API objects with the node's credentials. Frames are bounded
(cni_plugin.wire.MAX_FRAME); an oversized or malformed frame gets an error
reply and that connection is closed, the server keeps serving. An event is
acknowledged only after the journal committed it.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import threading
from typing import Any, Callable

from cni_plugin.wire.event import Event, NewerVersion, WireError
from cni_plugin.wire.frame import MAX_FRAME, encode_frame, read_frame
from publisher import logs
from publisher.observe.metrics import Metrics

CONN_TIMEOUT = 10.0
DRAIN_TIMEOUT = 1.0  # how long a refused peer may keep sending before we close
MAX_CONNECTIONS = 64
_UCRED = struct.Struct("3i")


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)


def served(path: str) -> bool:
    """Whether a process accepts connections on the unix socket at `path` (a refused or absent one: no)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
        return False
    finally:
        probe.close()
    return True


class SocketServer:
    def __init__(
        self,
        path: str,
        submit: Callable[[Event], tuple[bool, str]],
        status: Callable[..., dict[str, Any]],
        metrics: Metrics,
        allowed_uids: tuple[int, ...] = (),
        allowed_gids: tuple[int, ...] = (),
        max_frame: int = MAX_FRAME,
        resync: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.submit = submit
        self.status = status
        self.resync = resync  # `netclaim-publisher resync`: every tracked claim verified now
        self.metrics = metrics
        self.allowed_uids = {0, *allowed_uids}
        self.allowed_gids = set(allowed_gids)
        self.max_frame = max_frame
        self.log = logs.get()
        self._sock: socket.socket | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ setup

    def _prepare_path(self) -> None:
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700)
            os.chmod(parent, 0o700)
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise RuntimeError(f"{self.path} exists and is not a socket")
        if served(self.path):
            raise RuntimeError(f"another publisher is serving {self.path}")
        os.unlink(self.path)  # left over from a crashed publisher

    def start(self) -> None:
        self._prepare_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        if self.allowed_gids:
            # Group members may connect (SO_PEERCRED still decides); the first gid owns the socket.
            os.chown(self.path, 0, min(self.allowed_gids))
            os.chmod(self.path, 0o660)
        else:
            os.chmod(self.path, 0o600)
        sock.listen(128)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="socket", daemon=True)
        self._thread.start()
        self.log.info("listening", extra={"socket": self.path})

    def serving(self) -> str:
        """"" while the accept loop runs; otherwise why not (a liveness check: nothing else accepts)."""
        if self._thread is not None and not self._thread.is_alive() and not self._stopping.is_set():
            return "thread: the socket's accept loop has ended"
        return ""

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # ------------------------------------------------------------ serving

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            if not self._slots.acquire(timeout=CONN_TIMEOUT):
                self.metrics.events_rejected.labels("too_many_connections").inc()
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="conn", daemon=True).start()

    def _allowed(self, uid: int, gid: int) -> bool:
        return uid in self.allowed_uids or gid in self.allowed_gids

    def _reply(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            conn.sendall(encode_frame(message))
        except OSError:
            pass

    def _reply_and_close(self, conn: socket.socket, message: dict[str, Any]) -> None:
        """Send a final error reply so that the peer can actually read it.

        Closing a unix socket that still has unread input resets the peer's
        pending send, so a refused or misbehaving client would see EPIPE instead
        of the reason. Half-close our side, then discard what the peer still
        sends, bounded in bytes and time, before the caller closes.
        """
        self._reply(conn, message)
        try:
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(DRAIN_TIMEOUT)
            budget = 2 * self.max_frame
            while budget > 0:
                chunk = conn.recv(min(budget, 65536))
                if not chunk:
                    break
                budget -= len(chunk)
        except OSError:
            pass

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(CONN_TIMEOUT)
            pid, uid, gid = peer_credentials(conn)
            if not self._allowed(uid, gid):
                self.metrics.peers_refused.inc()
                self.log.warning("peer refused", extra={"peer_pid": pid, "peer_uid": uid, "peer_gid": gid})
                self._reply_and_close(conn, {"ok": False, "error": f"peer uid {uid} gid {gid} is not allowed"})
                return
            while not self._stopping.is_set():
                try:
                    message = read_frame(conn, self.max_frame)
                except EOFError:
                    return
                except WireError as exc:
                    self.metrics.events_rejected.labels("bad_frame").inc()
                    self.log.warning("bad frame, closing connection", extra={"peer_pid": pid, "error": str(exc)})
                    self._reply_and_close(conn, {"ok": False, "error": str(exc)})
                    return
                except (socket.timeout, OSError):
                    return
                if not self._dispatch(conn, message, pid):
                    return
        finally:
            try:
                conn.close()
            finally:
                self._slots.release()

    def _dispatch(self, conn: socket.socket, message: dict[str, Any], pid: int) -> bool:
        """Answer one request; False closes the connection."""
        kind = message.get("kind")
        if kind == "status":
            # {"brief": true}: only the counters (quiescence polls), not the per-claim list.
            try:
                st = self.status(brief=True) if message.get("brief") is True else self.status()
            except Exception as exc:  # noqa: BLE001 - e.g. the journal's read connection busy past its bound
                self.log.warning("status unavailable", extra={"error": str(exc)})
                self._reply(conn, {"ok": False, "error": f"status unavailable: {exc}"})
                return True
            self._reply(conn, {"ok": True, "status": st})
            return True
        if kind == "resync" and self.resync is not None:
            self.resync()
            self.log.info("resync requested", extra={"peer_pid": pid})
            self._reply(conn, {"ok": True})
            return True
        if kind != "event":
            self.metrics.events_rejected.labels("bad_request").inc()
            self._reply(conn, {"ok": False, "error": f"unknown request kind {kind!r}"})
            return False
        try:
            event = Event.from_dict(message.get("event"))
        except NewerVersion as exc:  # a newer plugin's event: refused, the plugin spools it for a newer publisher
            self.metrics.events_rejected.labels("newer_version").inc()
            self.log.warning("event of a newer wire version refused (upgrade the publisher first)",
                             extra={"peer_pid": pid, "error": str(exc)})
            self._reply(conn, {"ok": False, "error": str(exc)})
            return False
        except (WireError, TypeError) as exc:
            self.metrics.events_rejected.labels("bad_event").inc()
            self.log.warning("malformed event, closing connection", extra={"peer_pid": pid, "error": str(exc)})
            self._reply(conn, {"ok": False, "error": str(exc)})
            return False
        try:
            ok, detail = self.submit(event)
        except Exception as exc:  # journal unwritable (disk full...): the plugin will spool
            self.log.exception("journal commit failed", extra=logs.attachment_fields(
                event.pod, "", event.container_id, event.ifname))
            self._reply(conn, {"ok": False, "error": f"journal commit failed: {exc}"})
            return False
        self._reply(conn, {"ok": True, "id": detail} if ok else {"ok": False, "error": detail})
        return True
