"""Every module a distribution ships imports only what that distribution declares.

Lazy imports inside functions count too: an undeclared lazy import is what made
``edge conformance ort-cpu`` fail with ``No module named 'onnx'`` from the wheels.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, requires

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def requirement_name(requirement: str) -> str:
    """The distribution a PEP 508 requirement (or a bare name) names, normalized (PEP 503)."""
    return canonicalize_name(Requirement(requirement).name)


def _extra_name(name: str) -> str:
    """An extra's name normalized as PEP 685 compares them: lower case, ``-_.`` runs ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(directory: str) -> set[str]:
    meta = project(directory)
    names = {requirement_name(r) for r in meta.get("dependencies", [])}
    for extra in meta.get("optional-dependencies", {}).values():
        names |= {requirement_name(r) for r in extra}
    names.add(str(meta["name"]))
    return names


def _imports(directory: str) -> dict[str, set[str]]:
    """Top-level module -> files importing it, for every import statement at any depth."""
    found: dict[str, set[str]] = {}
    for name, files in _dotted_imports(directory).items():
        found.setdefault(name.split(".")[0], set()).update(files)
    return found


def _dotted_imports(directory: str) -> dict[str, set[str]]:
    """Imported module, as written (``a.b.c``) -> files importing it, at any depth."""
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
                    found.setdefault(name, set()).add(path.name)
    return found


def _extra_requirements(distribution: str, extra: str) -> set[str]:
    """What ``distribution`` requires only under its extra ``extra``.

    This workspace's distributions are read from their ``pyproject.toml``; others from
    the installed metadata (none when not installed). Extra names compare normalized
    either way (PEP 685: ``Derive_Tools`` is ``derive-tools``).
    """
    own = {requirement_name(str(project(d)["name"])): d for d in DIRS}
    if distribution in own:
        extras = project(own[distribution]).get("optional-dependencies", {})
        wanted = _extra_name(extra)
        return {requirement_name(r) for name, listed in extras.items()
                if _extra_name(name) == wanted for r in listed}
    try:
        listed = requires(distribution) or []
    except PackageNotFoundError:
        return set()
    return _only_under_extra(listed, extra)


def _only_under_extra(listed: list[str], extra: str) -> set[str]:
    """The names in ``listed`` (``Requires-Dist`` lines) required only under ``extra``.

    Extra names compare normalized (PEP 685: ``Foo_Bar`` is ``foo-bar``), as
    ``packaging`` >= 22 evaluates markers; older releases compared them as written.
    """
    names = set()
    for text in listed:
        requirement = Requirement(text)
        marker = requirement.marker
        if (marker is not None and marker.evaluate({"extra": extra})
                and not marker.evaluate({"extra": ""})):
            names.add(requirement_name(requirement.name))
    return names


def _submodule_extras(directory: str) -> dict[str, set[str]]:
    """``pkg.sub`` imported here -> what pkg's distribution requires under its extra ``sub``.

    A dependency that names an extra after a submodule leaves that submodule's own
    imports to the extra (onnxruntime: ``ml_dtypes; extra == "quantization"``, imported
    by ``onnxruntime.quantization`` at its import). Read from the installed
    distributions' metadata: one not installed here adds nothing.
    """
    found: dict[str, set[str]] = {}
    own = set(packages(directory))
    for name in _dotted_imports(directory):
        parts = name.split(".")
        if len(parts) < 2 or parts[0] in sys.stdlib_module_names or parts[0] in own:
            continue
        for distribution in _distribution_of(parts[0]):
            needed = _extra_requirements(distribution, _extra_name(parts[1]))
            if needed:
                found.setdefault(".".join(parts[:2]), set()).update(needed)
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


@pytest.mark.parametrize("directory", DIRS)
def test_a_submodule_whose_extra_brings_requirements_has_them_declared(directory: str) -> None:
    """Importing ``pkg.sub`` where pkg's distribution has an extra ``sub`` needs what it lists.

    ``from onnxruntime.quantization import ...`` fails with ``No module named
    'ml_dtypes'`` unless the importer declares it (onnxruntime leaves it to its extra).
    """
    declared = _declared(directory)
    meta = project(directory)
    with_extras = {(requirement_name(r.name), _extra_name(extra))
                   for r in map(Requirement, [*meta.get("dependencies", []),
                                              *(t for e in meta.get("optional-dependencies",
                                                                    {}).values() for t in e)])
                   for extra in r.extras}
    missing = {}
    for module, needed in _submodule_extras(directory).items():
        top, sub = module.split(".")
        if any((d, _extra_name(sub)) in with_extras for d in _distribution_of(top)):
            continue  # declared as dist[sub]: the extra brings them
        if needed - declared:
            missing[module] = sorted(needed - declared)
    assert not missing, f"{directory} imports submodules needing undeclared extras: {missing}"


def test_the_workspace_s_own_extras_compare_normalized(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extra of a workspace pyproject is found however either side spells it (PEP 685).

    Before, the pyproject's extras were looked up by the exact key: ``derive-tools`` did
    not find an extra written ``Derive_Tools``, while installed metadata compared
    normalized (:func:`test_extra_names_in_markers_compare_normalized`).
    """
    table = {"name": "Edge_Thing",
             "optional-dependencies": {"Derive_Tools": ["onnx>=1.16", "Pillow"], "x": ["y"]}}
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "DIRS", ["plugins/thing"])
    monkeypatch.setattr(this, "project", {"plugins/thing": table}.__getitem__)
    for spelled in ("derive-tools", "derive_tools", "Derive.Tools", "derive__tools"):
        assert _extra_requirements("edge-thing", spelled) == {"onnx", "pillow"}, spelled
    assert _extra_requirements("edge-thing", "derive") == set()


def test_extra_names_in_markers_compare_normalized() -> None:
    """A submodule ``foo_bar`` finds an extra written ``Foo_Bar`` or ``foo.bar`` (PEP 685)."""
    listed = ['a; extra == "Foo_Bar"', "b; extra == 'foo.bar'", 'c; extra == "other"', "d"]
    assert _only_under_extra(listed, "foo-bar") == {"a", "b"}


def test_the_extra_scan_sees_onnxruntime_quantization() -> None:
    """The extra scan is not vacuous: onnxruntime's extra, and one of the workspace's."""
    if "ml-dtypes" not in _extra_requirements("onnxruntime", "quantization"):
        pytest.skip("the installed onnxruntime names no quantization extra")
    assert "ml-dtypes" in _submodule_extras("plugins/libraries/ort")["onnxruntime.quantization"]
    # edge-qnn imports edge_ort.derive and declares edge-ort[derive]: read from pyproject
    assert "onnx" in _submodule_extras("plugins/backends/qnn")["edge_ort.derive"]


def test_the_scan_sees_lazy_imports() -> None:
    """The scan is not vacuous: imports inside function bodies are found."""
    assert "session.py" in _imports("plugins/backends/qnn")["qai_hub"]  # lazy, in a method
    assert "worker.py" in _imports("plugins/libraries/ort")["onnxruntime"]
    # onnx is never needed to serve: only the derive extra (edge derive) brings it
    required = {requirement_name(r)
                for r in project("plugins/libraries/ort").get("dependencies", [])}
    assert "onnx" not in required and "onnx" in _declared("plugins/libraries/ort")
    assert "onnx" not in {requirement_name(r)
                          for r in project("plugins/backends/qnn").get("dependencies", [])}


def test_route_runtimes_are_imported_only_by_worker_modules() -> None:
    for (directory, module), _reason in ROUTE_RUNTIMES.items():
        files = _imports(directory).get(module, set())
        allowed = {"worker.py", *RUNTIME_USERS.get((directory, module), {})}
        assert "worker.py" in files and files <= allowed, (directory, module, files)
