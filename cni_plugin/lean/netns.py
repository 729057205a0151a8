"""Enter a network namespace for the duration of a `with` block.

Python 3.11 has no os.setns, and `import ctypes` costs ~5 ms (half the
interpreter start-up), so this binds libc's setns(2) through the `_ctypes`
extension directly (~1 ms). The plugin is single-threaded, so switching the
process's namespace is safe; sockets opened inside stay bound to that netns.
"""

from __future__ import annotations

from . import posixos as os

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    Setns = Callable[[int, int], None]

CLONE_NEWNET = 0x40000000
_setns: Setns | None = None


def _bind_setns() -> Setns:
    import _ctypes

    class c_int(_ctypes._SimpleCData):  # noqa: N801 - ctypes' own name for the type it stands in for
        _type_ = "i"

    class _CFunc(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int

    # None: the running process's own symbols, as dlopen(3) takes NULL; typeshed allows only a path.
    libc = _ctypes.dlopen(None, getattr(os, "RTLD_NOW", 2))  # type: ignore[arg-type]
    func = _CFunc(_ctypes.dlsym(libc, "setns"))
    func.argtypes = (c_int, c_int)

    def setns(fd: int, nstype: int) -> None:
        if func(fd, nstype) != 0:
            err = _ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")

    return setns


def _builtin_setns() -> Setns | None:
    """The static bundle's builtin (scripts/build/bundle/netclaim_sys.c): it has no _ctypes."""
    try:
        import _netclaim_sys
    except ImportError:
        return None
    return _netclaim_sys.setns


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    global _setns
    if _setns is None:
        _setns = getattr(os, "setns", None) or _builtin_setns() or _bind_setns()
    _setns(fd, nstype)


class NetNS:
    """`with NetNS(path):` runs the block inside the netns at `path`.

    Opening the path raises FileNotFoundError when the netns vanished; callers
    of DEL treat that as success, ADD/CHECK as an error.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._origin = -1
        self._target = -1

    def __enter__(self) -> "NetNS":
        self._target = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._origin = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            setns(self._target, CLONE_NEWNET)
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            setns(self._origin, CLONE_NEWNET)
        finally:
            self._close()

    def _close(self) -> None:
        for fd in (self._target, self._origin):
            if fd >= 0:
                os.close(fd)
        self._target = self._origin = -1
