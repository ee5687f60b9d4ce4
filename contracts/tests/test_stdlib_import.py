"""edge_contracts imports with the standard library alone, from a bare interpreter."""

import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# Modules that must never need more than the standard library.
REQUIRED = {
    "edge_contracts",
    "edge_contracts.error_copies",
    "edge_contracts.errors",
    "edge_contracts.validation",
    "edge_contracts.jsonvalues",
    "edge_contracts.dtypes",
    "edge_contracts.protocol",
    "edge_contracts.buffers",
    "edge_contracts.requests",
    "edge_contracts.state",
    "edge_contracts.devices",
    "edge_contracts.manifest",
    "edge_contracts.headers",
    "edge_contracts.wire",
    "edge_contracts.conformance",
}
# A module opts into numpy only by importing it (or the tensors module) at top level.
USES_NUMPY = re.compile(
    r"^(import numpy|from numpy|import edge_contracts\.tensors|from edge_contracts\.tensors)",
    re.MULTILINE,
)


def stdlib_only_modules() -> list[str]:
    """REQUIRED plus every other module that does not itself import numpy or tensors."""
    found = set(REQUIRED)
    for info in pkgutil.walk_packages([str(SRC / "edge_contracts")], prefix="edge_contracts."):
        relative = info.name.split(".")[1:]
        path = SRC.joinpath("edge_contracts", *relative)
        source = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
        if info.name.endswith("__main__") or USES_NUMPY.search(source.read_text("utf-8")):
            continue
        found.add(info.name)
    assert "edge_contracts.tensors" not in found
    return sorted(found)


def run_bare(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with -S -I: no site-packages, no PYTHONPATH, only contracts/src."""
    prelude = f"import sys; sys.path.insert(0, {str(SRC)!r})\n"
    return subprocess.run(
        [sys.executable, "-S", "-I", "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_module_but_tensors_imports_without_numpy() -> None:
    modules = stdlib_only_modules()
    assert {"edge_contracts.wire", "edge_contracts.conformance"} <= set(modules)
    code = (
        "import importlib, json\n"
        f"names = {modules!r}\n"
        "for name in names: importlib.import_module(name)\n"
        "tops = sorted({m.split('.')[0] for m in sys.modules})\n"
        "print(json.dumps({'numpy': 'numpy' in sys.modules, 'site': 'site' in sys.modules,\n"
        "  'foreign': [t for t in tops if t not in sys.stdlib_module_names\n"
        "              and t not in ('edge_contracts', '__main__')]}))\n"
    )
    result = run_bare(code)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {"numpy": False, "site": False, "foreign": []}


def test_the_conformance_runner_passes_in_a_bare_interpreter() -> None:
    result = run_bare(
        "from edge_contracts.conformance import main\n"
        "code = main([])\n"
        "assert 'numpy' not in sys.modules\n"
        "raise SystemExit(code)\n"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout


def test_the_tensors_module_is_the_one_that_needs_numpy() -> None:
    result = run_bare("import edge_contracts.tensors\n")
    assert result.returncode != 0
    assert "numpy" in result.stderr
