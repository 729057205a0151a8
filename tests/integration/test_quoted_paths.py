"""Every repository path the product's docstrings and comments quote exists in the tree.

The code refers to its neighbours by path ("(publisher/journal/order.py)", "publisher/keeper/"):
after a module moves, a stale path sends the reader to nothing. The paths are read from comments
(tokenize) and from module, class and function docstrings (ast); a path is one that starts at a
top-level directory of the repository. A placeholder such as `publisher/<room>/` stops at the `<`
and checks only `publisher/`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["cni_plugin", "publisher"]
TOP_DIRS = ("cni_plugin", "publisher", "scripts", "conf", "docs", "tests")
QUOTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_DIRS)})/[\w./-]*)")


def _texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring of a module's source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield first.lineno, first.value.value


def missing_paths(source: str, root: Path) -> list[tuple[int, str]]:
    """(line, path) of each quoted repository path in `source` that does not exist under `root`."""
    missing = []
    for line, text in _texts(source):
        for match in QUOTED.finditer(text):
            quoted = match.group(1).rstrip(".-")  # a sentence's full stop is not part of the path
            if not (root / quoted).exists():
                missing.append((line, quoted))
    return missing


def _product_files() -> list[Path]:
    return [path for top in PRODUCT for path in sorted((ROOT / top).rglob("*.py"))]


def test_every_path_the_product_code_quotes_exists() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {quoted}"
             for path in _product_files() for line, quoted in missing_paths(path.read_text(), ROOT)]
    assert not found, "quoted paths that are not in the tree:\n" + "\n".join(found)


def test_the_product_code_quotes_paths_at_all() -> None:
    quoted = sum(len(QUOTED.findall(text)) for path in _product_files() for _line, text in _texts(path.read_text()))
    assert quoted > 50, f"only {quoted} quoted paths found: the pattern no longer matches how the code quotes"


def test_a_path_that_moved_away_is_reported_with_its_line() -> None:
    source = ('"""Reads the spool (cni_plugin/wire/spool.py) and the old one (cni_plugin/spool.py)."""\n'
              "\n"
              "# the rooms are publisher/<room>/; the keeper was in publisher/chain/keeper.py.\n")
    assert missing_paths(source, ROOT) == [(3, "publisher/chain/keeper.py"), (1, "cni_plugin/spool.py")]
