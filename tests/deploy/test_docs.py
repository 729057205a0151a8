"""The user docs say what the code does: every command they show exists, every diagram is the
rendering of its source and is shown, the version and skew policy matches the chart, the wire
format and the journal's migrations, and no internal history leaks into them.

Commands are taken from the fenced code blocks of README.md and docs/*.md, the way a reader
would paste them: `netclaim-publisher SUB --flag ...` must be a subcommand whose `--help` lists
each flag; `netclaim --flag` must be a flag of the plugin's manual; `scripts/....sh SUB --flag`
must be a script whose usage (the header `--help` prints, or its usage line) names the
subcommand and each flag; `scripts/bench.py SUITE --flag` must be a suite whose `--help` lists
each flag. Every block of commands says which install it is for (doclib.py: a hidden
`<!-- install: ... -->` line before its fence), so that test_documented_commands_run.py runs it on
that install and a new block cannot go unrun.
"""

from __future__ import annotations

import configparser
import functools
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, kube_version
from deploylib import REPO, netclaim_publisher_bin, python_env
from doclib import (
    DOCS,
    MODES,
    SEPARATORS,
    all_blocks,
    blocks_of,
    command_of,
    logical_lines,
    runs_commands,
    section,
    stray_markers,
    table_rows,
)

DIAGRAMS = REPO / "docs" / "diagrams"
INSTALL_MD = REPO / "docs" / "install.md"


# ---------------------------------------------------------------- commands shown in the docs


@functools.cache
def documented_commands() -> list[tuple[str, str, str, list[str]]]:
    """(doc, line, program, arguments) for every command line in a fenced block of the docs."""
    found = []
    for block in all_blocks():
        for line in logical_lines(block.text):
            for simple in SEPARATORS.split(line):
                cmd = command_of(simple.strip())
                if cmd is not None:
                    found.append((block.doc, line.strip(), *cmd))
    return found


def flags_in(args: list[str]) -> list[str]:
    """The options among `args` (`--name`, `--name=value`, `[--name]`, `-o`), without their values."""
    out = []
    for arg in args:
        for m in re.finditer(r"(?:^|[\[|(])(--?[A-Za-z][A-Za-z0-9-]*)", arg):
            out.append(m.group(1))
    return out


def first_word(args: list[str]) -> str | None:
    """The subcommand: the first argument, when it is a plain lower-case word (not a placeholder or value)."""
    for arg in args:
        arg = arg.strip("[]")
        if arg.startswith("-"):
            return None
        return arg if re.fullmatch(r"[a-z][a-z0-9-]*", arg) else None
    return None


@functools.cache
def publisher_help(sub: str) -> tuple[int, str]:
    argv = [str(netclaim_publisher_bin()), *([sub] if sub else []), "--help"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=python_env(), timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


@functools.cache
def plugin_manual() -> str:
    plugin = netclaim_publisher_bin().parent / "netclaim"
    proc = subprocess.run([str(plugin), "--help"], capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


@functools.cache
def bench_help(suite: str) -> tuple[int, str]:
    """`scripts/bench.py [SUITE] --help` (argparse: it only prints, it runs nothing)."""
    argv = [str(REPO / ".venv" / "bin" / "python"), str(REPO / "scripts" / "bench.py"), *([suite] if suite else []),
            "--help"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=python_env(), timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@functools.cache
def script_usage(script: str) -> str | None:
    """What a script says about its use: the header comment `--help` prints, and its usage lines."""
    path = REPO / script
    if not path.is_file():
        return None
    text = path.read_text()
    header = []
    for line in text.splitlines()[1:]:
        if line.startswith("set -euo"):
            break
        header.append(line)
    usage = [line for line in text.splitlines() if "usage" in line.lower()]
    return "\n".join(header + usage)


def option_words(text: str) -> set[str]:
    """The options a help text names (a word cut at a hyphen by line wrapping is no option)."""
    return {w for w in re.findall(r"(?<![A-Za-z0-9])--?[A-Za-z][A-Za-z0-9-]*", text) if not w.endswith("-")}


def problems_of(program: str, args: list[str]) -> list[str]:
    """What a documented command names that does not exist."""
    problems = []
    if program == "netclaim-publisher":
        sub = first_word(args) or ""
        rc, text = publisher_help(sub)
        if rc != 0:
            return [f"no subcommand {sub!r} ({text.strip().splitlines()[-1] if text.strip() else rc})"]
        known = option_words(text)
        problems += [f"{flag} is not an option of `netclaim-publisher {sub}`".replace("  ", " ")
                     for flag in flags_in(args) if flag not in known]
    elif program == "netclaim":
        known = option_words(plugin_manual())
        problems += [f"{flag} is not an option of the plugin" for flag in flags_in(args) if flag not in known]
    elif program == "scripts/bench.py":
        suite = first_word(args) or ""
        rc, text = bench_help(suite)
        if rc != 0:
            return [f"scripts/bench.py has no suite {suite!r}"]
        known = option_words(text) | option_words(bench_help("")[1])  # the suite's options and --out
        problems += [f"{flag} is not an option of `scripts/bench.py {suite}`" for flag in flags_in(args)
                     if flag not in known]
    else:
        usage = script_usage(program)
        if usage is None:
            return [f"{program} does not exist"]
        known = option_words(usage)
        sub = first_word(args)
        if sub is not None and not re.search(rf"(?<![\w-]){re.escape(sub)}(?![\w-])", usage):
            problems.append(f"{program}'s usage does not name {sub!r}")
        problems += [f"{program}'s usage does not name {flag}" for flag in flags_in(args) if flag not in known]
    return problems


def test_the_docs_show_commands_of_every_kind_the_test_checks() -> None:
    programs = {program for _doc, _line, program, _args in documented_commands()}
    assert {"netclaim-publisher", "scripts/install.sh", "scripts/cluster.sh", "scripts/build-image.sh",
            "scripts/bench.py"} <= programs, programs


def test_every_documented_command_names_a_subcommand_and_options_that_exist() -> None:
    wrong = []
    for doc, line, program, args in documented_commands():
        wrong += [f"{doc}: `{line}`: {p}" for p in problems_of(program, args)]
    assert not wrong, "documented commands that do not exist:\n" + "\n".join(sorted(set(wrong)))


@pytest.mark.parametrize("program, args, problem", [
    ("netclaim-publisher", ["nosuchcommand"], "no subcommand"),
    ("netclaim-publisher", ["run", "--no-such-flag"], "--no-such-flag is not an option"),
    ("scripts/install.sh", ["--no-such-flag"], "does not name --no-such-flag"),
    ("scripts/cluster.sh", ["no-such-verb"], "does not name 'no-such-verb'"),
    ("scripts/no-such-script.sh", [], "does not exist"),
    ("scripts/bench.py", ["no-such-suite"], "has no suite"),
    ("scripts/bench.py", ["scale", "--no-such-flag"], "--no-such-flag is not an option"),
])
def test_the_command_check_finds_a_command_that_does_not_exist(program: str, args: list[str], problem: str) -> None:
    assert any(problem in p for p in problems_of(program, args)), problems_of(program, args)


def test_commands_are_found_after_separators_prompts_and_kubectl_exec() -> None:
    block = ("NS=x\nkubectl -n $NS exec POD -c publisher -- /opt/netclaim/venv/bin/netclaim-publisher status\n"
             "eval \"$(NETCLAIM_CLUSTER_DIR=/tmp/c scripts/cluster.sh env)\"   # exports\n"
             "systemctl daemon-reload && scripts/install.sh --conflist F \\\n    --request nic\n"
             "ls -l /opt/cni/bin/netclaim\n"
             '"$venv/bin/netclaim-publisher" chain-keeper --uninstall\n')
    found = [command_of(s.strip()) for line in logical_lines(block) for s in SEPARATORS.split(line)]
    assert [c for c in found if c] == [
        ("netclaim-publisher", ["status"]),
        ("scripts/cluster.sh", ["env"]),
        ("scripts/install.sh", ["--conflist", "F", "--request", "nic"]),
        ("netclaim-publisher", ["chain-keeper", "--uninstall"]),
    ]


def test_the_run_options_table_of_the_publisher_reference_is_the_options_of_run() -> None:
    """docs/publisher.md lists every option `netclaim-publisher run --help` shows, and no other."""
    body = section((REPO / "docs" / "publisher.md").read_text(),
                   "### `run` options (each also from an environment variable)")
    documented = set()
    for row in table_rows(body)[1:]:
        documented |= set(re.findall(r"--[a-z][a-z0-9-]*", row[0]))
    rc, text = publisher_help("run")
    assert rc == 0, text
    shown = {flag for flag in option_words(text) if flag.startswith("--")} - {"--help"}
    assert documented == shown, {"documented, not an option": documented - shown,
                                 "an option, not documented": shown - documented}


# ---------------------------------------------------------------- which install each block of commands is for


def mode_problems(doc: Path) -> list[str]:
    """What is wrong with the install markers of one doc: a block of commands without one, a marker naming
    an unknown install, `any` beside another, a marker on a block that runs nothing, a marker on no block."""
    problems = [f"{where}: install marker followed by no code block" for where in stray_markers(doc)]
    for block in blocks_of(doc):
        unknown = set(block.modes) - set(MODES)
        if block.marker is None:
            if runs_commands(block):
                problems.append(f"{block.where}: commands without an install marker (<!-- install: "
                                f"{'|'.join(MODES)} --> on the line before the fence)")
        elif not block.modes or unknown:
            problems.append(f"{block.where}: install marker names {sorted(unknown) or 'no install'}; known: {MODES}")
        elif "any" in block.modes and len(block.modes) > 1:
            problems.append(f"{block.where}: `any` is the development tools' mark, not to be combined")
        elif not runs_commands(block):
            problems.append(f"{block.where}: install marker on a block that runs no command")
    return problems


def test_every_block_of_commands_says_which_install_it_is_for() -> None:
    """So that a new block cannot slip past the run of each install's commands (test_documented_commands_run.py)."""
    problems = [p for doc in DOCS for p in mode_problems(doc)]
    assert not problems, "\n".join(problems)


def test_the_docs_show_commands_for_each_install() -> None:
    marked = {mode for block in all_blocks() for mode in block.modes}
    assert marked == set(MODES), marked


def test_the_install_marker_check_finds_what_it_forbids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import doclib

    monkeypatch.setattr(doclib, "REPO", tmp_path)
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```sh\nkubectl get pods\n```\n\n<!-- install: cloud -->\n```sh\nhelm list\n```\n\n"
                   "<!-- install: any systemd -->\n```\nscripts/demo.sh\n```\n\n<!-- install: systemd -->\n"
                   "```yaml\nkind: Pod\n```\n\n<!-- install: daemonset -->\n\ntext\n\n"
                   "<!-- install: daemonset systemd -->\n\n  ```sh\n  ls -l /opt/cni/bin/netclaim && jq . f\n  ```\n")
    problems = mode_problems(doc)
    assert [p.split(": ", 1)[0] for p in problems] == ["x.md:22", "x.md:3", "x.md:8", "x.md:13", "x.md:18"], problems
    assert [block.modes for block in blocks_of(doc)][-1] == ("daemonset", "systemd")
    assert blocks_of(doc)[-1].text == "ls -l /opt/cni/bin/netclaim && jq . f\n"


# ---------------------------------------------------------------- diagrams


def dot_sources() -> list[Path]:
    return sorted(DIAGRAMS.glob("*.dot"))


def render(source: Path) -> bytes:
    """`dot -Tsvg` as scripts/build/diagrams.sh runs it: Graphviz's version comment left out."""
    dot = shutil.which("dot")
    assert dot, "dot (Graphviz) is not installed: scripts/setup.sh installs the Debian package graphviz"
    proc = subprocess.run([dot, "-Tsvg", str(source)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return re.sub(rb"<!-- Generated by graphviz version.*?-->\n", b"", proc.stdout, count=1, flags=re.S)


def test_there_are_diagrams_and_each_source_has_its_svg_and_no_svg_lacks_a_source() -> None:
    assert dot_sources(), "docs/diagrams/*.dot"
    assert {p.stem for p in DIAGRAMS.glob("*.svg")} == {p.stem for p in dot_sources()}


@pytest.mark.parametrize("source", dot_sources(), ids=lambda p: p.name)
def test_each_committed_svg_is_the_rendering_of_its_dot_source(source: Path) -> None:
    svg = source.with_suffix(".svg")
    assert svg.read_bytes() == render(source), \
        f"{svg.relative_to(REPO)} is stale: run scripts/build/diagrams.sh and commit the result"


def test_rendering_a_diagram_twice_gives_the_same_bytes() -> None:
    source = dot_sources()[0]
    assert render(source) == render(source)


@pytest.mark.parametrize("source", dot_sources(), ids=lambda p: p.name)
def test_each_diagram_is_shown_by_a_doc(source: Path) -> None:
    name = f"diagrams/{source.stem}.svg"
    showing = [doc.name for doc in DOCS if re.search(rf"!\[[^\]]*\]\((?:docs/)?{re.escape(name)}\)", doc.read_text())]
    assert showing, f"no doc shows {name} as an image"


def test_the_diagram_check_tells_a_stale_svg(tmp_path: Path) -> None:
    source = tmp_path / "x.dot"
    source.write_text('digraph x { a -> b; }\n')
    before = render(source)
    source.write_text('digraph x { a -> c; }\n')
    assert render(source) != before


# ---------------------------------------------------------------- versions and skew (docs/install.md)


def skew_section() -> str:
    return section(INSTALL_MD.read_text(), "## Supported versions and skew")


def version_table() -> Any:
    spec = importlib.util.spec_from_file_location("version_table", REPO / "scripts" / "build" / "version_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kubernetes_versions_table_is_rendered_from_what_the_matrix_recorded() -> None:
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "scripts" / "build" / "version_table.py"),
                           "--check"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"docs/install.md's version table is stale:\n{proc.stdout}{proc.stderr}"


def test_the_charts_kube_version_accepts_exactly_the_minors_the_matrix_passed() -> None:
    """Chart.yaml's range runs from the oldest recorded minor to the newest; each of them, and only them, ran every
    case of the matrix, on a release of that minor, and the newest is the one every other test runs."""
    table = version_table()
    rows = table.load()["versions"]
    minors = [tuple(int(x) for x in row["minor"].split(".")) for row in rows]
    assert minors == [(minors[0][0], minors[0][1] + i) for i in range(len(minors))], minors
    assert [row["minor"] for row in rows] == table.matrix_minors(), "a minor is built but not recorded, or recorded "
    for row in rows:
        assert row.get("passed") and table.minor_of(row["release"]) == row["minor"], row
    assert len({tuple(sorted(row["passed"])) for row in rows}) == 1, "every minor ran the same cases"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    bounds = re.fullmatch(r">=\s*(\d+)\.(\d+)\.0-0\s+<\s*(\d+)\.(\d+)\.0-0", chart["kubeVersion"].strip())
    assert bounds, chart["kubeVersion"]
    low, high = (int(bounds.group(1)), int(bounds.group(2))), (int(bounds.group(3)), int(bounds.group(4)))
    assert (low, high) == (minors[0], (minors[-1][0], minors[-1][1] + 1)), (chart["kubeVersion"], minors)
    newest = ".".join(str(x) for x in minors[-1])
    assert table.newest_minor() == newest == ".".join(kube_version().lstrip("v").split(".")[:2])
    assert f"`kubeVersion: {chart['kubeVersion']}`" in skew_section()


def test_the_journal_versions_in_the_doc_are_the_schema_migrations() -> None:
    from publisher.journal.schema import MIGRATIONS, SCHEMA_VERSION

    body = section(skew_section(), "### Journal schema versions")
    rows = [row for row in table_rows(body) if re.fullmatch(r"\d+", row[0])]
    documented = {int(row[0]): row[1] for row in rows}
    assert max(documented) == SCHEMA_VERSION, (sorted(documented), SCHEMA_VERSION)
    assert 1 in documented and 0 in documented
    added = {n: re.findall(r"`(\w+)\.(\w+)`", cell) for n, cell in documented.items() if n >= 2}
    expected = {i + 2: [(table, column)] for i, (table, column, _decl) in enumerate(MIGRATIONS)}
    assert added == expected


def test_the_wire_versions_in_the_doc_are_the_ones_the_plugin_sends_and_the_publisher_reads() -> None:
    from cni_plugin.wire import event as wire_event

    body = section(skew_section(), "### Plugin and publisher skew")
    assert re.search(r"`WIRE_VERSION = (\d+)`", body).group(1) == str(wire_event.WIRE_VERSION)
    assert re.search(r"`WIRE_VERSION_MAX = (\d+)`", body).group(1) == str(wire_event.WIRE_VERSION_MAX)


def test_each_compatibility_statement_names_tests_that_exist() -> None:
    body = skew_section()
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", body)
    files = {path for path, _name in refs}
    assert {"tests/plugin/test_wire_rollout.py", "tests/publisher/intake/test_wire_compat.py",
            "tests/publisher/journal/test_journal_schema_version.py"} <= files, files
    missing = []
    for path, name in refs:
        source = REPO / path
        if not source.is_file():
            missing.append(path)
        elif name and not re.search(rf"^def {name}\(", source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, missing
    # Every statement of the skew list ends with the tests that hold it.
    statements = re.findall(r"^- \*\*.*?(?=^- \*\*|\Z)", section(body, "### Plugin and publisher skew"), re.M | re.S)
    assert statements and all("`tests/" in s for s in statements), statements


# ---------------------------------------------------------------- links


def anchors_of(doc: Path) -> set[str]:
    """The anchors a renderer gives the headings of `doc` (lower case, punctuation dropped, spaces as -)."""
    text = re.sub(r"^ *```.*?^ *```", "", doc.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_of_the_docs_names_a_file_and_heading_that_exist() -> None:
    broken = []
    for doc in DOCS:
        text = re.sub(r"^ *```.*?^ *```", "", doc.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors_of(linked):
                broken.append(f"{doc.relative_to(REPO)}: {target}: no such heading")
    assert not broken, broken


# ---------------------------------------------------------------- stale and internal statements


def test_the_readme_lists_the_runtime_and_test_dependencies_setup_cfg_declares() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")

    def names(spec: str) -> set[str]:
        return {re.split(r"[<>=!~\[ ]", line.strip())[0].lower() for line in spec.strip().splitlines() if line.strip()}

    deps = section((REPO / "README.md").read_text(), "## Dependencies")
    runtime = re.search(r"^Runtime[^:]*:(.*?)\.", deps, re.M | re.S).group(1)
    assert set(re.findall(r"`([\w.-]+)`", runtime)) == names(cfg["options"]["install_requires"]), runtime
    tests = re.search(r"^Test extras[^:]*:(.*?)\.", deps, re.M | re.S).group(1)
    assert set(re.findall(r"`([\w.-]+)`", tests)) == names(cfg["options.extras_require"]["test"]), tests


INTERNAL = re.compile(
    r"\bissue\s*#?\d+|\b(?:this|previous|last|next|earlier)\s+round\b|\bsessions?\b|"
    r"\b(?:the|product|task) brief\b(?!\s+status)|\bquestion asked\b|\breviewers?\b|\bcode review\b|"
    r"\bPR\s*#\d+|\bticket\b",
    re.I)


def test_the_user_docs_speak_of_no_internal_history() -> None:
    hits = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            hits += [f"{doc.relative_to(REPO)}:{n}: {m.group(0)!r}" for m in INTERNAL.finditer(line)]
    assert not hits, hits


def test_the_internal_history_check_sees_what_it_forbids() -> None:
    for text in ("fixed in issue 12", "measured this round", "other sessions' tests", "the question asked",
                 "fixed by the product brief"):
        assert INTERNAL.search(text), text
    assert not INTERNAL.search("32 ABBA rounds; containerd/containerd#8426; poll with the brief status")


# ---------------------------------------------------------------- tables that list what the code has


VALUES_TABLE_HEADER = "| value | default | meaning |"


def table_under(body: str, header: str) -> list[list[str]]:
    """The rows of the table whose header line is `header` (the header left out)."""
    lines = body.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return table_rows("\n".join(rows))


def value_keys(values: dict, prefix: str = "") -> list[str]:
    """Every key of the chart's values, dotted (`metrics.podMonitor.labels`), parents before children."""
    keys = []
    for name, value in values.items():
        keys.append(prefix + name)
        if isinstance(value, dict):
            keys += value_keys(value, f"{prefix}{name}.")
    return keys


def undocumented_values(values: dict, table: list[list[str]]) -> list[str]:
    """The leaf values no row of the table names: by their dotted name, by a parent's (a row about the whole
    object, e.g. `resources.publisher`), or as `.leaf` in a row that names a sibling (`(.labels)`)."""
    named, relative = set(), set()
    for row in table:
        cell = row[0]
        full = re.findall(r"`([A-Za-z][\w.]*)`", cell)
        named |= set(full)
        relative |= {f"{key.rpartition('.')[0]}.{leaf}" for key in full if "." in key
                     for leaf in re.findall(r"`\.(\w+)`", cell)}
    leaves = [k for k in value_keys(values) if not any(other.startswith(k + ".") for other in value_keys(values))]
    covered = named | relative

    def documented(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:n]) in covered for n in range(1, len(parts) + 1))

    return [key for key in leaves if not documented(key)]


def test_the_install_values_table_names_every_value_of_the_chart() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    table = table_under(INSTALL_MD.read_text(), VALUES_TABLE_HEADER)
    missing = undocumented_values(values, table)
    assert not missing, f"docs/install.md's values table lacks these chart values: {missing}"


def test_the_values_table_check_finds_a_value_the_table_lacks() -> None:
    values = {"metrics": {"port": 1, "keeperPort": 2, "podMonitor": {"enabled": False, "labels": {}}},
              "resources": {"publisher": {"requests": {"cpu": "5m"}}}, "apf": {"enabled": True}}
    table = [["`metrics.port`", "1", ""], ["`metrics.podMonitor.enabled` (`.labels`)", "", ""],
             ["`resources.publisher`", "", ""]]
    assert undocumented_values(values, table) == ["metrics.keeperPort", "apf.enabled"]
    assert undocumented_values(values, [*table, ["`metrics.keeperPort`", "", ""], ["`apf`", "", ""]]) == []


# Where the publisher and the chain keeper name an Event's reason: the recorder's and reporter's warn
# methods (the reason is their first string argument), the resolver's Unresolvable (its second), the rules'
# give-up (`event_reason`) and the constants named *REASON.
EVENT_CALLS = {"warn": 1, "warn_node": 1, "warn_claim": 2, "warn_attachment": 1, "Unresolvable": 1, "_fail": 4}
REASON_WORD = re.compile(r"[A-Z][a-z]+(?:[A-Z]+[a-z]*)*")


def event_reasons_in(source: str) -> set[str]:
    """The Warning Event reasons a module's code can post (string constants in the places above)."""
    import ast

    found: set[str] = set()

    def take(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and REASON_WORD.fullmatch(node.value):
            found.add(node.value)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in EVENT_CALLS and len(node.args) > EVENT_CALLS[name]:
                take(node.args[EVENT_CALLS[name]])
            for kw in node.keywords:
                if kw.arg in ("event_reason", "reason") and name in EVENT_CALLS:
                    take(kw.value)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("REASON")
                                                  for t in node.targets):
            take(node.value)
    return found


def event_reasons() -> set[str]:
    found: set[str] = set()
    for path in sorted((REPO / "publisher").rglob("*.py")):
        found |= event_reasons_in(path.read_text())
    return found


def test_the_event_reason_finder_sees_each_way_the_code_names_a_reason() -> None:
    reasons = event_reasons()
    # one of each way: a keeper's recorder call, the spool's warn_node, the resolver's Unresolvable, the
    # reconciler's warn_claim, the rules' give-up, a constant
    assert {"ChainContested", "SpoolOverflow", "AllocatedToOtherNode", "ApplyRejected", "InvalidEntry",
            "NetclaimNotChained", "Unresolvable"} <= reasons, reasons
    assert event_reasons_in('REASON_X = "NotAReason"\nlog.warning("SomeWord")\n') == set()


@pytest.mark.parametrize("doc, heading, header", [
    ("troubleshooting.md", "## Events", "| reason | means | on |"),
    ("publisher.md", "## Observability", "| reason | when | regarding |")])
def test_the_warning_events_table_lists_every_reason_the_code_posts(doc: str, heading: str, header: str) -> None:
    body = section((REPO / "docs" / doc).read_text(), heading)
    documented = {row[0].strip("`") for row in table_under(body, header)}
    posted = event_reasons()
    assert documented == posted, (f"docs/{doc} {heading!r}: lacks {sorted(posted - documented)}, "
                                  f"names reasons no code posts: {sorted(documented - posted)}")


def rbac_problems(blocks: list[tuple[str, str]]) -> list[str]:
    """What is wrong with how a systemd install's commands (doc, block text) grant the publisher's RBAC: the
    plain `conf/kubernetes/10-rbac.yaml` authorizes the example driver; the chart rendered with the driver
    the same doc's scripts/install.sh line names authorizes the reader's."""
    problems: list[str] = []
    rendered: dict[str, set[str]] = {}
    for doc, text in blocks:
        for line in logical_lines(text):
            if re.search(r"kubectl apply\b.*conf/kubernetes/10-rbac\.yaml", line):
                problems.append(f"{doc}: applies the example driver's RBAC: {line.strip()}")
                rendered.setdefault(doc, set())
            m = re.search(r"helm template .*--set driverName=(\S+).*templates/10-rbac\.yaml.*\| kubectl apply", line)
            if m:
                rendered.setdefault(doc, set()).add(m.group(1))
    for doc, text in blocks:
        if doc not in rendered:
            continue  # a doc that shows a step of an install but not its RBAC (docs/multi-network.md)
        for driver in re.findall(r"scripts/install\.sh .*--driver-name (\S+)", " ".join(logical_lines(text))):
            if driver not in rendered.get(doc, set()):
                problems.append(f"{doc}: installs for {driver} but applies no RBAC rendered for it")
    return problems


def test_the_systemd_install_applies_netclaims_rbac_for_the_readers_driver() -> None:
    blocks = [(b.doc, b.text) for b in all_blocks() if "systemd" in b.modes]
    assert any("scripts/install.sh" in text for _doc, text in blocks)
    assert not rbac_problems(blocks)


def test_the_rbac_check_finds_the_example_drivers_rbac_applied() -> None:
    old = ("README.md", ("scripts/install.sh --conflist F --driver-name nic.acme.io\n"
                         "kubectl apply -f conf/kubernetes/00-namespace.yaml -f conf/kubernetes/10-rbac.yaml\n"))
    assert len(rbac_problems([old])) == 2
    good = ("README.md", ("scripts/install.sh --conflist F --driver-name nic.acme.io\nhelm template netclaim "
                          "conf/helm/netclaim --set driverName=nic.acme.io --show-only templates/10-rbac.yaml | "
                          "kubectl apply -f -\n"))
    assert rbac_problems([good]) == []
