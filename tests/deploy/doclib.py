"""The user docs as a reader meets them: their fenced blocks, the install each block belongs to, and the
commands on each line.

Shared by test_docs.py (every command shown exists; every block of commands says which install it is
for) and test_documented_commands_run.py (each of those commands runs, as written, on a real install of
that kind), so both read the docs the same way.

A block says its install with an HTML comment on the line before its fence, which a renderer does not
show:

    <!-- install: daemonset -->            the Helm chart / plain manifests (a DaemonSet per node)
    <!-- install: systemd -->              a node with scripts/install.sh and the systemd unit
    <!-- install: daemonset systemd -->    node commands that hold for both
    <!-- install: any -->                  the development tools (scripts/cluster.sh, demo, bench, builds)
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from deploylib import REPO

# The README, the project files a newcomer reads first, and the user docs.
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "SECURITY.md", *sorted((REPO / "docs").glob("*.md"))]
MODES = ("daemonset", "systemd", "any")

COMMAND_WORDS = ("netclaim-publisher", "netclaim")
SCRIPT = re.compile(r"^(?:\./)?(scripts/(?:[\w-]+/)*[\w-]+\.sh|scripts/bench\.py)$")
# What separates one simple command from the next on a shell line.
SEPARATORS = re.compile(r"&&|\|\||[;|`]|\$\(|\(|\)")
# Where a new command starts on a line a reader runs: not at a parenthesis, which in the docs' text and
# output blocks opens prose ("a separate program (netclaim-publisher chain-keeper)").
RUN_SEPARATORS = re.compile(r"&&|\|\||[;|]|\$\(")
# Programs an operator runs against a node or a cluster: a block running one of these (or netclaim's own
# commands, or a script of this repository) must say which install it is for.
OPERATOR_PROGRAMS = frozenset({"kubectl", "helm", "systemctl", "journalctl", "ctr", "crictl", "skopeo", "curl",
                               "jq", "install", "python3", "pip"})
MARKER = re.compile(r"^\s*<!--\s*install:(.*?)-->\s*$")
FENCE = re.compile(r"^( *)```(.*)$")


# ---------------------------------------------------------------- markdown


def fenced_blocks(text: str) -> list[str]:
    """The contents of the ``` fenced blocks of a markdown text."""
    return re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, re.M | re.S)


def section(text: str, heading: str) -> str:
    """The body of the section whose heading line is `heading`, up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    body = []
    for line in lines[start + 1:]:
        m = re.match(r"^(#+) ", line)
        if m and len(m.group(1)) <= level:
            break
        body.append(line)
    return "\n".join(body)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in `text` (separator rows left out)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s|:-]+\|?\s*$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc, as the reader sees it, with the install its marker names."""

    doc: str            # path relative to the repository
    line: int           # the opening fence's line, 1-based
    info: str           # the fence's info string (`sh`, `yaml`, ...)
    text: str           # the contents, without the fence's indentation
    modes: tuple[str, ...]
    marker: str | None  # the marker's text when there is one

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def dedent(line: str, indent: int) -> str:
    """A line of a block indented with its fence (a block in a list item), as the reader copies it."""
    return line[indent:] if line[:indent].strip() == "" else line


def marker_modes(marker: str) -> tuple[str, ...]:
    return tuple(marker.split())


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of one doc, each with the marker on the nearest non-blank line before its fence."""
    lines = path.read_text().splitlines()
    doc = path.relative_to(REPO).as_posix()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = len(opening.group(1))
        end = next(j for j in range(i + 1, len(lines)) if FENCE.match(lines[j]))
        body = "".join(dedent(line, indent) + "\n" for line in lines[i + 1:end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        found = MARKER.match(before)
        marker = found.group(1).strip() if found else None
        out.append(Block(doc, i + 1, opening.group(2).strip(), body, marker_modes(marker) if marker else (), marker))
        i = end + 1
    return out


def stray_markers(path: Path) -> list[str]:
    """Markers that are not followed, after blank lines, by a fence: they mark nothing."""
    lines = path.read_text().splitlines()
    stray = []
    for i, line in enumerate(lines):
        if MARKER.match(line):
            after = next((lines[j] for j in range(i + 1, len(lines)) if lines[j].strip()), "")
            if not FENCE.match(after):
                stray.append(f"{path.relative_to(REPO).as_posix()}:{i + 1}")
    return stray


@functools.cache
def all_blocks() -> tuple[Block, ...]:
    return tuple(block for doc in DOCS for block in blocks_of(doc))


# ---------------------------------------------------------------- shell lines


def logical_lines(block: str) -> list[str]:
    """Lines of a code block with `\\` continuations joined and comments removed."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        out.append(re.split(r"(?:^|\s)#", line, maxsplit=1)[0])
    return out


def command_lines(block: str) -> list[str]:
    """What a reader pastes, one command line each: continuations joined, blank and comment-only lines left out
    (a comment after a command stays: the shell ignores it)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a line cut by a separator
        return text.replace('"', " ").replace("'", " ").split()


def program_words(toks: list[str]) -> list[str]:
    """The words of a simple command from its program on: variable assignments and sudo/exec/time/env left out."""
    while toks and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0]) or toks[0] in ("sudo", "exec", "time", "env")):
        toks = toks[1:]
    return toks


def command_of(simple: str) -> tuple[str, list[str]] | None:
    """(program, arguments) when this simple command runs netclaim-publisher, netclaim or a script."""
    toks = words(simple)
    if "--" in toks and toks[:1] == ["kubectl"]:  # kubectl exec POD -- COMMAND
        toks = toks[toks.index("--") + 1:]
    toks = program_words(toks)
    if not toks:
        return None
    head = toks[0]
    if SCRIPT.match(head):
        return SCRIPT.match(head).group(1), toks[1:]
    # By name on the PATH, or by a path: absolute, relative, or under a shell variable ("$venv/bin/...").
    if Path(head).name in COMMAND_WORDS and (head in COMMAND_WORDS or head.startswith(("/", ".", "$"))):
        return Path(head).name, toks[1:]
    return None


def programs_in(block: str) -> set[str]:
    """The programs a block runs: each simple command's first word (a script by its path, others by name)."""
    found = set()
    for line in logical_lines(block):
        for simple in RUN_SEPARATORS.split(line):
            toks = program_words(words(simple.strip()))
            if toks:
                found.add(SCRIPT.match(toks[0]).group(1) if SCRIPT.match(toks[0]) else Path(toks[0]).name)
    return found


def runs_commands(block: Block) -> bool:
    """Whether a block shows commands an operator or developer runs (and so must say which install they are for)."""
    programs = programs_in(block.text)
    return bool(programs & (OPERATOR_PROGRAMS | set(COMMAND_WORDS))) or any(SCRIPT.match(p) for p in programs)
