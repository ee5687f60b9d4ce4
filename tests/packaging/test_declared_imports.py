"""Every module a distribution ships imports only what that distribution declares.

Lazy imports inside functions count too: an undeclared lazy import is what made
``edge conformance ort-cpu`` fail with ``No module named 'onnx'`` from the wheels.
"""

from __future__ import annotations

import ast
import re
import sys

import pytest

from .distributions import DIRS, ROOT, packages, project

#: Import name -> distribution names that provide it, where the two differ.
PROVIDERS = {
    "PIL": {"pillow"},
    "yaml": {"pyyaml"},
    "qai_hub": {"qai-hub"},
    "onnxruntime": {"onnxruntime", "onnxruntime-qnn"},
}

#: Runtimes that live in the route's interpreter, never in the controller's environment:
#: only worker-side modules import them, each named here with its reason.
ROUTE_RUNTIMES = {
    ("plugins/libraries/ort", "onnxruntime"): "edge_ort.worker runs whichever onnxruntime build "
                                    "the route's interpreter has (they are exclusive)",
    ("plugins/backends/vllm_cuda", "vllm"): "edge_vllm_cuda.worker runs in vLLM's own environment",
}

#: Modules other than the worker that may import a route runtime, each with its reason.
RUNTIME_USERS = {
    ("plugins/libraries/ort", "onnxruntime"): {
        "build.py": "edge derive runs ONNX Runtime's tools in the controller's environment, "
                    "where the backend that adds the command installed its onnxruntime",
    },
}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(directory: str) -> set[str]:
    meta = project(directory)
    names = {_requirement_name(r) for r in meta.get("dependencies", [])}
    for extra in meta.get("optional-dependencies", {}).values():
        names |= {_requirement_name(r) for r in extra}
    names.add(str(meta["name"]))
    return names


def _imports(directory: str) -> dict[str, set[str]]:
    """Top-level module -> files importing it, for every import statement at any depth."""
    found: dict[str, set[str]] = {}
    for package in packages(directory):
        for path in (ROOT / directory / "src" / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(path.name)
    return found


def _distribution_of(module: str) -> set[str]:
    if module in PROVIDERS:
        return PROVIDERS[module]
    return {module.replace("_", "-").lower()}


@pytest.mark.parametrize("directory", DIRS)
def test_every_import_is_declared(directory: str) -> None:
    declared = _declared(directory)
    own = set(packages(directory))
    missing = {}
    for module, files in _imports(directory).items():
        if module in sys.stdlib_module_names or module in own or module == "__future__":
            continue
        if (directory, module) in ROUTE_RUNTIMES:
            continue
        if not _distribution_of(module) & declared:
            missing[module] = sorted(files)
    assert not missing, f"{directory} imports undeclared modules: {missing}"


def test_the_scan_sees_lazy_imports() -> None:
    """The scan is not vacuous: imports inside function bodies are found."""
    assert "session.py" in _imports("plugins/backends/qnn")["qai_hub"]  # lazy, in a method
    assert "worker.py" in _imports("plugins/libraries/ort")["onnxruntime"]
    # onnx is never needed to serve: only the derive extra (edge derive) brings it
    required = {_requirement_name(r)
                for r in project("plugins/libraries/ort").get("dependencies", [])}
    assert "onnx" not in required and "onnx" in _declared("plugins/libraries/ort")
    assert "onnx" not in {_requirement_name(r)
                          for r in project("plugins/backends/qnn").get("dependencies", [])}


def test_route_runtimes_are_imported_only_by_worker_modules() -> None:
    for (directory, module), _reason in ROUTE_RUNTIMES.items():
        files = _imports(directory).get(module, set())
        allowed = {"worker.py", *RUNTIME_USERS.get((directory, module), {})}
        assert "worker.py" in files and files <= allowed, (directory, module, files)
