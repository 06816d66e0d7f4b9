"""The agentrl package's modules import each other without a cycle, and every import names a real module.

Imports are read from the source (`ast`), wherever they stand: at the top of a module, inside a
function (the engine's CUDA-only imports), under `if TYPE_CHECKING:`. A lazy import that names a
module which moved away would fail only on the machine that runs it; here it fails everywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "agentrl"


def module_name(path: Path, root: Path) -> str:
    """`agentrl.engine.factory` for root/agentrl/engine/factory.py; a package is named by its __init__.py."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.Module, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of `modules` that a module's source imports."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1 more
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = ".".join(package[: len(package) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            # `from a.b import c` imports a.b.c when c is a module, else (c a name in a.b) a.b itself.
            found.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            )
    return {module for module in found if module in modules}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package under `root` -> the package's modules it imports."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(paths)
    return {
        name: imported_modules(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        - {name}
        for name, path in paths.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported) :] + [imported]
            if imported not in state and (cycle := visit(imported)) is not None:
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def unresolved_imports(root: Path) -> list[str]:
    """'module: imported' for each `import agentrl.x` or `from agentrl.x import` that names no module."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    missing = []
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            missing += [f"{name}: {t}" for t in targets if t.split(".")[0] == "agentrl" and t not in paths]
    return missing


def test_the_agentrl_package_has_no_import_cycle():
    cycle = find_cycle(import_graph(PACKAGE_ROOT))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_agentrl_import_names_a_module_that_exists():
    assert unresolved_imports(PACKAGE_ROOT) == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    package = tmp_path / "agentrl"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("")
    (package / "engine" / "batch.py").write_text("def unpack():\n    from agentrl.engine.unpack import run\n")
    (package / "engine" / "unpack.py").write_text("from agentrl.engine.batch import FIELDS\n")
    (package / "engine" / "other.py").write_text("from . import batch\nfrom agentrl.engine import VERSION\n")
    graph = import_graph(package)
    assert graph["agentrl.engine.other"] == {"agentrl.engine", "agentrl.engine.batch"}
    assert graph["agentrl.engine.unpack"] == {"agentrl.engine.batch"}
    assert find_cycle(graph) == ["agentrl.engine.batch", "agentrl.engine.unpack", "agentrl.engine.batch"]
    (package / "engine" / "unpack.py").write_text("FIELDS = 3\n")
    assert find_cycle(import_graph(package)) is None
