"""Every invalid value is reported with its full path, its reason and the value itself."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest

from edge_core.config import (
    InputTransform,
    InvalidConfigError,
    PlacementConfig,
    ResourceBudget,
    RouteConfig,
    load_pipeline,
)
from edge_core.errors import ConfigError

BASE: dict[str, Any] = {
    "name": "ocr",
    "stages": [
        {"id": "det", "backend": {"name": "ort-cpu"}},
        {"id": "rec", "backend": {"name": "ort-cpu"}, "input_transform": "pkg.mod:fn"},
    ],
}


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    target: Any = data
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(target, dict) else target[key]
    target[path[-1]] = value
    return data


def _error(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_pipeline(data)
    return info.value


def test_the_issue_example_reads_exactly_as_specified() -> None:
    data = _with(("stages", 1, "backend", "route"), {"name": "vendor", "interpreter": "python"})
    expected = "stages[1].backend.route.interpreter: not an absolute path: 'python'"
    assert str(_error(data)) == expected


@pytest.mark.parametrize(
    ("path", "value", "where", "reason"),
    [
        (("stages", 0, "id"), 3, "stages[0].id", "expected a string"),
        (("stages", 0, "id"), "", "stages[0].id", "must not be empty"),
        (("stages", 0, "id"), "a b", "stages[0].id", "expected letters"),
        (("stages", 0, "max_io_bytes"), True, "stages[0].max_io_bytes", "expected an integer"),
        (("stages", 0, "max_io_bytes"), 0, "stages[0].max_io_bytes", "at least 1 byte"),
        (("stages", 0, "max_io_bytes"), "1 XB", "stages[0].max_io_bytes", "unknown unit"),
        # past 2**62 the worker channel's 64-bit limits would refuse it once started
        (("stages", 0, "max_io_bytes"), 2**62 + 1, "stages[0].max_io_bytes",
         "must be at most 4611686018427387904 bytes"),
        (("stages", 0, "max_io_bytes"), "99999999999999 TiB", "stages[0].max_io_bytes",
         "must be at most 4611686018427387904 bytes"),
        (("stages", 0, "manifest"), 5, "stages[0].manifest", "expected a string"),
        (("stages", 0, "backend"), "ort", "stages[0].backend", "expected a table"),
        (("stages", 0, "backend", "name"), "", "stages[0].backend.name", "must not be empty"),
        (("stages", 0, "backend", "options"), [1], "stages[0].backend.options", "expected a table"),
        (
            ("stages", 0, "placement", "min_fraction_on_target"),
            0,
            "stages[0].placement.min_fraction_on_target",
            "must be in (0, 1]",
        ),
        (
            ("stages", 0, "placement", "min_fraction_on_target"),
            1.5,
            "stages[0].placement.min_fraction_on_target",
            "must be in (0, 1]",
        ),
        (
            ("stages", 0, "placement", "allowed_providers"),
            "CPUExecutionProvider",
            "stages[0].placement.allowed_providers",
            "expected an array",
        ),
        (
            ("stages", 0, "placement", "allowed_providers"),
            ["CPU", 3],
            "stages[0].placement.allowed_providers[1]",
            "expected a string",
        ),
        (
            ("stages", 0, "resources", "demands"),
            {"ram": "1 GiB"},
            'stages[0].resources.demands["ram"]',
            "not a pool name",
        ),
        (
            ("stages", 0, "resources", "capacities"),
            {"machine:ram": "0.5 B"},
            'stages[0].resources.capacities["machine:ram"]',
            "not a whole number of bytes",
        ),
        (
            ("stages", 0, "resources", "demands"),
            {"machine:ram": 0},
            'stages[0].resources.demands["machine:ram"]',
            "at least 1 byte",
        ),
        (("stages", 1, "input_transform"), "pkg.mod:", "stages[1].input_transform", "expected"),
        (("stages", 1, "input_transform"), 7, "stages[1].input_transform", "expected a string"),
        (("admission",), 0, "admission", "must be at least 1"),
        (("admission",), "2", "admission", "expected an integer"),
        (("plugins",), ["ok.mod", "not a module"], "plugins[1]", "dotted module path"),
        (("name",), None, "name", "expected a string"),
        (("stages",), "det", "stages", "expected an array"),
        (
            ("stages", 1, "backend", "route"),
            {"name": "w", "interpreter": "/usr/bin/python3", "os_domain": "windows"},
            "stages[1].backend.route.interpreter",
            "not an absolute path for os_domain windows",
        ),
        (
            ("stages", 1, "backend", "route"),
            {"name": "w", "interpreter": "C:\\py\\python.exe", "os_domain": "posix"},
            "stages[1].backend.route.interpreter",
            "not an absolute path for os_domain posix",
        ),
        (
            ("stages", 1, "backend", "route"),
            {"name": "w", "interpreter": "/usr/bin/python3", "os_domain": "macos"},
            "stages[1].backend.route.os_domain",
            "expected one of posix, wsl, windows",
        ),
        (
            ("stages", 1, "backend", "route"),
            {"name": "w", "interpreter": "/usr/bin/python3", "entry": "mod"},
            "stages[1].backend.route.entry",
            "package.module:factory",
        ),
        (
            ("stages", 1, "backend", "route"),
            {"name": "w", "interpreter": "/usr/bin/python3", "stage": ["a.b"]},
            "stages[1].backend.route.stage[0]",
            "top-level module",
        ),
    ],
)
def test_invalid_values_name_their_full_path_reason_and_value(
    path: tuple[Any, ...], value: Any, where: str, reason: str
) -> None:
    error = _error(_with(path, value))
    assert error.path == where
    assert reason in error.reason
    assert str(error).startswith(f"{where}: ")


def test_the_largest_max_io_bytes_is_taken() -> None:
    config = load_pipeline(_with(("stages", 0, "max_io_bytes"), 2**62))
    assert config.stages[0].max_io_bytes == 2**62


def test_unknown_keys_are_errors_at_every_level() -> None:
    data = _with(("stages", 0, "backend", "rout"), {})
    data["stages"][1]["placement"] = {"targt": "x"}
    data["extra"] = 1
    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(data)
    paths = {p.path: p for p in info.value.problems}
    assert set(paths) == {"stages[0].backend.rout", "stages[1].placement.targt", "extra"}
    assert "unknown key" in paths["extra"].reason
    assert "allowed: name, options, route" in paths["stages[0].backend.rout"].reason


def test_loader_owned_fields_cannot_be_set_from_a_file() -> None:
    data = _with(("source",), "/etc/passwd")
    data["stages"][0]["backend"]["validated"] = {"trusted": True}
    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(data)
    assert {p.path for p in info.value.problems} == {"source", "stages[0].backend.validated"}


def test_missing_required_keys_are_reported_by_path() -> None:
    data = copy.deepcopy(BASE)
    del data["stages"][0]["backend"]
    del data["name"]
    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(data)
    assert {(p.path, p.reason) for p in info.value.problems} == {
        ("name", "required key is missing"),
        ("stages[0].backend", "required key is missing"),
    }


def test_a_problem_without_a_value_reads_path_and_reason_only() -> None:
    data = copy.deepcopy(BASE)
    del data["stages"][0]["backend"]
    assert str(_error(data)) == "stages[0].backend: required key is missing"
    del data["stages"][1]["input_transform"]
    data["stages"][0]["backend"] = {"name": "ort-cpu"}
    assert str(_error(data)) == "stages[1].input_transform: required on every stage after the first"
    assert str(ConfigError("x", "reason")) == "x: reason"


def test_a_null_value_is_still_shown_as_the_value() -> None:
    assert str(_error(_with(("stages", 0, "id"), None))) == "stages[0].id: expected a string: None"
    assert str(ConfigError("x", "reason", None)) == "x: reason: None"


def test_all_problems_are_collected_and_the_first_is_the_message() -> None:
    data = _with(("stages", 0, "id"), 3)
    data["stages"][1]["max_io_bytes"] = -1
    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(data)
    assert str(info.value).startswith("stages[0].id: expected a string: 3")
    assert [p.path for p in info.value.problems] == ["stages[0].id", "stages[1].max_io_bytes"]


def test_the_first_stage_must_not_have_an_input_transform() -> None:
    error = _error(_with(("stages", 0, "input_transform"), "pkg.mod:fn"))
    assert error.path == "stages[0].input_transform"
    assert "first stage" in error.reason


def test_every_later_stage_needs_an_input_transform() -> None:
    data = copy.deepcopy(BASE)
    del data["stages"][1]["input_transform"]
    error = _error(data)
    assert error.path == "stages[1].input_transform"
    assert "required" in error.reason


def test_stage_ids_are_unique() -> None:
    error = _error(_with(("stages", 1, "id"), "det"))
    assert error.path == "stages[1].id"
    assert "duplicate" in error.reason
    assert error.value == "det"


@pytest.mark.parametrize("target", ["latency_p95_ms <= 800", "ttft_p95_ms@c4<5.5",
                                    "  throughput_rps >= 0.05 ", "open_s == 3"])
def test_well_formed_targets_load(target: str) -> None:
    assert load_pipeline(_with(("targets",), ["open_s <= 300", target])).targets[1] == target


@pytest.mark.parametrize(("target", "reason"), [
    ("latency >>> 5", "not of the form 'METRIC[@cN] OP NUMBER'"),
    ("latency_p95_ms 5", "not of the form"),
    ("latency <= 5", "unknown metric 'latency'"),
    ("latency_p95_ms <= fast", "the bound is not a number"),
    ("latency_p95_ms <= inf", "the bound must be finite"),
    ("latency_p95_ms@c0 <= 5", "a concurrency level is at least 1"),
])
def test_a_malformed_target_is_refused_at_load_naming_its_index_and_value(
    target: str, reason: str
) -> None:
    error = _error(_with(("targets",), ["open_s <= 300", target]))
    assert (error.path, error.value) == ("targets[1]", target)
    assert reason in error.reason
    with pytest.raises(ConfigError, match=r"^targets\[0\]: "):
        attrs.evolve(load_pipeline(BASE), targets=(target,))


def test_a_pipeline_needs_a_stage() -> None:
    assert _error(_with(("stages",), [])).path == "stages"


def test_values_built_in_code_obey_the_same_rules() -> None:
    with pytest.raises(ConfigError, match="min_fraction_on_target: must be in"):
        PlacementConfig(min_fraction_on_target=0.0)
    with pytest.raises(ConfigError, match=r"demands\['ram'\]: not a pool name"):
        ResourceBudget(demands={"ram": 1})
    with pytest.raises(ConfigError, match="interpreter: not an absolute path"):
        RouteConfig(name="r", interpreter="python")
    with pytest.raises(ConfigError, match="reference: expected"):
        InputTransform("not valid!")
    assert InputTransform("ocr-det-to-rec").kind == "adapter"


def test_a_route_builds_the_host_route_for_a_real_interpreter() -> None:
    route = RouteConfig(name="self", interpreter=sys.executable)
    host = route.to_host_route("edge_echo.worker:make_handler")
    assert host.interpreter == sys.executable
    assert host.entry == "edge_echo.worker:make_handler"


def test_a_route_whose_interpreter_is_missing_is_refused_with_the_config_path(
    tmp_path: Path,
) -> None:
    route = RouteConfig(name="gone", interpreter=str(tmp_path / "python"))
    with pytest.raises(ConfigError) as info:
        route.to_host_route("pkg.mod:fn", "stages[1].backend.route")
    assert info.value.path == "stages[1].backend.route.interpreter"
    assert info.value.reason == "does not exist"


@attrs.frozen
class _LiteralOptions:
    mode: Literal["a", "b"] = "a"


def test_a_value_outside_a_literal_is_reported_with_the_value() -> None:
    from edge_core.config import InvalidConfigError, structure_config

    with pytest.raises(InvalidConfigError) as info:
        structure_config({"mode": "shared"}, _LiteralOptions, path="stages[0].backend.options")
    assert str(info.value).startswith("stages[0].backend.options.mode: invalid value")
    assert str(info.value).endswith(": 'shared'")


def test_a_long_value_is_shown_cut_in_the_message_and_kept_whole_in_the_error() -> None:
    long_text = "x" * 10_000  # text where a number belongs, as a generated file might hold
    with pytest.raises(ConfigError) as caught:
        load_pipeline(_with(("admission",), long_text))
    problem = caught.value.problems[0] if isinstance(caught.value, InvalidConfigError) \
        else caught.value
    assert problem.path == "admission" and problem.value == long_text
    text = str(problem)
    assert len(text) < 500 and text.endswith("... (10002 characters)")
    nested: Any = 1
    for _ in range(200):
        nested = [nested]
    with pytest.raises(ConfigError) as caught:
        load_pipeline(_with(("admission",), nested))
    text = str(caught.value)
    assert len(text) < 500 and text.endswith(f"... ({len(repr(nested))} characters)")


def test_a_problem_in_a_stage_names_its_position_and_its_id_for_the_commands() -> None:
    """The path is the file's (``stages[1]``: the second ``[[stages]]`` table); ``stage`` is
    the id that stage's runtime errors name it by, shown after the path (``located``)."""
    data = _with(("stages", 1, "max_io_bytes"), 0)
    data["stages"][0]["bogus"] = 1
    data["stages"].append({"id": "bad id", "backend": {"name": "ort-cpu"},
                           "input_transform": "pkg.mod:fn"})
    data["stages"].append({"backend": "nope"})  # no id: nothing to add
    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(data)
    found = {p.path: p for p in info.value.problems}
    assert found["stages[0].bogus"].stage == "det"
    assert found["stages[0].bogus"].located.startswith(
        "stages[0].bogus (stage 'det'): unknown key")
    assert found["stages[1].max_io_bytes"].located == (
        "stages[1].max_io_bytes (stage 'rec'): must be at least 1 byte: 0")
    assert str(found["stages[1].max_io_bytes"]).startswith("stages[1].max_io_bytes: ")
    assert found["stages[2].id"].stage is None  # the id's own problem: not named by it
    assert found["stages[3].backend"].stage is None
    assert found["stages[3].backend"].located == str(found["stages[3].backend"])
    assert info.value.stage == "det" and info.value.located.startswith("stages[0].bogus (stage")


def test_a_pyproject_pipelines_problems_name_the_stage_under_its_table(tmp_path: Path) -> None:
    from edge_core.config import load_pyproject_pipeline

    (tmp_path / "pyproject.toml").write_text(
        '[tool.edge.pipelines.ocr]\n[[tool.edge.pipelines.ocr.stages]]\nid = "det"\n'
        'backend = { name = "ort-cpu" }\nmax_io_bytes = 0\n')
    with pytest.raises(ConfigError) as info:
        load_pyproject_pipeline(tmp_path / "pyproject.toml", "ocr")
    assert info.value.located.startswith(
        "tool.edge.pipelines.ocr.stages[0].max_io_bytes (stage 'det'): must be at least 1 byte")


def test_the_file_checks_of_a_pyproject_pipeline_name_its_table_and_stage(
        tmp_path: Path) -> None:
    # the manifest, reference and bundle checks named stages[0] without the table before
    from edge_core.plugins import load_plugins
    from edge_core.preflight import check_pipeline

    (tmp_path / "pyproject.toml").write_text(
        '[tool.edge.pipelines.ocr]\n[[tool.edge.pipelines.ocr.stages]]\nid = "det"\n'
        'backend = { name = "echo" }\nmanifest = "no/such/bundle"\n'
        'reference_backend = "ecoh"\n')
    with pytest.raises(InvalidConfigError) as info:
        check_pipeline(tmp_path / "pyproject.toml", "ocr",
                       plugins=load_plugins(env={"EDGE_PLUGINS": "echo"}))
    assert sorted((p.path, p.stage) for p in info.value.problems) == [
        ("tool.edge.pipelines.ocr.stages[0].manifest", "det"),
        ("tool.edge.pipelines.ocr.stages[0].reference_backend", "det")]
