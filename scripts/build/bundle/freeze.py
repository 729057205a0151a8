"""Generate frozen.c: the plugin's modules and the stdlib they need, as marshalled code.

Run with the interpreter whose static library the bundle links (Debian's
python3.11): the code objects must match that interpreter's bytecode.

    python3.11 freeze.py --src DIR_WITH_cni_plugin --inittab inittab.c --out DIR

The module set is found, not listed by hand: every module of cni_plugin/ (but
the source-tree launcher), every absolute import any of their functions does
(lazy ones included: the error paths import `traceback`, `json`), the codecs
UTF-8 mode needs, and the closure of all that as the interpreter itself
resolves it. Modules the interpreter already has frozen (os, codecs, io, ...)
stay with it. An extension module (.so) in the closure is an error: a static
binary cannot load one, so it must be a builtin listed in inittab.c.
"""

from __future__ import annotations

import argparse
import dis
import json
import marshal
import os
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = "cni_plugin"
# The source-tree launcher writes the `#!python` script; the bundle replaces it.
SKIP_MODULES = {"cni_plugin.launcher"}
# Named by an import the bundle never runs: typing only under TYPE_CHECKING;
# _ctypes only when neither os.setns nor the builtin _netclaim_sys exists.
NEVER_IMPORTED = {"typing", "_ctypes"}
# What UTF-8 mode and the error paths need beyond the plugin's own imports.
STDLIB_ROOTS = [
    "encodings", "encodings.aliases", "encodings.utf_8", "encodings.ascii", "encodings.latin_1",
    "encodings.utf_8_sig", "traceback", "linecache", "json", "json.decoder", "json.scanner", "json.encoder",
]

CLOSURE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
for name in json.loads(sys.argv[2]):
    __import__(name)
out = {}
for name, mod in sorted(sys.modules.items()):
    spec = getattr(mod, "__spec__", None)
    origin = getattr(spec, "origin", None) if spec else None
    out[name] = [origin, hasattr(mod, "__path__")]
print(json.dumps(out))
"""


def plugin_modules(src: Path) -> dict[str, Path]:
    """cni_plugin and its submodules, by dotted name."""
    mods = {PACKAGE: src / PACKAGE / "__init__.py"}
    for path in sorted((src / PACKAGE).glob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            mods[f"{PACKAGE}.{path.stem}"] = path
    return {k: v for k, v in mods.items() if k not in SKIP_MODULES}


def absolute_imports(code) -> set[str]:
    """Every level-0 IMPORT_NAME in a code object and the functions it defines."""
    names: set[str] = set()
    level = None
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_CONST" and isinstance(ins.argval, int):
            level = ins.argval
        if ins.opname == "IMPORT_NAME" and level == 0:
            names.add(ins.argval)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= absolute_imports(const)
    return names


def closure(src: Path, roots: list[str]) -> dict[str, tuple[str | None, bool]]:
    proc = subprocess.run([sys.executable, "-I", "-S", "-X", "utf8", "-c", CLOSURE, str(src), json.dumps(roots)],
                          check=True, capture_output=True, text=True)
    return {k: (v[0], v[1]) for k, v in json.loads(proc.stdout).items()}


def inittab_names(inittab: Path) -> set[str]:
    text = inittab.read_text()
    names = set(re.findall(r"X\((\w+)\)", text))
    names |= set(re.findall(r'\{"(\w+)",', text))
    return names


def c_array(ident: str, data: bytes) -> str:
    rows = [", ".join(str(b) for b in data[i:i + 24]) for i in range(0, len(data), 24)]
    return f"static const unsigned char {ident}[] = {{\n" + ",\n".join(rows) + "\n};\n"


def generate(src: Path, inittab: Path, out: Path) -> list[str]:
    own = plugin_modules(src)
    roots = set(own) | set(STDLIB_ROOTS)
    for path in own.values():
        roots |= absolute_imports(compile(path.read_bytes(), str(path), "exec", dont_inherit=True))
    builtins = inittab_names(inittab)
    # Builtins need no closure (and _netclaim_sys exists only in the bundle).
    roots -= NEVER_IMPORTED | builtins
    found = closure(src, sorted(roots))
    already_frozen = set(__import__("_imp")._frozen_module_names())
    frozen: dict[str, tuple[Path, bool]] = {}
    problems = []
    for name, (origin, ispkg) in found.items():
        if name == "__main__" or name in already_frozen:
            continue
        if origin == "built-in":
            if name not in builtins:
                problems.append(f"{name}: builtin of this python, missing from inittab.c")
        elif origin and origin.endswith(".py"):
            frozen[name] = (Path(origin), ispkg)
        elif origin and origin.endswith(".so"):
            if name not in builtins:
                problems.append(f"{name}: extension module {origin}: needs to be a builtin")
        elif origin not in ("frozen",):
            problems.append(f"{name}: cannot freeze (origin {origin!r})")
    if problems:
        raise SystemExit("freeze: " + "; ".join(problems))
    for name, path in own.items():  # lazily imported plugin modules too
        frozen.setdefault(name, (path, name == PACKAGE))
    parts = ["/* Generated by scripts/build/bundle/freeze.py: do not edit. */\n#include <Python.h>\n#include \"frozen.h\"\n"]
    table = []
    for i, name in enumerate(sorted(frozen)):
        path, ispkg = frozen[name]
        code = compile(path.read_bytes(), f"<frozen {name}>", "exec", dont_inherit=True, optimize=0)
        data = marshal.dumps(code)
        parts.append(c_array(f"M{i}", data))
        table.append(f'    {{"{name}", M{i}, (int)sizeof(M{i}), {int(ispkg)}, NULL}},')
    parts.append("const struct _frozen netclaim_frozen_modules[] = {\n" + "\n".join(table)
                 + "\n    {0, 0, 0, 0, NULL},\n};\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "frozen.c").write_text("".join(parts))
    (out / "frozen.h").write_text("extern const struct _frozen netclaim_frozen_modules[];\n")
    manifest = sorted(frozen)
    (out / "modules.txt").write_text("\n".join(manifest) + "\n")
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", required=True, type=Path, help="directory that contains cni_plugin/")
    parser.add_argument("--inittab", required=True, type=Path, help="the launcher's inittab.c")
    parser.add_argument("--out", required=True, type=Path, help="where frozen.c, frozen.h, modules.txt go")
    args = parser.parse_args()
    names = generate(args.src.resolve(), args.inittab, args.out)
    print(f"froze {len(names)} modules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
