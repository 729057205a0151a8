"""Listeners that wait for their address instead of stopping the process: who holds it, said once.

Ports above 1024 on the node's loopback and address are free to any local account. A process that
exits when its probe or metrics port is taken gives whoever binds it first a crash loop for free: no
claim published, nothing re-chained. So a listener whose address is in use is opened again after a
backoff (limits.LISTEN_RETRY_FIRST doubled up to limits.LISTEN_RETRY_CAP) for as long as it takes,
while the process does its work; the first failure of a streak is logged with the uid that holds
the address (a TCP port: the LISTEN socket's owner in /proc/net/tcp and tcp6; a unix socket: the
kernel's SO_PEERCRED), and every try is counted (netclaim_listen_address_taken_total{listener}).
The holder is often our own predecessor (a rollout's previous pod closing its listeners): uid 0 or
our own uid is said as info, any other uid as a warning.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from publisher import limits, logs
from publisher.observe.localprobe import peer_uid

LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def _address_of(hex_address: str) -> str:
    """/proc/net/tcp{,6}'s local address (host byte order words) as text."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def port_holders(host: str, port: int, proc_net: str = "/proc/net") -> list[int]:
    """The uids owning a listening TCP socket on `host`:`port` (or on the wildcard address), sorted."""
    wanted = {host.strip("[]"), "0.0.0.0", "::", f"::ffff:{host}"}
    uids: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_net, name), encoding="ascii") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            local, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and (not host or _address_of(local) in wanted):
                uids.add(int(fields[7]))
    return sorted(uids)


def socket_holder(path: str) -> list[int]:
    """The uid of the process accepting on the unix socket at `path` ([] when none does)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(path)
            return [peer_uid(sock)]
    except OSError:
        return []


def holders(address: str) -> list[int]:
    if address.startswith("/"):
        return socket_holder(address)
    host, _, port = address.rpartition(":")
    return port_holders(host, int(port)) if port.isdigit() else []


@dataclass
class KeptListener:
    """A listener (`open` binds and starts it, returns the server) opened now, or as soon as its address is free.

    `listener` names it in the log and the metric: metrics, probe (a TCP probe port), probe-socket."""

    listener: str
    address: str
    open: Callable[[], Any]
    taken: Callable[[str], None] = lambda _listener: None  # netclaim_listen_address_taken_total{listener}
    server: Any = None
    tries: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> KeptListener:
        """Open it now; when its address is in use, keep trying in the background. Other errors raise."""
        if not self._try():
            self.thread = threading.Thread(target=self._retry, name=f"listen-{self.listener}", daemon=True)
            self.thread.start()
        return self

    @property
    def what(self) -> str:
        kind = "socket" if self.address.startswith("/") else "port"
        return f"{self.listener.removesuffix('-socket')} {kind} {self.address}"

    def _try(self) -> bool:
        try:
            self.server = self.open()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            self.tries += 1
            self.taken(self.listener)
            if self.tries == 1:
                self._say_taken()
            return False
        if self.tries:
            logs.get().info(f"{self.what} is ours now", extra={"listener": self.listener, "address": self.address,
                                                               "tries": self.tries})
        return True

    def _say_taken(self) -> None:
        uids = holders(self.address)
        who = "uid " + ",".join(str(u) for u in uids) if uids else "another process (its uid unknown)"
        ours = bool(uids) and set(uids) <= {0, os.getuid()}
        fields = {"listener": self.listener, "address": self.address, "uids": uids}
        if ours:
            logs.get().info(f"{self.what} is held by {who} (a rollout's previous pod?): opened once it is free",
                            extra=fields)
        else:
            logs.get().warning(f"{self.what} is held by {who}: opened once it is free; the work goes on meanwhile",
                               extra=fields)

    def _retry(self) -> None:
        delay = limits.LISTEN_RETRY_FIRST
        said = False
        while not self.stopping.wait(delay):
            try:
                if self._try():
                    return  # stop() joins this thread before it closes the server
            except OSError as exc:  # anything but "in use" now (the address went away): keep trying, said once
                if not said:
                    logs.get().warning(f"{self.what} cannot be opened", extra={
                        "listener": self.listener, "error": f"{type(exc).__name__}: {exc}"[:300]})
                said = True
            delay = min(delay * 2, limits.LISTEN_RETRY_CAP)

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=limits.LISTEN_RETRY_CAP + 1)
        if self.server is not None:
            self.server.stop()
            self.server = None


def keep_listening(listener: str, address: str, open_: Callable[[], Any],
                   taken: Callable[[str], None] = lambda _listener: None) -> KeptListener | None:
    """A started KeptListener for `address`, or None when no address is configured."""
    return KeptListener(listener, address, open_, taken).start() if address else None
