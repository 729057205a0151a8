"""cni_plugin.lean.posixos: the plugin's `os` without importing `os` gives what `os` gives.

The oracle is the standard library itself (posixpath, os.environ, os.fsencode)
run on the same inputs; the environment check runs real interpreters.
"""

from __future__ import annotations

import ast
import json
import os
import posix
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from cni_plugin.lean import posixos

PACKAGE = Path(posixos.__file__).resolve().parents[1]  # cni_plugin/, with its wire/ and lean/
PATHS = ["", "/", "//", "///", "a", "a/", "a//", "/a", "/a/", "/a/b", "/a/b/", "a/b", "a//b", "//a//b//",
         "/var/lib/netclaim/spool", "/run/netns/x.y", "rel/x:y:eth0.state.json", "/a/./b/../c", "\udcff/x"]


def _modules_using_posixos() -> dict[str, set[str]]:
    """Module name -> the attributes it reads from its `os` when that `os` is posixos."""
    found: dict[str, set[str]] = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(source.read_text(), str(source))
        # `from . import posixos` (in lean/), `from .lean import posixos` or `from ..lean import posixos as os`
        aliases = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.level >= 1 and node.module in (None, "lean") for alias in node.names
                   if alias.name == "posixos"}
        if aliases:
            found[source.relative_to(PACKAGE).with_suffix("").as_posix()] = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                                  and isinstance(node.value, ast.Name) and node.value.id in aliases}
    return found


def test_every_os_name_the_plugin_uses_exists_without_os() -> None:
    """The static plugin never loads `os`: each name must be posix's or posixos's own."""
    users = _modules_using_posixos()
    assert {"main", "log", "state", "lean/netlink", "lean/netns", "interface", "wire/event", "wire/spool",
            "lean/safefs", "handoff"} <= set(users)
    missing = {f"{module}: os.{name}" for module, names in users.items() for name in names
               if name not in vars(posixos) and not hasattr(posix, name) and name != "setns"}  # setns: 3.12+, optional
    assert not missing, sorted(missing)


@pytest.mark.parametrize("first", PATHS)
def test_path_helpers_equal_posixpath(first: str) -> None:
    assert posixos.path.dirname(first) == posixpath.dirname(first)
    assert posixos.path.basename(first) == posixpath.basename(first)
    for second in PATHS:
        assert posixos.path.join(first, second) == posixpath.join(first, second), (first, second)
        assert posixos.path.join(first, second, "c") == posixpath.join(first, second, "c"), (first, second)
    assert posixos.path.join(Path("/x"), "y") == posixpath.join(Path("/x"), "y")


def test_lexists_counts_a_dangling_link_and_refuses_nul(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    for name in ("dangling", "file", "nowhere", "file/below"):
        assert posixos.path.lexists(str(tmp_path / name)) == os.path.lexists(str(tmp_path / name)), name
    assert posixos.path.lexists("/tmp\0x") is os.path.lexists("/tmp\0x") is False


def test_fs_codecs_equal_os() -> None:
    for text in ("eth0", "é", "\udcff", ""):
        assert posixos.fsencode(text) == os.fsencode(text)
        assert posixos.fsdecode(os.fsencode(text)) == os.fsdecode(os.fsencode(text)) == text
    assert posixos.fsencode(b"raw\xff") == b"raw\xff" and posixos.fsdecode("s") == "s"


def test_other_names_follow_os_when_it_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper put on os.fsync (as a test does) is what posixos hands out while os is loaded."""
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    posixos.fsync(7)
    assert calls == [7]
    assert posixos.open is posix.open and posixos.O_CLOEXEC == os.O_CLOEXEC
    with pytest.raises(AttributeError):
        posixos.__wrapped__  # noqa: B018 - module metadata is never borrowed from os


def _environ_in_a_fresh_interpreter(code: str, env: dict[bytes, bytes]) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(PACKAGE.parent)], env=env,
                          capture_output=True, check=True)
    return json.loads(proc.stdout)


def test_getenviron_without_os_equals_os_environ() -> None:
    """Undecodable bytes and all: the mapping equals os.environ's, and os is never imported for it."""
    env = {b"CNI_COMMAND": b"ADD", b"CNI_ARGS": b"K8S_POD_NAME=p\xff;IgnoreUnknown=1", b"EMPTY": b"", b"PATH": b"/bin"}
    plugin = _environ_in_a_fresh_interpreter(
        "import json, sys; sys.path.insert(0, sys.argv[1]); from cni_plugin.lean import posixos\n"
        "e = dict(posixos.getenviron()); assert 'os' not in sys.modules, 'os imported'\n"
        "print(json.dumps(e, ensure_ascii=True))", env)
    stdlib = _environ_in_a_fresh_interpreter(
        "import json, os; print(json.dumps(dict(os.environ), ensure_ascii=True))", env)
    assert plugin == stdlib and plugin["CNI_ARGS"] == "K8S_POD_NAME=p\udcff;IgnoreUnknown=1"
