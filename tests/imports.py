"""Reading rayslice's imports from its source: the import-direction rules (tests/rayslice/
test_imports.py) and the closure of what is shipped to machines without rayslice (a job's modules,
the recovery bundle) both use it.

Every module is parsed with `ast`, so an import inside a function counts as much as one at the top
(a lazy import is still a dependency), and so does `importlib.import_module` or `__import__` called
with a literal module name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import rayslice

PACKAGE = Path(rayslice.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, wherever it stands."""
    found: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.append((node.lineno, prefix))
            found += [(node.lineno, f"{prefix}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def module_file(name: str) -> Path | None:
    """The file of rayslice module or package `name`; None for anything else (an attribute such
    as `rayslice.workloads.__path__`, or a module outside rayslice)."""
    if name.split(".")[0] != "rayslice":
        return None
    base = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def closure(entries: Iterable[str]) -> set[str]:
    """Every rayslice file that importing `entries` can load, as ``rayslice/...`` paths: their
    rayslice imports, followed through, and the ``__init__.py`` of each package on the way."""
    todo = [f for name in entries if (f := module_file(name)) is not None]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        name = module_name(path)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        imported = [n for _, n in imported_modules(path.read_text(), name, path.name == "__init__.py")]
        todo += [f for n in [*parents, *imported] if (f := module_file(n)) is not None]
    return {p.relative_to(PACKAGE.parent).as_posix() for p in seen}
