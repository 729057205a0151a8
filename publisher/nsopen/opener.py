"""`netclaim-publisher netns-opener`: the program that holds CAP_SYS_ADMIN for the live watch.

It has no TCP listener, no API token and no journal. It serves one unix
socket (SOCK_SEQPACKET, one request per connection, handled in turn with a
deadline), answers only peers whose uid SO_PEERCRED shows as root or one it
was given, opens only netns files directly in its configured directories
(netnsfile.open_netns: no symlink, no FIFO, nsfs only), creates the two
rtnetlink sockets inside that netns from a throwaway thread, and hands them
over with SCM_RIGHTS together with the netns's (st_dev, st_ino). What it
gives away is what the capability is for: sockets that see one pod's links
and addresses.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import threading
from dataclasses import dataclass
from typing import Any

from publisher.nsopen import wire
from publisher.nsopen.netnsfile import DEFAULT_NETNS_DIRS, NotANetns, NotWatchable, identity_of, open_netns, sockets_in

LOG_FIELDS = {"component": "netns-opener"}


@dataclass(frozen=True)
class OpenerSettings:
    socket_path: str
    netns_dirs: tuple[str, ...] = DEFAULT_NETNS_DIRS
    allowed_uids: tuple[int, ...] = ()  # besides root
    deadline: float = 5.0  # seconds a peer has to send its request and take the answer


class Opener:
    def __init__(self, settings: OpenerSettings, log: logging.Logger) -> None:
        self.settings = settings
        self.log = log
        self.listener: socket.socket | None = None

    def listen(self) -> None:
        """Bind the socket: a stale socket file is replaced, anything else at the path is an error."""
        path = self.settings.socket_path
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        if self.settings.allowed_uids:  # the file lets them connect; SO_PEERCRED decides who is served
            os.chmod(path, 0o666)
        listener.listen(16)
        listener.settimeout(0.5)
        self.listener = listener

    def serve(self, stopping: threading.Event) -> None:
        assert self.listener is not None
        while not stopping.is_set():
            try:
                conn, _addr = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(self.settings.deadline)
                try:
                    self.handle(conn)
                except OSError as exc:  # the peer went away or was too slow: its loss
                    self.log.info("netns request dropped", extra={**LOG_FIELDS, "error": str(exc)})

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.settings.socket_path)
            except OSError:
                pass

    def allowed(self, uid: int) -> bool:
        return uid == 0 or uid in self.settings.allowed_uids

    def handle(self, conn: socket.socket) -> None:
        """Read the request (so the peer's send never meets a closed socket), then judge the peer."""
        data = conn.recv(wire.MAX_MESSAGE)
        pid, uid = wire.peer_uid(conn)
        if not self.allowed(uid):
            self.log.warning("netns request refused: peer not allowed", extra={**LOG_FIELDS, "pid": pid, "uid": uid})
            conn.send(wire.encode(refusal(errno.EACCES, f"uid {uid} is not allowed", "not-watchable")))
            return
        try:
            request = wire.decode(data)
        except (ValueError, TypeError):
            conn.send(wire.encode(refusal(errno.EINVAL, "malformed request")))
            return
        if request.get("op") == "ping":
            conn.send(wire.encode({"ok": True}))
            return
        path = request.get("netns")
        if request.get("op") != "open" or not isinstance(path, str) or len(path) > 1024:
            conn.send(wire.encode(refusal(errno.EINVAL, "unknown request")))
            return
        self.open_for(conn, path, pid)

    def open_for(self, conn: socket.socket, path: str, pid: int) -> None:
        try:
            fd = open_netns(path, self.settings.netns_dirs)
        except OSError as exc:
            self._refused(conn, path, pid, exc)
            return
        try:
            ident = identity_of(fd)
            events, reader = sockets_in(fd, path)
        except OSError as exc:
            self._refused(conn, path, pid, exc)
            return
        finally:
            os.close(fd)
        with events, reader:
            socket.send_fds(conn, [wire.encode({"ok": True, "dev": ident[0], "ino": ident[1]})],
                            [events.fileno(), reader.fileno()])
        self.log.debug("netns opened", extra={**LOG_FIELDS, "netns": path, "pid": pid})

    def _refused(self, conn: socket.socket, path: str, pid: int, exc: OSError) -> None:
        kind = "not-a-netns" if isinstance(exc, NotANetns) else "not-watchable" if isinstance(exc, NotWatchable) else ""
        self.log.info("netns not opened", extra={**LOG_FIELDS, "netns": path, "pid": pid,
                                                  "error": exc.strerror or str(exc)})
        conn.send(wire.encode(refusal(exc.errno or errno.EIO, exc.strerror or str(exc), kind,
                                      str(exc.filename) if exc.filename is not None else path)))


def refusal(code: int, text: str, kind: str = "", filename: str = "") -> dict[str, Any]:
    return {"ok": False, "errno": code, "error": text, "kind": kind, "filename": filename}
