"""Run one command inside a chroot that holds only the installed files.

    unshare --mount --propagation private -- python chrootrun.py ROOT NETNS_FILE... -- ARGV...

Started by tests/bundle under `unshare --mount`, so every mount made here
lives in a private mount namespace and disappears with this process: nothing
to clean up, nothing leaks into the host. The chroot gets a fresh /proc (the
plugin reads /proc/thread-self/ns/net and /proc/sys/net) and a bind mount of
each netns file at the same path; then this process chroots and execs ARGV[0]
from inside, with the environment it was given (the CNI_* variables).
"""

from __future__ import annotations

import os
import subprocess
import sys


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main(argv: list[str]) -> int:
    sep = argv.index("--")
    root, netns_files, command = argv[0], argv[1:sep], argv[sep + 1:]
    _mount("-t", "proc", "proc", os.path.join(root, "proc"))
    for path in netns_files:
        target = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))
        _mount("--bind", path, target)
    os.chroot(root)
    os.chdir("/")
    os.execve(command[0], command, os.environ)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
