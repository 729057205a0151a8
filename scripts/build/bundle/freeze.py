"""Generate frozen.c: the plugin's modules and the stdlib they need, as deep-frozen code objects.

Run with the interpreter whose static library the bundle links (Debian's
python3.11): the code objects must match that interpreter's bytecode.

    python3.11 freeze.py --src DIR_WITH_cni_plugin --inittab inittab.c --out DIR \
        --deepfreeze CPYTHON_TOOLS_SCRIPTS --include PYTHON_INCLUDE_DIR --stdlib-getters _Py_get_..._toplevel ...

The module set is found, not listed by hand: every module of cni_plugin/ (but
the source-tree launcher), every absolute import any of their functions does
(lazy ones included: the error paths import `traceback`, `json`), the codecs
UTF-8 mode needs, and the closure of all that as the interpreter itself
resolves it. Modules the interpreter already has frozen (os, codecs, io, ...)
stay with it. An extension module (.so) in the closure is an error: a static
binary cannot load one, so it must be a builtin listed in inittab.c.

The modules are deep-frozen, not marshalled: CPython's own deep-freezer
(Tools/scripts/deepfreeze.py of the same release as the static library,
--deepfreeze) writes each code object, with its constants and names, as a
static C object, as CPython does for its start-up modules. An import then
costs no unmarshalling, which was a tenth of a report-only ADD's instructions.
The strings of a module's code objects are interned when it is first
imported (nc_get_* below), so modules the run never imports cost nothing.
The same goes for the interpreter's own deep-frozen modules (--stdlib-getters:
their `_Py_get_*_toplevel` functions, wrapped at link time) but those every
start imports: CPython interns all of them at start-up, site, runpy and ntpath
included, which touched every page of their ~1 MB of static objects (~100
page faults) for modules the plugin never imports.
The plugin's own modules are compiled without docstrings (nothing reads
them, and they are a fifth of the code's size) and with `from __future__
import annotations` turned into the compiler flag it stands for, so the
`__future__` module is never imported at run time (annotations stay strings,
exactly as with the statement).
"""

from __future__ import annotations

import __future__
import argparse
import ast
import dis
import io
import json
import re
import subprocess
import sys
import types
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
    """cni_plugin, its sub-packages (wire/, lean/) and their modules, by dotted name."""
    mods = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
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


def compile_module(name: str, path: Path):
    """The code object frozen for module `name` (see the module docstring)."""
    filename = f"<frozen {name}>"
    source = path.read_bytes()
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return compile(source, filename, "exec", dont_inherit=True, optimize=0)
    tree = ast.parse(source, filename)
    flags = 0
    body = []
    for node in tree.body:
        if (isinstance(node, ast.ImportFrom) and node.module == "__future__"
                and [alias.name for alias in node.names] == ["annotations"] and not node.names[0].asname):
            flags |= __future__.annotations.compiler_flag
            continue
        body.append(node)
    tree.body = body
    return compile(tree, filename, "exec", flags=flags, dont_inherit=True, optimize=2)


def load_deepfreeze(tools: Path, include: Path) -> types.ModuleType:
    """CPython's deepfreeze module from `tools`, told the interpreter's static strings.

    deepfreeze.py asks generate_global_objects.py (which scans a CPython
    source tree) for the identifiers and strings the runtime holds as static
    objects, so frozen code can point at them. The target's own header lists
    exactly those; they are read from there instead.
    """
    text = (include / "internal" / "pycore_global_strings.h").read_text()
    identifiers = set(re.findall(r"^\s+STRUCT_FOR_ID\((\w+)\)", text, re.M))
    strings = {ast.literal_eval(literal): name
               for name, literal in re.findall(r'^\s+STRUCT_FOR_STR\((\w+), ("(?:[^"\\]|\\.)*")\)', text, re.M)}
    if len(identifiers) < 100 or "<module>" not in strings:
        raise SystemExit(f"freeze: no static strings found in {include}/internal/pycore_global_strings.h")
    stub = types.ModuleType("generate_global_objects")
    stub.get_identifiers_and_strings = lambda: (identifiers, strings)
    sys.modules["generate_global_objects"] = stub
    sys.path.insert(0, str(tools))
    import deepfreeze

    return deepfreeze


# Interning one deep-frozen module: every code object in it, as CPython's
# _Py_Deepfreeze_Init does for each code object deepfreeze.py wrote (they are
# exactly those reachable from the module's code through co_consts).
INTERN_C = """
static int
nc_intern_code(PyCodeObject *code)
{
    PyObject *consts = code->co_consts;

    if (_PyStaticCode_InternStrings(code) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) {
        PyObject *item = PyTuple_GET_ITEM(consts, i);
        if (PyCode_Check(item) && nc_intern_code((PyCodeObject *)item) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The code of a deep-frozen module, its strings interned on first use. */
static PyObject *
nc_interned(PyObject *code, int *interned)
{
    if (code != NULL && !*interned) {
        if (nc_intern_code((PyCodeObject *)code) < 0) {
            Py_DECREF(code);
            return NULL;
        }
        *interned = 1;
    }
    return code;
}

"""

# What every start imports (python3 -I -S does too): interned up front, as
# CPython does, so the strings the interpreter creates later are these static
# ones (interning them after would cost a second copy of each).
START_GETTERS = ("_Py_get_importlib__bootstrap_toplevel", "_Py_get_importlib__bootstrap_external_toplevel",
                 "_Py_get_codecs_toplevel", "_Py_get_io_toplevel", "_Py_get_abc_toplevel")


def deepfreeze_init(getters: list[str]) -> str:
    """_Py_Deepfreeze_Init (linked with --wrap): intern the start-up modules; the rest when imported."""
    missing = sorted(set(START_GETTERS) - set(getters))
    if missing:
        raise SystemExit(f"freeze: the static library has no deep-frozen {', '.join(missing)}")
    calls = "".join(f"        __wrap_{symbol},\n" for symbol in START_GETTERS)
    return (f"int\n__wrap__Py_Deepfreeze_Init(void)\n{{\n    static PyObject *(*const start[])(void) = {{\n{calls}    }};\n\n"
            "    for (size_t i = 0; i < sizeof(start) / sizeof(start[0]); i++) {\n"
            "        PyObject *code = start[i]();\n\n        if (code == NULL) {\n            return -1;\n        }\n"
            "        Py_DECREF(code);\n    }\n    return 0;\n}\n\n")


def getter(name: str, real: str) -> str:
    """A `get_code` that interns the module's strings on first use, then hands out `real()`'s code."""
    return (f"{'' if name.startswith('__wrap_') else 'static '}PyObject *\n{name}(void)\n{{\n"
            f"    static int interned;\n\n    return nc_interned({real}(), &interned);\n}}\n\n")


def stdlib_wrappers(getters: list[str]) -> str:
    """Link-time wrappers (--wrap=SYMBOL) of the interpreter's own deep-frozen getters."""
    parts = [f"extern PyObject *__real_{symbol}(void);\n" for symbol in getters]
    parts += [getter(f"__wrap_{symbol}", f"__real_{symbol}") for symbol in getters]
    parts.append(deepfreeze_init(getters))
    return "".join(parts)


def generate(src: Path, inittab: Path, out: Path, tools: Path, include: Path, stdlib_getters: list[str]) -> list[str]:
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
        frozen.setdefault(name, (path, path.name == "__init__.py"))
    deepfreeze = load_deepfreeze(tools, include)
    code_c = io.StringIO()
    printer = deepfreeze.Printer(code_c)
    getters, table = [], []
    for name in sorted(frozen):
        path, ispkg = frozen[name]
        printer.generate_file(name, compile_module(name, path))
        ident = name.replace(".", "_")
        getters.append(getter(f"nc_get_{ident}", f"_Py_get_{ident}_toplevel"))
        table.append(f'    {{"{name}", NULL, 0, {int(ispkg)}, nc_get_{ident}}},')
    parts = ["/* Generated by scripts/build/bundle/freeze.py (with CPython's deepfreeze.py): do not edit. */\n",
             code_c.getvalue(), '\n#include "frozen.h"\n', INTERN_C, "\n", stdlib_wrappers(stdlib_getters), *getters,
             "const struct _frozen netclaim_frozen_modules[] = {\n" + "\n".join(table)
             + "\n    {0, 0, 0, 0, NULL},\n};\n"]
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
    parser.add_argument("--deepfreeze", required=True, type=Path,
                        help="CPython's Tools/scripts (deepfreeze.py, umarshal.py) of the static library's release")
    parser.add_argument("--include", required=True, type=Path, help="the target's Python include dir (python3.11/)")
    parser.add_argument("--stdlib-getters", required=True, nargs="+", metavar="SYMBOL",
                        help="the static library's _Py_get_*_toplevel functions (deepfreeze.o), wrapped at link time")
    args = parser.parse_args()
    names = generate(args.src.resolve(), args.inittab, args.out, args.deepfreeze, args.include,
                     sorted(args.stdlib_getters))
    print(f"froze {len(names)} modules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
