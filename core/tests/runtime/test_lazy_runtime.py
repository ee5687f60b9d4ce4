"""``edge_core.runtime`` loads its modules on first use: one module costs only its own imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import edge_core.runtime


def loaded_after(statement: str) -> dict[str, object]:
    code = (f"import sys\n{statement}\n"
            "import json\n"
            "print(json.dumps({'edge': sorted(m for m in sys.modules if m.startswith('edge')),"
            " 'numpy': 'numpy' in sys.modules, 'pluggy': 'pluggy' in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_importing_the_runtime_errors_loads_neither_numpy_nor_pluggy() -> None:
    found = loaded_after("import edge_core.runtime.errors")
    # the contracts' stdlib-only error types (a request's fault) come along
    assert found == {"edge": ["edge_contracts", "edge_contracts.error_copies",
                              "edge_contracts.errors", "edge_contracts.request_faults",
                              "edge_contracts.validation",
                              "edge_core", "edge_core.errors", "edge_core.runtime",
                              "edge_core.runtime.errors"], "numpy": False, "pluggy": False}


def test_every_public_name_resolves_and_is_the_defining_module_s_object() -> None:
    for name in edge_core.runtime.__all__:
        value = getattr(edge_core.runtime, name)
        owner = sys.modules[getattr(value, "__module__", "")]
        assert getattr(owner, name) is value, name
    assert set(edge_core.runtime.__all__) <= set(dir(edge_core.runtime))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        edge_core.runtime.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
