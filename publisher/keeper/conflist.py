"""Add, update or remove the netclaim entry of a CNI conflist (stdlib, the plugin's config, publisher/limits.py).

Used by scripts/operator/conflist_edit.py (scripts/install.sh, systemd installs) and by
the chain keeper of the DaemonSet (publisher/keeper/keeper.py), so both edit a
node's network config the same way.

Why it is careful:
- The container runtime watches /etc/cni/net.d and may read the file at any
  moment, so every write goes to a temp file in the same directory, is fsynced
  and renamed over the original (a reader sees the old or the new file, never
  half of one). A file whose content would not change is not rewritten, so a
  re-install does not make the runtime reload its networks.
- Installing into a file without a netclaim entry keeps its bytes in
  FILE.netclaim.bak, so an uninstall can give back exactly what was there,
  also after the primary CNI rewrote the file (Calico's install-cni does on
  every restart).
- A conflist that is not valid JSON, or not a conflist, is refused untouched:
  guessing at a broken network config on a node is how nodes lose networking
  (and a file read while a careless writer is halfway through looks like that).
- Compare before replace: the file is re-read just before the rename and the
  edit is abandoned (`Changed`) when anyone wrote it since it was read, so a
  change the primary CNI makes meanwhile (an MTU, say) is never reverted.
- Where netclaim goes (the rule): netclaim reports what the plugins before it
  produced, so it must come after the primary plugin (plugins[0], the one that
  creates the interface and addresses). An entry already there stays where it
  is when `keep_position` is asked (the chain keeper): a chainer that appends
  itself after netclaim (istio-cni, linkerd-cni) changes nothing netclaim
  reports, and moving netclaim back last would start a rewrite loop with it. A
  missing entry is inserted last. The one-shot installer still moves it last.
- A single-plugin .conf (or .json) primary is converted the way libcni reads
  it (ConfListFromConf: name and cniVersion lifted, the whole plugin becomes
  plugins[0]) into NAME.conflist, which sorts where NAME.conf did (the runtime
  uses the first network file by name); NAME.conf's bytes are kept in
  NAME.conf.netclaim.bak and uninstall puts them back byte for byte.
- The entry is typed and checked by the plugin's own config rules before any
  file is touched (`build_entry`): the plugin refuses its whole entry over one
  mistyped field (ADD error 7: no pod on the node starts), so such an entry
  must never reach a node.
- A network file that is a symlink is maintained elsewhere (config
  management links it in; the primary CNIs themselves write regular files):
  it is never edited, neither through the link (its target may be outside
  what this process sees as the node, and its owner would undo the edit) nor
  by replacing the link with an edited copy (the owner's later versions would
  never reach the runtime, and uninstall would leave the stale copy). Such a
  file is `MaintainedElsewhere`, a Refused that names the link's target; it is
  still read through the link, so an entry the operator put there counts.
- Only regular files are read, at most `limits.NETWORK_FILE_MAX` bytes of them,
  opened without blocking: a FIFO named like a network file would block the
  reader for good, a device or a huge file would never end or cost more memory
  than the keeper has. Such a file is Refused (left as it is), never read whole.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cni_plugin.config import INT_SETTINGS, LATEST_VERSION, STRING_SETTINGS, parse_netconf
from cni_plugin.lean.errors import CNIError
from publisher import limits

PLUGIN_TYPE = "netclaim"
BACKUP_SUFFIX = ".netclaim.bak"
NETWORK_EXTENSIONS = (".conf", ".conflist", ".json")


class Refused(Exception):
    """The conflist cannot be edited safely; nothing was changed."""


class BadSetting(Refused):
    """A KEY=VALUE pair the plugin would not accept; `key` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class MaintainedElsewhere(Refused):
    """The network file is a symlink: another installer or config management keeps it; netclaim never edits it."""

    def __init__(self, path: Path, target: str) -> None:
        super().__init__(f"{path} is a symlink to {target}, maintained elsewhere: left as it is (chain netclaim "
                         "into the file where it is maintained, or make this a regular file)")
        self.path = path
        self.target = target


def maintained_elsewhere(path: Path) -> MaintainedElsewhere:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"  # replaced meanwhile: the next look says what it is now
    return MaintainedElsewhere(path, target)


def refuse_link(path: Path) -> None:
    """MaintainedElsewhere when `path` is a symlink: nothing of netclaim's replaces or writes through it."""
    if path.is_symlink():
        raise maintained_elsewhere(path)


FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular(path: Path, mode: int) -> Refused:
    kind = next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")
    return Refused(f"{path}: {kind}, not a regular file; left as it is")


def read_bounded(path: Path, follow: bool = True, cap: int = limits.NETWORK_FILE_MAX) -> tuple[os.stat_result, bytes]:
    """A regular file's status and bytes, at most `cap` of them; Refused for anything else.

    Looked at before it is opened (a FIFO's open would wait for a writer), opened
    O_NONBLOCK (and O_NOFOLLOW unless `follow`), looked at again on the descriptor
    (it may have been replaced in between), and read up to one byte past the cap.
    FileNotFoundError passes through: callers treat a file that went their own way.
    """
    st = os.stat(path, follow_symlinks=follow)
    if stat.S_ISLNK(st.st_mode):
        raise maintained_elsewhere(path)
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise maintained_elsewhere(path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        if st.st_size > cap:
            raise too_large(path, st.st_size, cap)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 16, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > cap:  # grew since fstat
        raise too_large(path, size, cap)
    return st, b"".join(chunks)


def too_large(path: Path, size: int, cap: int) -> Refused:
    return Refused(f"{path}: larger than {cap} bytes ({size} or more), not a network config netclaim reads; "
                   "left as it is")


class Changed(Exception):
    """Someone wrote the file while it was being edited; the edit was abandoned, retry later."""


@dataclass(frozen=True)
class Stamp:
    """What a file was when it was read: an edit replaces it only if it still is."""

    ino: int
    size: int
    mtime_ns: int
    data: bytes

    @classmethod
    def read(cls, path: Path, follow: bool = False) -> "Stamp":
        """The file an edit would replace: a symlink is MaintainedElsewhere unless `follow` (reads only)."""
        st, data = read_bounded(path, follow)
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, data)

    def still(self, path: Path) -> bool:
        """True when `path` is the same file with the same bytes (a same-size rewrite within
        one mtime tick is caught by the bytes); a link or FIFO put there meanwhile is not."""
        try:
            now = Stamp.read(path)
        except (OSError, Refused):
            return False
        return now == self


Hook = Callable[[str, Path], None]


def no_hook(_point: str, _path: Path) -> None:
    return None


def parse(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(f"{path}: not valid JSON ({exc}); left untouched") from None
    if not isinstance(doc, dict):
        raise Refused(f"{path}: a conflist must be a JSON object; left untouched")
    return doc


def is_conflist(doc: dict[str, Any]) -> bool:
    plugins = doc.get("plugins")
    return isinstance(plugins, list) and bool(plugins) and all(isinstance(p, dict) for p in plugins)


def is_single_conf(path: Path, doc: dict[str, Any]) -> bool:
    """A single-plugin network config (.conf/.json with a "type"), which libcni wraps into a conflist."""
    return path.suffix in (".conf", ".json") and "plugins" not in doc and isinstance(doc.get("type"), str) \
        and bool(doc["type"])


def conf_to_conflist(doc: dict[str, Any]) -> dict[str, Any]:
    """libcni's ConfListFromConf: name and cniVersion lifted, the whole conf is plugins[0]."""
    out: dict[str, Any] = {}
    for key in ("cniVersion", "name"):
        if key in doc:
            out[key] = doc[key]
    out["plugins"] = [doc]
    return out


def load_stamped(path: Path, follow: bool = False) -> tuple[Stamp, dict[str, Any]]:
    """Read and parse a conflist, with the stamp an edit compares against before replacing it.

    A symlink is MaintainedElsewhere, unless `follow`: reading through it is fine, editing is not."""
    try:
        stamp = Stamp.read(path, follow)
    except FileNotFoundError:
        raise Refused(f"{path}: no such conflist") from None
    doc = parse(path, stamp.data)
    if not is_conflist(doc):
        raise Refused(
            f"{path}: not a conflist (needs a non-empty \"plugins\" list of objects, or a single-plugin "
            ".conf with a \"type\"); left untouched"
        )
    return stamp, doc


def load_conflist(path: Path) -> tuple[bytes, dict[str, Any]]:
    """Read and parse a conflist (through a symlink: only edits refuse those); refuse anything that is not one."""
    stamp, doc = load_stamped(path, follow=True)
    return stamp.data, doc


def is_netclaim(plugin: dict[str, Any]) -> bool:
    return plugin.get("type") == PLUGIN_TYPE


def in_place(plugins: list[dict[str, Any]]) -> bool:
    """The rule: exactly one netclaim entry, after the primary plugin (plugins[0])."""
    at = [i for i, p in enumerate(plugins) if is_netclaim(p)]
    return len(at) == 1 and at[0] >= 1


def with_entry(doc: dict[str, Any], entry: dict[str, Any], keep_position: bool = False) -> dict[str, Any]:
    """The conflist with exactly one netclaim entry: where it is (if `keep_position` and it is in
    place), else last in the chain.

    Keys of an existing entry that this install does not set (say an
    `interface` block the operator added by hand) are kept; keys it sets win,
    and a key it sets to None (`build_entry` with `empty_is_default`: the
    plugin's default) is taken out.
    """
    plugins = doc["plugins"]
    merged: dict[str, Any] = {}
    for old in (p for p in plugins if is_netclaim(p)):
        merged.update(old)
    for key, value in entry.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    merged["type"] = PLUGIN_TYPE
    out = dict(doc)
    if keep_position and in_place(plugins):
        out["plugins"] = [merged if is_netclaim(p) else p for p in plugins]
    else:
        out["plugins"] = [p for p in plugins if not is_netclaim(p)] + [merged]
    return out


def without_entry(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    out["plugins"] = [p for p in doc["plugins"] if not is_netclaim(p)]
    return out


def render(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def write_atomic(path: Path, data: bytes, mode: int, expect: Stamp | None = None, hook: Hook = no_hook) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory.

    With `expect`, the file is re-read just before the rename and the write is
    abandoned (`Changed`) unless it is still what was read: the other writer's
    version wins and the caller decides again from it on its next look.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        hook("before-replace", path)
        if expect is not None and not expect.still(path):
            raise Changed(f"{path}: changed while being edited; not replaced")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def file_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def backup_of(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def converted_name(path: Path) -> Path:
    """Where a single-plugin NAME.conf (or NAME.json) lives once converted: NAME.conflist."""
    return path.with_suffix(".conflist")


def keeps_position(path: Path, new: Path) -> bool:
    """True when `new` would sort among the network files exactly where `path` does."""
    others = [p.name for p in network_files(path.parent) if p.name not in (path.name, new.name)]
    return [n < path.name for n in others] == [n < new.name for n in others]


def install(path: Path, entry: dict[str, Any], keep_position: bool = False, hook: Hook = no_hook) -> str:
    """Chain netclaim into `path`: 'unchanged', 'updated' or 'converted' (a .conf became NAME.conflist).

    Raises Refused (nothing changed, the file cannot be edited safely) or
    Changed (someone wrote the file meanwhile; nothing of theirs was replaced).
    """
    if not path.exists() and not path.is_symlink() and backup_of(path).exists() and converted_name(path).exists():
        path = converted_name(path)  # a .conf converted before: its conflist is what to update
    try:
        stamp = Stamp.read(path)  # a symlink: MaintainedElsewhere, before anything is written
    except FileNotFoundError:
        raise Refused(f"{path}: no such conflist") from None
    doc = parse(path, stamp.data)
    if not is_conflist(doc) and is_single_conf(path, doc):
        return convert(path, stamp, doc, entry, hook)
    stamp, doc = load_stamped(path)
    backup = backup_of(path)
    mode = file_mode(path)
    new = render(with_entry(doc, entry, keep_position))
    chained = any(is_netclaim(p) for p in doc["plugins"])
    if not chained:
        # No netclaim entry: these bytes are what the operator (or the primary
        # CNI, which may have just rewritten the file) wants back on uninstall.
        write_if_different(backup, stamp.data, mode)
    elif not backup.exists() and converted_source(path) is None:
        # Chained already but no backup (a file moved back into place): the
        # best original there is, the file without the entry. Never a backup
        # that still chains netclaim.
        write_atomic(backup, render(without_entry(doc)), mode)
    if new == stamp.data:
        return "unchanged"
    write_atomic(path, new, mode, expect=stamp, hook=hook)
    return "updated"


def convert(path: Path, stamp: Stamp, doc: dict[str, Any], entry: dict[str, Any], hook: Hook) -> str:
    """NAME.conf -> NAME.conflist with netclaim, NAME.conf's bytes kept in its backup.

    Order matters to a runtime reading the directory meanwhile: the backup
    first (not a network file), then NAME.conflist (NAME.conf still sorts
    first, so the runtime still uses it), then NAME.conf goes, only if it is
    still what was read (a newer one stays and is converted on the next look).
    """
    target = converted_name(path)
    backup = backup_of(path)
    refuse_link(target)
    if target.exists() and not backup.exists():
        raise Refused(f"{path}: a single-plugin conf, and {target.name} (not written by netclaim) exists; "
                      "left untouched")
    if not keeps_position(path, target):
        raise Refused(f"{path}: a single-plugin conf; {target.name} would not sort where it does, so the "
                      "runtime would pick another network; left untouched")
    mode = file_mode(path)
    new = render(with_entry(conf_to_conflist(doc), entry))
    write_if_different(backup, stamp.data, mode)
    write_if_different(target, new, mode)
    hook("before-replace", path)
    if not stamp.still(path):
        raise Changed(f"{path}: changed while being converted; left for the next look")
    path.unlink()
    fsync_dir(path.parent)
    return "converted"


def write_if_different(path: Path, data: bytes, mode: int) -> None:
    """Every write is a directory event some primary CNI re-renders on: none that changes nothing."""
    try:
        if read_bounded(path, follow=False)[1] == data:
            return
    except (FileNotFoundError, Refused):
        pass  # absent, or not a file netclaim can read: replaced (never written through)
    write_atomic(path, data, mode)


def fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def converted_source(path: Path) -> Path | None:
    """For NAME.conflist: the NAME.conf (or .json) it was converted from, when netclaim converted it."""
    if path.suffix != ".conflist":
        return None
    for ext in (".conf", ".json"):
        source = path.with_suffix(ext)
        if backup_of(source).exists():
            return source
    return None


def conf_as_conflist(path: Path) -> dict[str, Any] | None:
    try:
        return conf_to_conflist(parse(path, read_bounded(path)[1]))
    except (OSError, Refused):
        return None


def uninstall_converted(source: Path) -> str:
    """Undo a conversion: NAME.conf back with its original bytes, NAME.conflist gone.

    Only when NAME.conflist without netclaim is still exactly the conversion
    of the kept original; otherwise someone changed it since, and only the
    netclaim entry is taken out of it.
    """
    target = converted_name(source)
    backup = backup_of(source)
    refuse_link(source)
    refuse_link(target)
    original = read_bounded(backup, follow=False)[1]
    backup_of(target).unlink(missing_ok=True)  # never wanted: the original is the .conf's
    try:
        _raw, doc = load_conflist(target)
    except Refused:
        doc = None
    try:
        as_conflist = conf_to_conflist(json.loads(original))
    except (UnicodeDecodeError, ValueError, TypeError):
        as_conflist = None
    if source.exists():
        # The primary CNI wrote NAME.conf again (it is the network in use): our copy goes,
        # unless someone changed more in it than the netclaim entry.
        if doc is not None and without_entry(doc) in (as_conflist, conf_as_conflist(source)):
            target.unlink(missing_ok=True)
        elif doc is not None:
            write_atomic(target, render(without_entry(doc)), file_mode(target))
        backup.unlink()
        return "restored"
    if doc is None:
        backup.unlink()
        return "absent"
    if without_entry(doc) == as_conflist:
        write_atomic(source, original, file_mode(target))
        target.unlink()
        fsync_dir(source.parent)
        outcome = "restored"
    else:
        write_atomic(target, render(without_entry(doc)), file_mode(target))
        outcome = "removed"
    backup.unlink()
    return outcome


def uninstall(path: Path) -> str:
    """Take netclaim out of `path`: 'restored', 'removed', 'unchanged' or 'absent'.

    A symlink is MaintainedElsewhere (left a link, its target as it is): netclaim never
    edited it, so an entry found through it is the operator's."""
    refuse_link(path)
    backup = backup_of(path)
    source = converted_source(path) if not backup.exists() else None
    if source is not None:
        return uninstall_converted(source)
    if path.suffix in (".conf", ".json") and backup.exists() and converted_name(path).exists() \
            and has_entry(converted_name(path)):
        return uninstall_converted(path)
    if not path.exists():
        backup.unlink(missing_ok=True)
        return "absent"
    if conf_as_conflist(path) is not None and is_single_conf(path, parse(path, read_bounded(path)[1])):
        backup.unlink(missing_ok=True)
        return "unchanged"  # a single-plugin conf netclaim never chained (it converts them)
    raw, doc = load_conflist(path)
    stripped = without_entry(doc)
    restored = None
    if backup.exists():
        try:
            original = read_bounded(backup, follow=False)[1]
            if json.loads(original) == stripped:
                # Nothing else changed since the install: give back the exact bytes.
                restored = original
        except (OSError, Refused, UnicodeDecodeError, ValueError):
            restored = None
    if restored is not None:
        if restored != raw:
            write_atomic(path, restored, file_mode(path))
        outcome = "restored"
    elif stripped != doc:
        write_atomic(path, render(stripped), file_mode(path))
        outcome = "removed"
    else:
        outcome = "unchanged"  # no netclaim entry: leave the operator's bytes alone
    backup.unlink(missing_ok=True)
    return outcome


def build_entry(pairs: list[str], *, empty_is_default: bool = False) -> dict[str, Any]:
    """The plugin's entry from KEY=VALUE pairs, each value typed the way the plugin reads it.

    The text of an installer's setting (a chart value, an environment variable, `--set`) becomes
    a JSON integer or string by the plugin's own table of its settings (cni_plugin/config.py), and
    each value must pass the plugin's own parser: a key the plugin does not read, a value it would
    refuse (`spoolMaxFiles=lots`, one out of its range) is BadSetting, naming the key and what it
    takes, before any file is touched.

    An empty value is a setting not given: it is left out, and `with_entry` keeps what an earlier
    install (or the operator) wrote for that key. With `empty_is_default` (the chain keeper, whose
    settings are the chart's values, every one of them stated) it is the plugin's default: the key
    maps to None, which `with_entry` takes out of the entry, so emptying a chart value brings the
    plugin's default back on every node.
    """
    entry: dict[str, Any] = {"type": PLUGIN_TYPE}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise Refused(f"--set {pair!r} is not KEY=VALUE")
        check_key(key)
        if text:
            entry[key] = typed_setting(key, text)
        elif empty_is_default:
            entry[key] = None
    if not entry.get("driverName"):
        raise BadSetting("driverName", "the entry needs driverName")
    return entry


def check_key(key: str) -> None:
    """BadSetting, listing the keys there are, unless the plugin reads `key` from KEY=VALUE text."""
    if key in INT_SETTINGS or key in STRING_SETTINGS:
        return
    known = ", ".join((*STRING_SETTINGS, *INT_SETTINGS))
    raise BadSetting(key, f"{key}: not a setting of the netclaim entry (settable as KEY=VALUE: {known})")


def typed_setting(key: str, text: str) -> int | str:
    """One setting's value as the plugin reads it; BadSetting when the plugin would refuse it."""
    value: int | str = _integer(key, text) if key in INT_SETTINGS else text
    problem = plugin_problem(key, value)
    if problem:
        raise BadSetting(key, f"{key}={text}: {problem}")
    return value


def _integer(key: str, text: str) -> int:
    """Decimal digits, optionally signed, as a JSON integer (not int()'s '1_000', ' 5' or other scripts' digits)."""
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()):
        lo, hi = INT_SETTINGS[key]
        raise BadSetting(key, f"{key}={text}: must be an integer between {lo} and {hi}")
    return int(text)


def plugin_problem(key: str, value: int | str) -> str | None:
    """What the plugin's own config parser says of `key: value` in an otherwise minimal entry
    (None: accepted). Its rules (ranges, absolute paths, failurePolicy's choices) are not copied
    here, so the keeper refuses exactly what the plugin would."""
    raw = {"cniVersion": LATEST_VERSION, "name": "netclaim", "type": PLUGIN_TYPE, "driverName": "x", key: value}
    try:
        parse_netconf(raw, LATEST_VERSION, "DEL")
    except CNIError as exc:
        return exc.msg.removeprefix("invalid network config: ").removeprefix(f"{key}: ")
    return None


def written(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as a conflist holds it: keys set to None (the plugin's default) left out."""
    return {k: v for k, v in entry.items() if v is not None}


def network_files(conf_dir: Path) -> list[Path]:
    """The network config files a runtime loads, in the order it loads them.

    libcni (containerd, CRI-O) takes *.conf, *.conflist and *.json, sorted by
    name, and uses the first: that is the primary network netclaim chains into.
    A symlink counts like libcni counts it, even when its target is not there
    for this process (the keeper's container sees only the conf dir, the node
    resolves the link): it is the primary then, which the keeper does not edit
    and reports (MaintainedElsewhere), rather than chaining a file the runtime
    does not use. FIFOs, sockets, devices and directories are never network files.
    """
    try:
        names = sorted(os.listdir(conf_dir))
    except FileNotFoundError:
        return []
    return [conf_dir / n for n in names
            if not n.startswith(".") and n.endswith(NETWORK_EXTENSIONS) and is_network_file(conf_dir / n)]


def is_network_file(path: Path) -> bool:
    """A regular file, or a symlink that is not to a directory (looked at, never opened)."""
    if path.is_symlink():
        return not path.is_dir()
    return path.is_file()


MULTUS_TYPES = ("multus", "multus-shim")


def is_multus(path: Path) -> bool:
    """Multus' own network file: it delegates to the next network file, which is where netclaim goes
    (Multus re-renders its file from that one; chaining into or converting Multus' file would fight it)."""
    try:
        doc = json.loads(read_bounded(path)[1])
    except (OSError, Refused, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(doc, dict):
        return False
    first = doc["plugins"][0] if is_conflist(doc) else doc
    return first.get("type") in MULTUS_TYPES


def has_entry(path: Path) -> bool:
    """True when the file is a conflist with a netclaim entry (unreadable files: False)."""
    try:
        _raw, doc = load_conflist(path)
    except Refused:
        return False
    return any(is_netclaim(p) for p in doc["plugins"])
