"""Acting as another local user, for the tests of the socket's peer checks.

The child is forked, drops to the uid (groups too), runs one function and
sends its JSON-serializable answer back through a pipe; it leaves with
os._exit so that none of pytest's clean-up runs twice.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable


def run_as_uid(uid: int, func: Callable[[], Any]) -> Any:
    """func() in a child running as `uid` (and gid `uid`); an exception it lets
    escape comes back as {"child_error": "Type: message"}."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = func()
        except Exception as exc:  # report, never raise in the forked pytest
            answer = {"child_error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)
