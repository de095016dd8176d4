"""Code style the linters do not check: no function under src/bertforge is longer than 80 lines (DESIGN §5);
a longer one is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"
MAX_LINES = 80
# "module.py:function" of functions that are pure data tables (a literal and nothing else), which may be longer.
# Empty: every function today is logic.
TABLES: frozenset[str] = frozenset()


def function_lengths(root: Path) -> dict[str, int]:
    """'path:qualified.name:line' -> lines from the `def` line to the function's last line, for every function
    and method (nested ones too) of the .py files under root."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        _visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), path.relative_to(root).as_posix(), "", out)
    return out


def _visit(node: ast.AST, rel: str, prefix: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        name = prefix
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}."
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert child.end_lineno is not None
            out[f"{rel}:{name[:-1]}:{child.lineno}"] = child.end_lineno - child.lineno + 1
        _visit(child, rel, name, out)


def test_function_lengths_are_measured(tmp_path):
    (tmp_path / "m.py").write_text(
        "def short():\n    return 1\n\n\nclass C:\n    def long(self):\n" + "        x = 1\n" * 81 + "\n"
    )
    lengths = function_lengths(tmp_path)
    assert lengths == {"m.py:short:1": 2, "m.py:C.long:6": 82}


def test_no_function_longer_than_80_lines():
    lengths = function_lengths(SRC)
    assert len(lengths) > 100  # the walk found the package
    too_long = {key: n for key, n in lengths.items() if n > MAX_LINES}
    allowed = {key: n for key, n in too_long.items() if ":".join(key.split(":")[:2]) in TABLES}
    assert too_long == allowed, f"functions over {MAX_LINES} lines (split them into named steps): {too_long}"
    # an entry that no longer names a long function would silently allow a future one: keep the list exact
    stale = TABLES - {":".join(key.split(":")[:2]) for key in allowed}
    assert not stale, f"allow-list entries that are no longer long functions: {stale}"
