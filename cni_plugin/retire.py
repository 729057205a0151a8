"""A retired netclaim removes itself once no sandbox can run it any more.

When the chain keeper uninstalls netclaim while a runtime still holds a
libcni cache entry (<cacheDir>/results/<network>-<containerID>-<ifname>) whose
cached config chains netclaim, it must keep the executable: CRI-O tears that
sandbox down with the cached config, and a missing plugin fails the DEL for
good. It leaves RETIRED_MARKER beside the executable instead, a small JSON
document naming the cache dir as the node sees it. Every DEL or GC of the
retired executable then does nothing for netclaim and, when no other cache
entry still chains netclaim, removes the marker and the executable itself, so
the node's last such teardown leaves the bin dir as it was before the install.

Imported only when the marker exists (cni_plugin/main.py): stdlib only, and
nothing of this is on the path of a pod start.

The marker is read as untrusted input (anyone who can write the bin dir can
also replace the executable, but a malformed file must not make the plugin
do anything surprising): a regular file, at most MARKER_MAX_BYTES, a JSON
object whose `cacheDir` is an absolute path without NUL. Anything else keeps
both files (the keeper of a new install, or `chain-keeper --uninstall`,
removes them).

Races, and why each is safe:
- libcni removes a sandbox's own cache entry only after its DEL returned, so
  that entry (same containerID and ifname) is not counted.
- Two last DELs at once each see the other's entry. Each retired DEL first
  records its attachment in RETIRED_DIR; an entry recorded there had its
  netclaim DEL run and is not counted either, so one of them removes.
- Two DELs both removing: the marker is claimed by renaming it to a name of
  this process; only one rename wins.
- A new install while a DEL runs: the keeper installs the new executable
  (a new inode, by rename), then removes the marker. The executable is moved
  aside by rename and unlinked only when it is the very inode this process
  runs from (/proc/self/exe); anything else is linked back in place.
"""

from __future__ import annotations

import json
import os
import stat

from .config import RETIRED_MARKER

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

RETIRED_DIR = ".netclaim-retired.d"  # attachments whose netclaim DEL ran after the retirement
PLUGIN_TYPE = "netclaim"
MARKER_MAX_BYTES = 4096
PATH_MAX = 4096
CACHE_FILES_MAX = 20000  # libcni cache files looked at (a node has one per attachment)
CACHE_FILE_MAX_BYTES = 1 << 20
UNKNOWN = "?"  # a cache entry that could not be read: counted, to keep the executable
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


_B64_VALUE = {ord(c): i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def b64decode(text: str) -> bytes:
    """Standard padded base64, as Go's encoding/json writes a []byte (libcni's cached `config`).

    Written out because the self-contained plugin carries no binascii (base64's C half);
    ValueError when `text` is not base64.
    """
    if len(text) % 4:
        raise ValueError("base64 length")
    stripped = text.rstrip("=")
    if len(text) - len(stripped) > 2:
        raise ValueError("base64 padding")
    out = bytearray()
    acc = bits = 0
    for ch in stripped:
        value = _B64_VALUE.get(ord(ch))
        if value is None:
            raise ValueError("not base64")
        acc = ((acc << 6) | value) & 0xFFFFFF
        bits += 6
        if bits >= 8:
            bits -= 8
            out.append((acc >> bits) & 0xFF)
    return bytes(out)


def marker_document(cache_dir: str, socket_path: str) -> bytes:
    """The marker's content, as the keeper writes it."""
    return json.dumps({"cacheDir": cache_dir, "socketPath": socket_path}, sort_keys=True).encode() + b"\n"


def _bounded_path(value: Any) -> str | None:
    if not isinstance(value, str) or not value or len(value) > PATH_MAX or "\x00" in value:
        return None
    return value


def read_marker(path: str) -> tuple[str, str] | None:
    """(cacheDir, socketPath) from the marker, or None when it is not a valid one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MARKER_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MARKER_MAX_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    cache_dir = _bounded_path(doc.get("cacheDir"))
    if cache_dir is None or not os.path.isabs(cache_dir):
        return None
    return cache_dir, _bounded_path(doc.get("socketPath")) or ""


def cached_attachment(raw: bytes, socket_path: str) -> tuple[str, str] | None:
    """(containerID, ifname) of one libcni cache file whose cached config chains netclaim, else None.

    With `socket_path`, only an entry of that install counts (another install's
    netclaim, with its own socket, is not this executable's business).
    """
    try:
        doc = json.loads(raw)
        config = json.loads(b64decode(doc.get("config") or ""))
    except (ValueError, TypeError, AttributeError):
        return None
    plugins = config.get("plugins") if isinstance(config, dict) else None
    plugins = plugins if isinstance(plugins, list) else [config]
    for plugin in plugins:
        if isinstance(plugin, dict) and plugin.get("type") == PLUGIN_TYPE and (
                not socket_path or plugin.get("socketPath") == socket_path):
            return str(doc.get("containerId") or UNKNOWN), str(doc.get("ifName") or "")
    return None


def cached_attachments(cache_dir: str, socket_path: str) -> list[tuple[str, str]]:
    """Attachments whose runtime-cached config (libcni's results cache) runs netclaim on DEL.

    An unreadable entry, or a directory too large to read, counts as one
    (UNKNOWN): keeping the executable a while longer is the safe side.
    """
    results = os.path.join(cache_dir, "results")
    try:
        names = sorted(os.listdir(results))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        return [(UNKNOWN, "")]
    found: list[tuple[str, str]] = [(UNKNOWN, "")] if len(names) > CACHE_FILES_MAX else []
    for name in names[:CACHE_FILES_MAX]:
        try:
            with open(os.path.join(results, name), "rb") as fh:
                raw = fh.read(CACHE_FILE_MAX_BYTES)
        except FileNotFoundError:
            continue  # torn down meanwhile
        except OSError:
            found.append((UNKNOWN, ""))
            continue
        attachment = cached_attachment(raw, socket_path)
        if attachment is not None:
            found.append(attachment)
    return found


def _record_name(container_id: str, ifname: str) -> str | None:
    name = f"{container_id}.{ifname}"
    if not container_id or not ifname or len(name) > 255 or not set(name) <= _SAFE or name.startswith("."):
        return None
    return name


def _recorded(bin_dir: str) -> set[str]:
    try:
        return set(os.listdir(os.path.join(bin_dir, RETIRED_DIR)))
    except OSError:
        return set()


def _record(bin_dir: str, container_id: str, ifname: str) -> str:
    """Note that this attachment's netclaim DEL ran (its cache entry goes once the chain's DEL returns).

    Returns the record's path ('' when none was made)."""
    name = _record_name(container_id, ifname)
    if name is None:
        return ""
    directory = os.path.join(bin_dir, RETIRED_DIR)
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        pass
    except OSError:
        return ""
    path = os.path.join(directory, name)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except OSError:
        return ""
    return path


def _forget_if_orphaned(marker: str, record: str) -> None:
    """Another DEL removed the marker meanwhile: take this DEL's record back, so nothing is left behind."""
    if not record or os.path.lexists(marker):
        return
    try:
        os.unlink(record)
        os.rmdir(os.path.dirname(record))
    except OSError:
        pass


def still_used(bin_dir: str, cache_dir: str, socket_path: str, own: tuple[str, str]) -> bool:
    """Another cached sandbox may still run this executable on its DEL."""
    done = _recorded(bin_dir)
    for container_id, ifname in cached_attachments(cache_dir, socket_path):
        if (container_id, ifname) == own:
            continue
        if container_id != UNKNOWN and _record_name(container_id, ifname) in done:
            continue
        return True
    return False


def _remove_running(exe: str, running: os.stat_result) -> None:
    """Unlink `exe` only if it is the inode this process runs from; put anything else back."""
    aside = os.path.join(os.path.dirname(exe), f".{os.path.basename(exe)}.{os.getpid()}.retired")
    try:
        os.rename(exe, aside)
    except OSError:
        return
    try:
        st = os.lstat(aside)
        if (st.st_dev, st.st_ino) != (running.st_dev, running.st_ino):
            try:
                os.link(aside, exe)  # a newer install landed: back in place, unless a newer one still is there
            except OSError:
                pass
    finally:
        os.unlink(aside)


def _remove_tree(directory: str) -> None:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass
    try:
        os.rmdir(directory)
    except OSError:
        pass


def finish(exe: str, container_id: str, ifname: str) -> bool:
    """The retired executable's DEL/GC: remove it and its marker if nobody else can run it. True if removed.

    `exe` is the path the kernel resolved for this process (/proc/self/exe);
    only a file named like the executable the keeper installs is ever removed.
    """
    bin_dir = os.path.dirname(exe)
    marker = os.path.join(bin_dir, RETIRED_MARKER)
    if os.path.basename(exe) != PLUGIN_TYPE:
        return False
    try:
        running = os.stat("/proc/self/exe")
    except OSError:
        return False
    info = read_marker(marker)
    if info is None:
        return False
    cache_dir, socket_path = info
    record = _record(bin_dir, container_id, ifname)
    if still_used(bin_dir, cache_dir, socket_path, (container_id, ifname)):
        _forget_if_orphaned(marker, record)
        return False
    claimed = f"{marker}.{os.getpid()}.claimed"
    try:
        os.rename(marker, claimed)  # one DEL wins; a new install's keeper may have removed it already
    except OSError:
        _forget_if_orphaned(marker, record)
        return False
    try:
        _remove_running(exe, running)
        _remove_tree(os.path.join(bin_dir, RETIRED_DIR))
    finally:
        try:
            os.unlink(claimed)
        except OSError:
            pass
    return True
