"""The size limits of the house: `sss/cli.py` stays a table, no module or function outgrows a reader.

A file over 650 lines or a function over 60 is where concerns pile up again; the CLI over 400 lines
means parsers or explanations crept back in beside the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sss

ROOT = Path(sss.__file__).parent
FILE_LINES, FUNCTION_LINES, CLI_LINES = 650, 60, 400


def _too_long(source: str, name: str) -> list[str]:
    # The file's line count, then every function (methods and nested ones too) by its def-to-end span.
    found = []
    if len(source.splitlines()) > FILE_LINES:
        found.append(f"{name}: {len(source.splitlines())} lines (over {FILE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = node.end_lineno - node.lineno + 1
            if span > FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {span} lines (over {FUNCTION_LINES})")
    return found


def test_no_file_or_function_of_sss_is_over_its_limit():
    found = [p for path in sorted(ROOT.rglob("*.py")) for p in _too_long(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_the_cli_stays_a_table():
    assert len((ROOT / "cli.py").read_text().splitlines()) <= CLI_LINES


def test_the_limit_check_finds_a_long_function_and_a_long_file():
    # Negative control: a 61-line function and a 651-line file are both reported.
    long_function = "def f():\n" + "    x = 1\n" * 60
    assert _too_long(long_function, "a.py") == ["a.py:1 f: 61 lines (over 60)"]
    long_file = "x = 1\n" * 651
    assert _too_long(long_file, "b.py") == ["b.py: 651 lines (over 650)"]
