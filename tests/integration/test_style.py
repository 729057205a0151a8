"""The product code passes the linter and the type checker the project pins: ruff and mypy from .venv.

Both are configured in pyproject.toml ([tool.ruff], [tool.mypy]) and installed by scripts/setup.sh
(setup.cfg's `lint` extra, exact versions). Only the product code is checked (cni_plugin/ and
publisher/): the tests and the harness are not held to the rules yet. The control cases run the
same tools with the same configuration on a file made here, so a configuration that stopped
selecting a rule (a blind `except Exception`, a def without types) fails too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
PRODUCT = ["cni_plugin", "publisher"]
CONFIG = ROOT / "pyproject.toml"


def _tool(name: str) -> Path:
    """The project's own copy of a style tool; a clear failure when the set-up has not installed it."""
    path = VENV_BIN / name
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: scripts/setup.sh installs it (setup.cfg extra `lint`)")
    return path


def _run(args: list[str | Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def _ruff(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    return _run([_tool("ruff"), "check", "--no-cache", "--config", CONFIG, "--output-format", "concise", *paths])


def _mypy(cache: Path, *paths: str | Path) -> subprocess.CompletedProcess[str]:
    return _run([_tool("mypy"), "--config-file", CONFIG, "--cache-dir", cache, "--no-error-summary", *paths])


def test_the_product_code_passes_the_linter() -> None:
    result = _ruff(*PRODUCT)
    assert result.returncode == 0, f"ruff check {' '.join(PRODUCT)}:\n{result.stdout}{result.stderr}"


def test_the_product_code_passes_the_type_checker(tmp_path: Path) -> None:
    result = _mypy(tmp_path / "mypy-cache")  # the files come from [tool.mypy] files
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"


def test_the_linter_flags_a_blind_except_and_an_unsorted_import(tmp_path: Path) -> None:
    bad = tmp_path / "blind.py"
    bad.write_text("import sys\nimport os\n\n\ntry:\n    os.getpid()\nexcept Exception:\n    sys.exit(1)\n")
    result = _ruff(bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BLE001" in result.stdout and "I001" in result.stdout, result.stdout


def test_the_type_checker_flags_a_def_without_types_and_an_ignore_without_its_code(tmp_path: Path) -> None:
    bad = tmp_path / "untyped.py"
    bad.write_text("def double(x):\n    return x * 2\n\n\ncount: int = 'one'  # type: ignore\n")
    result = _mypy(tmp_path / "mypy-cache", bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[no-untyped-def]" in result.stdout and "[ignore-without-code]" in result.stdout, result.stdout
