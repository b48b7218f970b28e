"""Imports point down: no module of `service` imports one of a layer above its own, and no
chain of imports (at the top of a module or inside a function) comes back to where it began."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "service"

# Bottom to top. A module may import its own layer and the ones below it, never above.
LAYERS = [
    "service.core",  # settings, logging, metrics, the database, the schema
    "service.sources",  # the kinds: verify a raw delivery; the sources file
    "service.store",  # the only code that knows the SQL
    "service.processing",  # the handler API, pipelines, running handlers, retry policy
    "service.worker",  # claim loops, reaping, pruning
    "service.api",  # HTTP: ingest, admin, health, metrics and their dependencies
    "service",  # the app factory, the supervisor, serve, the worker command, operator commands
    "service.cli",  # the command's parser, above everything it runs
]
TOP = ("service.cli", "service.__main__")


def layer_of(module: str) -> int:
    if module in TOP:
        return len(LAYERS) - 1
    for rank, name in enumerate(LAYERS[:-2]):
        if module == name or module.startswith(name + "."):
            return rank
    return len(LAYERS) - 2


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.Module, modules: Collection[str] = ()) -> set[str]:
    """The `service` modules a module imports, wherever the import statement stands. Of
    `from service.x import y`, that is `service.x.y` when it is one of `modules`, else
    `service.x` (a package's `__init__`, run on the way to a submodule, is not counted)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return {name for name in found if name == "service" or name.startswith("service.")}


def import_graph() -> dict[str, set[str]]:
    """Each module of `service` and the modules of `service` it imports."""
    sources = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    return {
        module: imported(ast.parse(path.read_text()), sources.keys()) - {module}
        for module, path in sources.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each
    is a set of modules that import one another, directly or through others."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                lowlink[module] = min(lowlink[module], lowlink[target])
            elif target in stack:
                lowlink[module] = min(lowlink[module], index[target])
        if lowlink[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            component.append(module)
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        rank = layer_of(module)
        for target in sorted(imported(ast.parse(path.read_text()))):
            if layer_of(target) > rank:
                upward.append(f"{module} ({LAYERS[rank]}) imports {target}")
    assert upward == []


def test_no_chain_of_imports_comes_back_to_where_it_began() -> None:
    # Imports inside functions count: they run later, but a pair of modules that reach for
    # each other is one idea split in two (as the parser and `serve` once were).
    assert cycles(import_graph()) == []


def test_a_cycle_is_found_however_long_its_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_layer_map_ranks_modules_as_intended() -> None:
    assert layer_of("service.core.db") == 0
    assert layer_of("service.store.claims") == 2
    assert layer_of("service.api.admin.cursor") == 5
    assert layer_of("service.app") == 6
    assert layer_of("service") == 6
    assert layer_of("service.serve") == 6
    assert layer_of("service.cli") == 7


def test_the_http_process_loads_neither_the_worker_nor_its_http_client_nor_alembic() -> None:
    # A fresh interpreter, as an HTTP child is: what importing the app and `serve` loads, and
    # what its lifespan loads when it starts and stops (it connects to nothing until a request
    # comes, so an unreachable database will do). /readyz alone reads the migrations' head.
    # (Each module left out is start-up CPU every HTTP process and its restarts save.)
    probe = """
import asyncio, sys
import service.app, service.serve
from service.core.settings import Settings
from service.sources.config_file import InboxConfig

async def start_and_stop() -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:9/none", admin_tokens="t" * 32)
    app = service.app.create_app(settings, InboxConfig())
    async with app.router.lifespan_context(app):
        pass

asyncio.run(start_and_stop())
print(" ".join(m for m in ("httpx", "jwt", "alembic", "service.worker.worker",
    "service.worker.runtime", "service.processing.forward") if m in sys.modules))
"""
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == []
