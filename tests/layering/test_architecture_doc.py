"""docs/architecture.md stays true: every module listed, every drawn layer as imported."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def tool() -> ModuleType:
    path = ROOT / "tools" / "check_layers.py"
    spec = importlib.util.spec_from_file_location("check_layers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def drawing() -> dict[str, list[list[str]]]:
    """Package → its drawn lines (top first), each a list of names, from the layers block."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("## The layers inside each distribution", 1)[1].split("```")[1]
    block = block.split("\n", 1)[1]  # past the fence's language label (``text``)
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            match = re.search(r"(edge_[a-z_.]+)\)?$", line.strip())
            assert match, line
            package = match.group(1).rsplit("/", 1)[-1].replace("/", ".")
            current = sections.setdefault(package.split("src.")[-1], [])
            continue
        assert current is not None
        names = re.split(r" {3,}", line.strip())[0].split()
        current.append(names)
    return sections


def test_every_module_has_its_line() -> None:
    modules = tool().discover([ROOT / r for r in ("contracts", "core", "plugins")])
    text = DOC.read_text(encoding="utf-8")
    missing = [name for name in modules if f"| `{name}` |" not in text]
    assert not missing, f"docs/architecture.md lists no line for {missing}"


def test_the_drawn_layers_match_the_imports() -> None:
    check_layers = tool()
    modules = check_layers.discover([ROOT / r for r in ("contracts", "core", "plugins")])
    graph = check_layers.import_graph(modules)
    sections = drawing()
    assert {"edge_contracts", "edge_core", "edge_core.runtime", "edge_core.host", "edge_ort",
            "edge_serve"} <= set(sections)
    for package, lines in sections.items():
        units = {f"{package}.{name}": row for row, names in enumerate(lines) for name in names}

        def unit(module: str, units: dict[str, int] = units) -> str | None:
            found = [u for u in units if module == u or module.startswith(u + ".")]
            return max(found, key=len) if found else None

        inside = [m for m in modules if m.startswith(package + ".")]
        undrawn = [m for m in inside if unit(m) is None]
        assert not undrawn, f"{package}: not drawn: {undrawn}"
        for module in inside:
            here = unit(module)
            for target in graph[module]:
                there = unit(target)
                if there is None or there == here or not target.startswith(package + "."):
                    continue
                assert here is not None
                assert units[here] < units[there], (
                    f"{package}: {module} imports {target}, but "
                    f"{here.removeprefix(package + '.')} is not drawn above "
                    f"{there.removeprefix(package + '.')}")
