"""The layers of ``refcheck/`` import only downward, and nothing imports a top-level ``references`` or
``optimized`` (installed, they live under the ``refcheck`` namespace).

From the bottom: the float64 references, our kernels and the Triton runtime import nothing of
refcheck's above them; the model (cases, implementations, metrics and the Hypothesis building
blocks, then the op cards, then the registry, budgets and naive forms); the engine (verification,
examples, laws, buckets, grid, reproducers); the commands (CLI, report, drift, fuzz, the pytest
plugin); the laws as pytest tests. A module may import its own layer and any layer below.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "refcheck"

LAYERS = (
    ("refcheck.references", "refcheck.optimized", "refcheck.runtime"),
    ("refcheck.model.case", "refcheck.model.implementation", "refcheck.model.metrics", "refcheck.model.monte_carlo",
     "refcheck.model.targets", "refcheck.strategies"),
    ("refcheck.model.ops",),
    ("refcheck.model.registry", "refcheck.model.budgets", "refcheck.model.naive"),
    ("refcheck.engine",),
    ("refcheck.commands",),
    ("refcheck.properties", "refcheck.__main__"),
)


def layer(module: str) -> int | None:
    """The layer of a refcheck module (None: the package root ``refcheck`` itself, or outside)."""
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, function-level imports included."""
    name, is_package = module_name(path)
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]   # submodules named
    return found


FILES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    folders = {"refcheck", "refcheck.model"}        # packages whose modules sit in several layers
    missing = [module_name(f)[0] for f in FILES if layer(module_name(f)[0]) is None and module_name(f)[0] not in folders]
    assert missing == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_go_only_down_the_layers(path):
    name = module_name(path)[0]
    mine = layer(name)
    upward = [f"line {line}: {target} (layer {layer(target)} > {mine})" for line, target in imported(path)
              if mine is not None and layer(target) is not None and layer(target) > mine]
    assert upward == [], f"{name} imports upward"


@pytest.mark.parametrize("path", FILES + sorted((PACKAGE.parent / "tests").glob("*.py"))
                         + sorted((PACKAGE.parent / "benchmarks").glob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_nothing_imports_top_level_references_or_optimized(path):
    tops = [(node.lineno, n) for node in ast.walk(ast.parse(path.read_text()))
            for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                      [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
            if n.split(".")[0] in ("references", "optimized")]
    assert tops == []


def test_the_engine_modules_import_each_other_without_a_cycle():
    """Inside ``refcheck.engine`` too the imports read top to bottom (function-level ones included): the
    one-liners a failure prints (``oneliner``) below the laws and verdicts, the functions they call
    (``reproduce``) above them."""
    engine = {module_name(f)[0]: f for f in FILES if module_name(f)[0].startswith("refcheck.engine.")}
    edges = {name: {t for _, t in imported(path) if t in engine and t != name} for name, path in engine.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        if name not in done:
            for target in edges[name]:
                visit(target, path + (name,))
            done.add(name)
    for name in edges:
        visit(name, ())
