"""No module outside ``sss/trainer/trainer.py`` reaches into an `SSSTrainer`'s private attributes.

The trainer owns its passes: a helper that needs something of it gets it as an argument, or the
trainer calls it. Code and the examples in docstrings (doctests) are both checked.
"""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

SSS = Path(__file__).parents[2] / "sss"
OWNER = SSS / "trainer" / "trainer.py"
ACCESSORS = ("getattr", "setattr", "hasattr", "delattr")


def _is_trainer(node: ast.expr) -> bool:
    # `trainer` or `<something>.trainer` (a callback's self.trainer), but not the package path `sss.trainer`.
    if isinstance(node, ast.Name):
        return node.id == "trainer"
    return isinstance(node, ast.Attribute) and node.attr == "trainer" and not _is_name(node.value, "sss")


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_accesses(code: str) -> list[str]:
    """Each ``trainer._x`` (also through getattr/setattr/hasattr/delattr) in `code`, as ``line: trainer._x``."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _is_trainer(node.value):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and any(_is_name(node.func, name) for name in ACCESSORS):
            args = node.args
            named = len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)
            if named and _is_trainer(args[0]) and _private(args[1].value):
                found.append((node.lineno, args[1].value))
    return [f"{line}: trainer.{name}" for line, name in sorted(found)]


def _doctest_code(source: str) -> str:
    # The examples of every docstring in `source`, one after the other (each parses on its own).
    parser, examples = doctest.DocTestParser(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                examples += [example.source for example in parser.get_examples(docstring)]
    return "".join(examples)


def test_no_module_outside_the_trainer_touches_its_privates():
    offenders = []
    for path in sorted(SSS.rglob("*.py")):
        if path == OWNER:
            continue
        source = path.read_text()
        for where, code in (("code", source), ("doctest", _doctest_code(source))):
            offenders += [f"{path.relative_to(SSS.parent)} ({where}) {hit}" for hit in private_accesses(code)]
    assert offenders == [], "use a public attribute, or move the code into SSSTrainer:\n" + "\n".join(offenders)


def test_the_check_sees_each_kind_of_access():
    # Negative control: each way of reaching a private attribute is found; module paths and public names are not.
    code = """
trainer._run_batch = runner
self.trainer._logs.start_eval(module)
getattr(trainer, "_dispatch")
loss = trainer._forward_backward(batch, 0)
import sss.trainer._fail_fast
sss.trainer._fail_fast.check_gradients
trainer.state.global_step
trainer.__class__
other._private
"""
    assert private_accesses(code) == [
        "2: trainer._run_batch",
        "3: trainer._logs",
        "4: trainer._dispatch",
        "5: trainer._forward_backward",
    ]


def test_doctest_examples_are_read():
    source = '''
def f():
    """Example:
        >>> trainer._setup_fit(module, None, loader, None)
    """
'''
    assert private_accesses(_doctest_code(source)) == ["1: trainer._setup_fit"]
