"""One install at a time on a node: the chain keeper's lock, and who took the node last.

`helm uninstall` followed at once by `helm install` gives the node two
netclaim pods at the same moment: the old one's keeper is cleaning the node
up (unchain, remove the plugin, empty the socket dir and the journal), the
new one's init container installs the plugin and chains it, and its
publisher creates its socket and journal. Unserialised, the old cleanup
deletes what the new install just made and leaves the node chained to a
missing plugin.

So every keeper process (the init container's `--once` and the long-running
one) first *claims* the node, writing a token of its own into the owner file
beside the lock, and then takes an exclusive flock on the lock file in the
node's state dir, which the long-running keeper holds for its whole life.
The new install's init container therefore waits until the old keeper has
finished and exited, and its publisher (which starts only after the init
container) too. Before the old keeper deletes anything it checks, under the
lock, that the owner file still holds its own token: a newer claim means a
newer install is taking the node, and everything is left to it.

A keeper that sees a newer claim while it keeps the chain steps down
(publisher/keeper/keeper.py `step_down`): it releases the lock and touches
nothing more. That is what a surge rollout needs: its new pod's init
container claims the node while the old pod still runs, and the old pod is
only deleted once the new one is ready.

The lock file is removed by the cleanup that empties its dir, while still
held; a waiter that then gets the lock on the removed file notices (the
path no longer names the inode it locked) and takes the lock again on the
new file, so two holders are never possible.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import threading
from pathlib import Path
from typing import Callable

LOCK_NAME = ".netclaim-keeper.lock"
OWNER_NAME = ".netclaim-keeper.owner"
POLL = 0.1  # seconds between tries while another keeper holds the lock
OWNER_MAX_BYTES = 256


class LockBusy(Exception):
    """Another keeper holds the node's lock (only raised when not waiting)."""


class NodeLock:
    """The keeper's lock on the node (LOCK_NAME) and its claim on it (OWNER_NAME), in `directory`.

    `lock_name`/`owner_name` give the lock another use: the publisher's hold on its state dir
    (publisher/cli.py `take_state_dir`), which only acquires: a second publisher waits for the first."""

    def __init__(self, directory: Path, lock_name: str = LOCK_NAME, owner_name: str = OWNER_NAME) -> None:
        self.directory = directory
        self.path = directory / lock_name
        self.owner_path = directory / owner_name
        self.token = secrets.token_hex(16)
        self.fd: int | None = None

    def claim(self) -> None:
        """Say that this process is the newest keeper of the node (before waiting for the lock)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.directory / f"{self.owner_path.name}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.token)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.owner_path)
        finally:
            tmp.unlink(missing_ok=True)

    def superseded(self) -> bool:
        """A newer keeper claimed the node after this one (an install started since)."""
        try:
            fd = os.open(self.owner_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as exc:
            # A symlink or worse in our place: someone else's doing; assume it is not us.
            return exc.errno == errno.ELOOP
        with os.fdopen(fd, "r", errors="replace") as fh:
            return fh.read(OWNER_MAX_BYTES).strip() != self.token

    def acquire(self, stop: threading.Event | None = None, wait: bool = True,
                on_wait: Callable[[], None] = lambda: None,
                on_poll: Callable[[], None] = lambda: None) -> bool:
        """Take the lock; True when held. Waits (polling, so SIGTERM still stops the wait: False) while
        another keeper holds it; with `wait` False raises LockBusy instead. `on_wait` is called once when
        the wait begins, `on_poll` at every try while waiting (the keeper's heartbeat)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        told = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if not wait:
                    raise LockBusy(str(self.path)) from None
                if not told:
                    on_wait()
                    told = True
                on_poll()
                if (stop or threading.Event()).wait(POLL):
                    return False  # stopped (SIGTERM) while waiting
                continue
            if self._still_the_file(fd):
                self.fd = fd
                return True
            os.close(fd)  # locked a file the previous holder removed: lock the one there now

    def _still_the_file(self, fd: int) -> bool:
        try:
            on_disk = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)

    def release(self, remove: bool = False) -> None:
        """Let the next keeper in; `remove`: the node is being given back, the lock files go too."""
        if self.fd is None:
            return
        if remove:
            if not self.superseded():
                self.owner_path.unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None

    def names(self) -> frozenset[str]:
        """The lock's own files, which emptying its dir leaves to release()."""
        return frozenset({self.path.name, self.owner_path.name})
