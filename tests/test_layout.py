"""The package's shape (docs/ARCHITECTURE.md): imports flow one way between layers, no module
imports itself back through a cycle, and the boundaries STYLE.md names hold (only the CLI imports
typer and rich; only engine/graphs.py captures CUDA graphs). Read from the source with ast, imports
inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "batchscribe"
# Each top-level unit's layer: a module may import its own unit or a lower layer, never a higher one.
LAYERS = {
    "version": 0, "constants": 0, "bpe_merges": 0, "stops": 0, "process_context": 0, "heap": 0, "config": 1, "hub_probe": 1,
    "audio": 2, "attention": 2, "weights": 2, "segments": 2, "words": 2, "dtw": 2,
    "model": 3,  # the decoder calls an attention backend
    "engine": 4, "model_check": 4.5,
    "output": 5, "eval": 6,
    "api": 7, "sink": 8, "run_options": 8.4, "run_folder": 8.6, "run": 9, "fleet": 9.2, "ray": 9.3, "cli_text": 9.5, "cli": 10, "__main__": 11, "__init__": 12,
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """module -> the batchscribe modules it imports (a `from pkg import name` counts as the
    submodule pkg.name when that is a module, else as pkg)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("batchscribe")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("batchscribe"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_flow_one_way() -> None:
    graph = _imports()
    assert {_unit(m) for m in graph} <= set(LAYERS), {_unit(m) for m in graph} - set(LAYERS)
    upward = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
              if _unit(t) != _unit(m) and LAYERS[_unit(t)] >= LAYERS[_unit(m)]]  # fmt: skip
    assert upward == []


def test_no_import_cycles() -> None:
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def _third_party_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_cli_imports_typer_and_rich() -> None:
    users = {_module_name(p) for p in PACKAGE.rglob("*.py") if _third_party_imports(p) & {"typer", "rich"}}
    assert users and all(u == "batchscribe.cli" or u.startswith("batchscribe.cli.") for u in users)


def test_only_the_graph_module_captures() -> None:
    users = {_module_name(p) for p in PACKAGE.rglob("*.py") if "CUDAGraph" in p.read_text()}
    assert users == {"batchscribe.engine.graphs"}


def test_modules_and_functions_stay_short() -> None:
    """One concern per module: at most ~400 lines a module and ~60 a function (STYLE.md)."""
    long_modules, long_functions = [], []
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        if len(source.splitlines()) > 400:
            long_modules.append(_module_name(path))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{_module_name(path)}.{node.name}")
    assert long_modules == [] and long_functions == []
