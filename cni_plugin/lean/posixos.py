"""`os` for the plugin's modules, without importing `os`: `from . import posixos as os`.

Importing `os` costs a sixth of a report-only ADD's instructions in the static
plugin (os imports `_collections_abc`, which builds two dozen ABCs; see
docs/plugin.md, "Where a report-only ADD's time goes"), yet every system call
the plugin makes comes from the builtin `posix` module, which `os` only
re-exports (`from posix import *`). So this module hands out those same
functions, plus the few pure-Python helpers the plugin uses (`path.join`,
`path.dirname`, `path.basename`, `path.lexists`, `fsencode`, `fsdecode`,
`getenviron`), written here for `str` paths.

Any other attribute is looked up when it is used: on the real `os` module when
something has imported it already (the publisher, a test run: so a test that
wraps `os.fsync` sees the plugin's calls too), else on `posix`. The static
plugin never imports `os` on the ADD path, so there it is always `posix`.
tests/plugin/test_posixos.py checks that every `os.<name>` the plugin's
modules use exists without `os`.
"""

from __future__ import annotations

import posix
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Mapping

_SEP = "/"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # module metadata (__file__, __path__, ...) is this module's own
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    real = sys.modules.get("os")
    if real is not None:
        return getattr(real, name)
    value = getattr(posix, name)
    globals()[name] = value  # no `os` (the static plugin): the next use is a plain module attribute
    return value


def fsencode(filename: Any) -> bytes:
    """Like os.fsencode: str to bytes in the file system encoding (UTF-8 + surrogateescape here)."""
    filename = posix.fspath(filename)
    if isinstance(filename, str):
        return filename.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
    return filename


def fsdecode(filename: Any) -> str:
    """Like os.fsdecode: bytes to str in the file system encoding."""
    filename = posix.fspath(filename)
    if isinstance(filename, bytes):
        return filename.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
    return filename


def getenviron() -> Mapping[str, str]:
    """The process environment as os.environ gives it (os.environ itself once `os` is loaded)."""
    real = sys.modules.get("os")
    if real is not None:
        return real.environ
    return {fsdecode(key): fsdecode(value) for key, value in posix.environ.items()}


class path:  # noqa: N801 - stands in for the os.path module
    """The os.path functions the plugin uses, for str paths (POSIX rules, as posixpath)."""

    @staticmethod
    def join(first: str, *rest: str) -> str:
        """Each absolute part restarts the path; others are added with one separator."""
        joined = posix.fspath(first)
        for part in map(posix.fspath, rest):
            if part.startswith(_SEP):
                joined = part
            elif not joined or joined.endswith(_SEP):
                joined += part
            else:
                joined += _SEP + part
        return joined

    @staticmethod
    def dirname(name: str) -> str:
        """Everything before the last separator, trailing separators dropped (unless all separators)."""
        name = posix.fspath(name)
        head = name[:name.rfind(_SEP) + 1]
        if head and head != _SEP * len(head):
            head = head.rstrip(_SEP)
        return head

    @staticmethod
    def basename(name: str) -> str:
        """Everything after the last separator."""
        name = posix.fspath(name)
        return name[name.rfind(_SEP) + 1:]

    @staticmethod
    def lexists(name: str) -> bool:
        """Does the name exist (a dangling symlink counts)?"""
        try:
            posix.lstat(name)
        except (OSError, ValueError):
            return False
        return True

    @staticmethod
    def realpath(name: str) -> str:
        """os.path.realpath itself: only DEL's restore check needs it, so `os` is imported then."""
        import os.path

        return os.path.realpath(name)
