"""The layering check: no import circles, no private names across modules, no mixins.

Run by ``make lint`` over the distributions' sources (``contracts``, ``core`` and
``plugins`` by default; tests are never scanned)::

    python tools/check_layers.py [--report] [ROOT ...]

It fails (exit 1) on any of:

* an import circle between modules of the scanned sources, counting every import: at
  module level, inside functions, under ``if TYPE_CHECKING:``;
* an underscore name imported from another module (``from a.b import _c``), or a
  package-private module (a module whose own name starts with an underscore, such as
  ``edge_contracts._posix_shm``) imported from outside its package;
* an attribute ``x._y`` read or called where ``x`` is not ``self`` or ``cls``.
  Dunders (``__x__``) and sunders (``_x_``) are not private; neither are the standard
  library's own idioms: an attribute of a standard-library module
  (``argparse._SubParsersAction``, ``os._exit``) and the namedtuple methods
  (:data:`STDLIB_IDIOMS`);
* a mixin: a class that declares attributes it never sets (``_lock: Lock`` in its body,
  no ``._lock = ...`` in any of its own methods) for its methods to use, or whose methods
  raise ``NotImplementedError`` for another base of the same object to provide while it
  is combined with another base. Protocols, attrs classes and dataclasses, enums,
  ``TypedDict``/``NamedTuple`` and exceptions are not mixins.

``--report`` prints every module with its line count and the one concept it holds (the
first line of its docstring), then one JSON line::

    {"circles": 0, "private_cross_module": 0, "mixin_classes": 0, "largest_module_lines": N}

Exit codes: 0 nothing found; 1 a circle, a private name across modules or a mixin (each
listed, with its file and line); 2 usage error (a root that does not exist).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ROOTS = ("contracts", "core", "plugins")

STDLIB_IDIOMS = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})
"""Underscore names the standard library asks its users to call (namedtuple's API)."""

_NOT_MIXIN_BASES = frozenset({
    "Protocol", "TypedDict", "NamedTuple", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag",
    "Exception", "BaseException", "Generic",
})
_VALUE_DECORATORS = frozenset({"dataclass", "frozen", "define", "mutable", "s", "attrs"})


@dataclass
class Module:
    """One module of the scanned sources."""

    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    lines: int

    @property
    def concept(self) -> str:
        """The first line of the module's docstring: the one concept it holds."""
        doc = ast.get_docstring(self.tree) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        return first or "(no docstring)"


@dataclass
class Findings:
    """What the check found."""

    modules: dict[str, Module]
    circles: list[list[str]] = field(default_factory=list)
    private: list[str] = field(default_factory=list)
    mixins: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not (self.circles or self.private or self.mixins)

    def summary(self) -> dict[str, int]:
        """The counts of the report's JSON line."""
        largest = max((m.lines for m in self.modules.values()), default=0)
        return {"circles": len(self.circles), "private_cross_module": len(self.private),
                "mixin_classes": len(self.mixins), "largest_module_lines": largest}


def discover(roots: Sequence[Path]) -> dict[str, Module]:
    """Every module under a ``src`` directory of ``roots``, by dotted name (tests skipped)."""
    found: dict[str, Module] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            if "src" not in parts or "tests" in parts or any(p.startswith(".") for p in parts):
                continue
            dotted = list(parts[parts.index("src") + 1:])
            dotted[-1] = dotted[-1][:-3]
            is_package = dotted[-1] == "__init__"
            if is_package:
                dotted.pop()
            if not dotted:
                continue
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text, filename=str(path))
            name = ".".join(dotted)
            found[name] = Module(name, path, is_package, tree, len(text.splitlines()))
    return found


def _resolve(module: Module, target: str | None, level: int) -> str:
    """The absolute name a (possibly relative) ``from`` import names."""
    if not level:
        return target or ""
    base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def _known(name: str, modules: dict[str, Module]) -> str | None:
    """The longest prefix of ``name`` that is a scanned module, if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_private(name: str) -> bool:
    """An underscore name that is neither a dunder nor a sunder."""
    if not name.startswith("_") or name == "_":
        return False
    if name.startswith("__") and name.endswith("__"):
        return False
    return not (name.endswith("_") and not name.startswith("__"))


def _private_module(name: str) -> str | None:
    """The package a package-private module belongs to (None: the module is public)."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if index and _is_private(part):
            return ".".join(parts[:index])
    return None


def _imports(module: Module, modules: dict[str, Module]
             ) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in the module."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, modules)
                if target is not None:
                    yield target, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node.module, node.level)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in modules:
                    yield full, None, node.lineno
                    continue
                target = _known(source, modules)
                if target is not None:
                    yield target, alias.name, node.lineno


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _stdlib_aliases(tree: ast.Module) -> set[str]:
    """Names a module binds to standard-library modules (``import argparse``, ``as``)."""
    names: set[str] = set()
    stdlib = sys.stdlib_module_names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in stdlib:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif (isinstance(node, ast.ImportFrom) and not node.level and node.module
              and node.module.split(".")[0] in stdlib):
            for alias in node.names:
                names.add(alias.asname or alias.name)
    return names


def _private_attributes(module: Module) -> Iterator[tuple[str, int]]:
    """Every ``x._y`` where ``x`` is not ``self``/``cls`` nor a standard-library idiom."""
    stdlib = _stdlib_aliases(module.tree)
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        if node.attr in STDLIB_IDIOMS:
            continue
        value = node.value
        if isinstance(value, ast.Name) and (value.id in ("self", "cls") or value.id in stdlib):
            continue
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "super"):
            continue
        yield f"{ast.unparse(value)}.{node.attr}", node.lineno


def _base_name(base: ast.expr) -> str:
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def _is_value_class(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in _VALUE_DECORATORS:
            return True
    return False


def _raises_not_implemented(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = [s for s in function.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    target = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(target, ast.Name) and target.id == "NotImplementedError"


def _mixins(module: Module) -> Iterator[tuple[str, int]]:
    """Classes that lean on another class of the same object for attributes or methods."""
    classes = [n for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)]
    combined: set[str] = set()  # classes used as one of several bases here
    for node in classes:
        names = [_base_name(b) for b in node.bases]
        if len([n for n in names if n not in ("object", "Generic")]) > 1:
            combined.update(names)
    for node in classes:
        bases = {_base_name(b) for b in node.bases}
        if bases & _NOT_MIXIN_BASES or _is_value_class(node):
            continue
        if any(b.endswith(("Error", "Exception", "Refused", "Refusal")) for b in bases):
            continue
        declared = {s.target.id: s.lineno for s in node.body
                    if isinstance(s, ast.AnnAssign) and s.value is None
                    and isinstance(s.target, ast.Name)}
        methods = [s for s in node.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
        assigned: set[str] = set()
        used: set[str] = set()
        for method in methods:
            for inner in ast.walk(method):
                if not isinstance(inner, ast.Attribute) or not isinstance(inner.value, ast.Name):
                    continue
                if isinstance(inner.ctx, ast.Store):  # on self, or on an instance it makes
                    assigned.add(inner.attr)
                elif inner.value.id == "self":
                    used.add(inner.attr)
        needed = sorted(n for n in declared if n in used and n not in assigned)
        if needed:
            yield (f"{node.name} uses attributes it never sets: {', '.join(needed)}",
                   node.lineno)
            continue
        abstract = [m.name for m in methods if _raises_not_implemented(m)]
        if abstract and node.name in combined:
            yield (f"{node.name}, combined with another base, raises NotImplementedError "
                   f"for {', '.join(abstract)}", node.lineno)


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Module → the other scanned modules it imports (every import counted)."""
    return {name: {target for target, _, _ in _imports(module, modules) if target != name}
            for name, module in modules.items()}


def check(roots: Sequence[Path]) -> Findings:
    """Run every check over the modules under ``roots``."""
    modules = discover(roots)
    findings = Findings(modules)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, module in modules.items():
        where = module.path
        for target, imported, line in _imports(module, modules):
            owner = _private_module(target)
            if owner is not None and not (name == owner or name.startswith(owner + ".")):
                findings.private.append(f"{where}:{line}: {name} imports the "
                                        f"package-private module {target}")
            if target == name:
                continue
            edges[name].add(target)
            if imported is not None and _is_private(imported):
                findings.private.append(f"{where}:{line}: {name} imports {imported} "
                                        f"from {target}")
        for text, line in _private_attributes(module):
            findings.private.append(f"{where}:{line}: {name} uses {text}")
        for text, line in _mixins(module):
            findings.mixins.append(f"{where}:{line}: mixin: {text}")
    findings.circles = _circles(edges)
    return findings


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; the exit code (0 clean, 1 findings, 2 usage)."""
    parser = argparse.ArgumentParser(
        prog="check_layers", description="Import circles, private names across modules "
        "and mixins in the distributions' sources (tests excepted).")
    parser.add_argument("roots", nargs="*", type=Path,
                        help=f"directories to scan (default: {' '.join(DEFAULT_ROOTS)})")
    parser.add_argument("--report", action="store_true",
                        help="print every module with its concept, then the JSON counts")
    args = parser.parse_args(argv)
    roots: list[Path] = args.roots or [Path(r) for r in DEFAULT_ROOTS]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        print(f"check_layers: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    findings = check(roots)
    if args.report:
        width = max((len(n) for n in findings.modules), default=0)
        for name in sorted(findings.modules):
            module = findings.modules[name]
            print(f"{name:<{width}}  {module.lines:>5}  {module.concept}")
    for circle in findings.circles:
        print("circle: " + " -> ".join(circle), file=sys.stderr)
    for line in findings.private + findings.mixins:
        print(line, file=sys.stderr)
    if args.report or not findings.ok:
        print(json.dumps(findings.summary()))
    return 0 if findings.ok else 1


if __name__ == "__main__":
    sys.exit(main())
