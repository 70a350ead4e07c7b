"""The house plan, checked: imports between `sss` modules form no cycle and point down the layers.

Every ``import`` statement that runs counts, also those inside functions (a lazy import is still a
dependency). Imports under ``if TYPE_CHECKING:`` do not: they never run, and a contract that
names its user in annotations (a `Callback` method takes the `SSSTrainer`) is how a two-way
protocol is typed, not a dependency of the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sss

ROOT = Path(sss.__file__).parent

# The layers, top to bottom: a module may import its own layer and the layers below, never one above.
# Each layer is a set of module-name prefixes (a prefix covers its submodules, except "sss", which is
# the package's own __init__ only); the longest matching prefix places a module, and every module
# must be placed, so a new one cannot slip in unassigned. docs/architecture.md shows this list.
LAYERS: list[tuple[str, frozenset[str]]] = [
    # the command line: parse, dispatch to the run layer, one error line per failure
    ("cli", frozenset({"sss.__main__", "sss.cli"})),
    # the application: what each command does around SSSTrainer (parts, fit, run folder, evaluate, explain, ...)
    ("run", frozenset({"sss.run"})),
    # the loop and what plugs into it: trainer, callbacks, evaluation, the model folder, ONNX export, test doubles
    (
        "trainer",
        frozenset(
            {"sss.trainer", "sss.callbacks", "sss.evaluation", "sss.model_folder", "sss.onnx_export", "sss.testing"}
        ),
    ),
    # what a run trains on: the model families with their registries, and the data modules
    ("models", frozenset({"sss.models", "sss.data"})),
    # the module contract the models implement: LitModule and what it imports (batch size, self.log's buffer)
    ("contract", frozenset({"sss.trainer.module", "sss.trainer._batches", "sss.trainer._logged"})),
    # the metrics (the contract scores with them)
    ("metrics", frozenset({"sss.metrics"})),
    # the checkpoint folder format: marker, folder lock, stored-config diff
    ("checkpoint", frozenset({"sss.checkpoint", "sss._marker", "sss._lock", "sss._config_diff"})),
    # typed configuration: schema, loading, checks without building (given the models' rules by their factory)
    ("config", frozenset({"sss.config"})),
    # the base: errors, warnings, redaction, atomic writes, network pre-flights, the package's lazy facade
    ("base", frozenset({"sss", "sss.errors", "sss.warnings", "sss._redact", "sss._writing", "sss._preflight"})),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block) for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from sss import checkpoint` imports the module sss.checkpoint, not the package's names.
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [node.module, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        # A package's own __init__ re-exporting its modules is how it presents them, not a dependency.
        graph[name] = {t for t in found if not (name != "sss" and t.startswith(name + "."))}
    return graph


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # Depth-first search; each back edge closes one cycle.
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycle_among_sss_modules():
    cycles = _cycles(_imports())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    # Negative control: the check above would see a real cycle.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_trainer_knows_only_the_callback_contract():
    graph = _imports()
    trainer_modules = [m for m in graph if m.startswith("sss.trainer")]
    assert trainer_modules
    reached = {(m, t) for m in trainer_modules for t in graph[m] if t.startswith("sss.callbacks")}
    assert {t for _, t in reached} <= {"sss.callbacks.base"}, sorted(reached)


def test_config_imports_nothing_from_the_trainer_or_the_run_layer():
    graph = _imports()
    bad = {(m, t) for m in graph if m.startswith("sss.config") for t in graph[m]}
    bad = {(m, t) for m, t in bad if t.startswith(("sss.trainer", "sss.run", "sss.callbacks", "sss.cli"))}
    assert not bad, sorted(bad)


def _covers(prefix: str, module: str) -> bool:
    return module == prefix or (prefix != "sss" and module.startswith(prefix + "."))


def _layer_of(module: str, layers: list[tuple[str, frozenset[str]]]) -> int | None:
    # The index of the layer whose longest prefix covers `module`; None: no layer does.
    found = [(len(p), i) for i, (_, prefixes) in enumerate(layers) for p in prefixes if _covers(p, module)]
    return max(found)[1] if found else None


def _layer_problems(graph: dict[str, set[str]], layers: list[tuple[str, frozenset[str]]]) -> list[str]:
    # Modules no layer covers, then imports that point to a layer above the importer's.
    problems = [f"{m}: in no layer (add it to LAYERS)" for m in sorted(graph) if _layer_of(m, layers) is None]
    for module in sorted(graph):
        mine = _layer_of(module, layers)
        for target in sorted(graph[module]):
            theirs = _layer_of(target, layers)
            if mine is not None and theirs is not None and theirs < mine:
                problems.append(f"{module} ({layers[mine][0]}) imports {target} ({layers[theirs][0]}), a layer above")
    return problems


def test_every_import_points_down_the_layers():
    problems = _layer_problems(_imports(), LAYERS)
    assert not problems, "\n".join(problems)


def test_every_prefix_of_the_layers_names_a_module():
    # A stale prefix (a module renamed or removed) would keep the list from saying where things are.
    modules = set(_imports())
    listed = [p for _, prefixes in LAYERS for p in prefixes]
    assert len(listed) == len(set(listed)), "a prefix is in two layers"
    assert not [p for p in listed if not any(_covers(p, m) for m in modules)]


def test_the_layer_check_finds_an_upward_import_and_an_unplaced_module():
    # Negative control: a fake house where the contract imports a model, and a module outside every layer.
    layers = [("models", frozenset({"sss.models"})), ("contract", frozenset({"sss.trainer.module"}))]
    graph = {"sss.models.hunter": {"sss.trainer.module"}, "sss.trainer.module": {"sss.models.hunter"}, "sss.x": set()}
    assert _layer_problems(graph, layers) == [
        "sss.x: in no layer (add it to LAYERS)",
        "sss.trainer.module (contract) imports sss.models.hunter (models), a layer above",
    ]
    assert _layer_of("sss.trainer.module", LAYERS) > _layer_of("sss.models.hunter", LAYERS)  # longest prefix wins
    assert _layer_of("sss.ssss", LAYERS) is None  # "sss" is the package's __init__ only


def _package(module: str, modules: set[str]) -> str:
    return (
        module
        if f"{module}.__init__" in modules or any(m.startswith(module + ".") for m in modules)
        else (module.rsplit(".", 1)[0])
    )


def test_no_private_name_is_imported_across_packages():
    # A private module (``sss.trainer._oom``) or name (``_helper``) is used inside its own package only.
    modules = {_module_name(p) for p in ROOT.rglob("*.py")}
    private = []
    for path in ROOT.rglob("*.py"):
        mine = (
            _package(_module_name(path), modules)
            if path.name == "__init__.py"
            else _module_name(path).rsplit(".", 1)[0]
        )
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sss"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    # `from sss.trainer import _oom` imports the module sss.trainer._oom, from package sss.trainer.
                    names.append((full, node.module) if full in modules else (full, _package(node.module, modules)))
            elif isinstance(node, ast.Import):
                names = [(a.name, a.name.rsplit(".", 1)[0]) for a in node.names if a.name.startswith("sss")]
            for full, package in names:
                hidden = any(part.startswith("_") and part != "__init__" for part in full.split(".")[1:])
                if hidden and package != mine and not mine.startswith(package + "."):
                    private.append(f"{_module_name(path)} imports {full}")
    assert not private, "\n".join(private)
