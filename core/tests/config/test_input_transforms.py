"""Input transforms resolve at run time: `module:function` imports, adapters use entry points."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_core.config import ADAPTER_GROUP, InputTransform, resolve_input_transform
from edge_core.errors import ConfigError


@pytest.fixture
def adapter_dist(tmp_path: Path) -> Iterator[Path]:
    """A real installed-looking distribution on sys.path registering two adapters."""
    package = tmp_path / "edgetest_adapters"
    package.mkdir()
    (package / "__init__.py").write_text(
        "def det_to_rec(outputs):\n    return {'x': outputs['y'] * 2}\n\nNOT_CALLABLE = 3\n"
    )
    dist = tmp_path / "edgetest_adapters-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: edgetest-adapters\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{ADAPTER_GROUP}]\n"
        "det-to-rec = edgetest_adapters:det_to_rec\n"
        "broken = edgetest_adapters:missing\n"
        "constant = edgetest_adapters:NOT_CALLABLE\n"
    )
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("edgetest_adapters", None)
        importlib.invalidate_caches()


def test_a_module_function_reference_imports_the_function() -> None:
    fn = resolve_input_transform(InputTransform("json:dumps"))
    assert fn({"a": 1}) == '{"a": 1}'


def test_a_dotted_attribute_after_the_colon_is_followed() -> None:
    fn = resolve_input_transform(InputTransform("os:path.join"))
    assert fn("a", "b") == "a/b" or fn("a", "b") == "a\\b"


def test_an_adapter_name_is_found_through_the_entry_point_group(adapter_dist: Path) -> None:
    fn = resolve_input_transform(InputTransform("det-to-rec"))
    assert fn({"y": 21}) == {"x": 42}


@pytest.mark.usefixtures("adapter_dist")
@pytest.mark.parametrize(
    ("reference", "reason"),
    [
        ("no-such-adapter", "no adapter of that name"),
        ("broken", "cannot be loaded"),
        ("constant", "does not name a callable"),
        ("edgetest_missing_module:fn", "cannot import module"),
        ("json:no_such_function", "module has no attribute"),
    ],
)
def test_unresolvable_transforms_are_config_errors_at_the_stage_path(
    reference: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_input_transform(InputTransform(reference), "stages[1].input_transform")
    assert info.value.path == "stages[1].input_transform"
    assert reason in info.value.reason
    assert info.value.value == reference
