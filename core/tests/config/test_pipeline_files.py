"""Loading pipelines from TOML, YAML, JSON and pyproject.toml, with the plugin's validator."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest

from edge_core.config import (
    InvalidConfigError,
    PipelineConfig,
    load_pipeline,
    load_pyproject_pipeline,
    load_tool_settings,
    structure_config,
)
from edge_core.errors import ConfigError
from edge_core.placement import PlacementPolicy

PIPELINE_TOML = """
name = "ocr"
admission = 2
plugins = ["mypkg.localplugin"]

[capacities]
"machine:ram" = "8 GiB"

[[stages]]
id = "det"
manifest = "models/det/manifest.json"
max_io_bytes = "16 MiB"

[stages.backend]
name = "ort-cpu"

[stages.backend.options]
intra_op_threads = 2

[stages.placement]
target = "CPUExecutionProvider"

[stages.resources]
capacities = { "machine:ram" = "4 GiB" }
demands = { "machine:ram" = "512 MiB" }

[[stages]]
id = "rec"
input_transform = "mypkg.adapters:det_to_rec"

[stages.backend]
name = "ort-qnn"

[stages.backend.route]
name = "vendor"
interpreter = "/opt/vendor/bin/python3"
entry = "edge_qnn.worker:make_handler"
os_domain = "posix"
stage = ["edge_qnn"]
python_path = ["vendor-lib"]

[stages.placement]
target = "QNNExecutionProvider"
min_fraction_on_target = 0.8
allowed_providers = ["CPUExecutionProvider"]

[stages.resources]
demands = { "machine:ram" = 268435456 }
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _check_ocr(config: PipelineConfig, folder: Path) -> None:
    assert config.name == "ocr"
    assert config.admission == 2
    assert config.plugins == ("mypkg.localplugin",)
    det, rec = config.stages
    assert det.manifest == (folder / "models/det/manifest.json").resolve()
    assert det.max_io_bytes == 16 * 1024**2
    assert dict(det.backend.options) == {"intra_op_threads": 2}
    assert det.backend.route is None
    assert det.input_transform is None
    assert dict(det.resources.demands) == {"machine:ram": 512 * 1024**2}
    assert rec.input_transform is not None
    assert rec.input_transform.kind == "callable"
    assert rec.backend.route is not None
    assert rec.backend.route.interpreter == "/opt/vendor/bin/python3"
    assert rec.backend.route.entry == "edge_qnn.worker:make_handler"
    assert rec.backend.route.python_path == ((folder / "vendor-lib").resolve(),)
    assert rec.placement.to_policy() == PlacementPolicy(
        "QNNExecutionProvider", 0.8, ("CPUExecutionProvider",)
    )
    assert config.ceilings() == {"machine:ram": 4 * 1024**3}
    assert config.demands() == {
        "det": {"machine:ram": 512 * 1024**2},
        "rec": {"machine:ram": 2**28},
    }


def test_a_toml_pipeline_loads_with_paths_resolved_against_its_folder(tmp_path: Path) -> None:
    path = _write(tmp_path / "conf" / "pipeline.toml", PIPELINE_TOML)
    config = load_pipeline(path)
    _check_ocr(config, tmp_path / "conf")
    assert config.source == path.resolve()
    json.dumps(config.to_json())


def test_a_yaml_pipeline_loads_like_its_toml_twin(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    import tomllib

    data = tomllib.loads(PIPELINE_TOML)
    path = _write(tmp_path / "p.yaml", yaml.safe_dump(data))
    _check_ocr(load_pipeline(path), tmp_path)


def test_a_json_pipeline_and_a_mapping_load_like_toml(tmp_path: Path) -> None:
    import tomllib

    data = tomllib.loads(PIPELINE_TOML)
    _check_ocr(load_pipeline(_write(tmp_path / "p.json", json.dumps(data))), tmp_path)
    _check_ocr(load_pipeline(data, base_dir=tmp_path), tmp_path)


def test_yaml_without_pyyaml_is_a_config_error_that_says_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "p.yml", "name: x\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` fail, as if absent
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert info.value.path == "source"
    assert "PyYAML" in info.value.reason


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("bad.toml", "name = ", "not valid TOML"),
        ("bad.json", "{", "not valid JSON"),
        ("list.json", "[1, 2]", "must be a table at the top level"),
        ("p.ini", "x", "unknown format"),
    ],
)
def test_unreadable_documents_are_refused_as_source_errors(
    tmp_path: Path, name: str, text: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_pipeline(_write(tmp_path / name, text))
    assert info.value.path == "source"
    assert reason in info.value.reason


@pytest.mark.parametrize("name", ["latin1.toml", "latin1.json", "latin1.yaml"])
def test_a_document_that_is_not_utf8_is_a_source_error_naming_the_file(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    path.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert info.value.path == "source"
    assert info.value.reason.startswith("not valid UTF-8 (byte ")
    assert info.value.value == str(path)


def test_a_pyproject_that_is_not_utf8_is_a_source_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_bytes(PYPROJECT.encode("utf-8") + b"# \xff\n")
    with pytest.raises(ConfigError) as info:
        load_pyproject_pipeline(path, "ocr")
    assert (info.value.path, info.value.value) == ("source", str(path))
    assert "not valid UTF-8" in info.value.reason


def test_a_missing_file_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_pipeline(tmp_path / "absent.toml")


@pytest.mark.timeout(60)  # reading the FIFO, as before, would wait for a writer forever
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipeline_path_that_is_not_a_regular_file_is_refused_without_reading_it(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "pipeline.toml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")  # read to its end, it never ends
    for load in (load_pipeline, load_tool_settings):
        with pytest.raises(ConfigError) as info:
            load(path)
        assert (info.value.path, info.value.value) == ("source", str(path))
        assert info.value.reason == "not a regular file (a FIFO, a socket or a device)"


@pytest.mark.parametrize(("name", "kind", "head"), [
    ("deep.toml", "TOML", 'name = "x"\nstages = '),
    ("deep.json", "JSON", '{"name": "x", "stages": '),
    ("deep.yaml", "YAML", "name: x\nstages: "),
])
def test_a_document_nested_too_deeply_to_read_is_a_source_error(
    tmp_path: Path, name: str, kind: str, head: str
) -> None:
    """Each reader recurses once per level: past Python's limit that is a problem of the
    file (exit 2 naming it), not an internal error."""
    depth = 100_000
    tail = "}" if kind == "JSON" else ""
    path = _write(tmp_path / name, head + "[" * depth + "]" * depth + tail + "\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert (info.value.path, info.value.value) == ("source", str(path))
    assert info.value.reason == f"not read as {kind}: arrays or tables nested too deeply"


def test_a_link_is_read_in_the_format_its_own_name_says(tmp_path: Path) -> None:
    """``pipeline.toml`` linking to a file without a suffix (a store's blob) is TOML."""
    blob = _write(tmp_path / "store" / "3f2a9c", PIPELINE_TOML)
    (tmp_path / "pipeline.toml").symlink_to(blob)
    config = load_pipeline(tmp_path / "pipeline.toml")
    assert config.name == "ocr" and [s.id for s in config.stages] == ["det", "rec"]
    # relative paths still resolve against the folder of the file they are written in
    assert config.stages[0].manifest == tmp_path / "store" / "models/det/manifest.json"
    (tmp_path / "blob.toml").symlink_to(tmp_path / "pipeline.toml")
    (tmp_path / "named.ini").symlink_to(tmp_path / "pipeline.toml")
    assert load_pipeline(tmp_path / "blob.toml").name == "ocr"
    with pytest.raises(ConfigError, match="unknown format"):
        load_pipeline(tmp_path / "named.ini")  # the name given decides, not the target's


def test_the_backend_validator_gets_name_options_and_path_and_its_result_is_kept(
    tmp_path: Path,
) -> None:
    calls: list[tuple[str, dict[str, object], str]] = []

    def validate(backend: str, options: Mapping[str, object], path: str) -> object:
        calls.append((backend, dict(options), path))
        return ("validated", backend)

    config = load_pipeline(_write(tmp_path / "p.toml", PIPELINE_TOML), validate_backend=validate)
    assert calls == [
        ("ort-cpu", {"intra_op_threads": 2}, "stages[0].backend.options"),
        ("ort-qnn", {}, "stages[1].backend.options"),
    ]
    assert [s.backend.validated for s in config.stages] == [
        ("validated", "ort-cpu"),
        ("validated", "ort-qnn"),
    ]


def test_every_backend_validator_error_is_reported_with_its_path(tmp_path: Path) -> None:
    def validate(backend: str, options: Mapping[str, object], path: str) -> object:
        raise ConfigError(f"{path}.threads", "must be at least 1", 0)

    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(_write(tmp_path / "p.toml", PIPELINE_TOML), validate_backend=validate)
    assert str(info.value) == "stages[0].backend.options.threads: must be at least 1: 0"
    assert [p.path for p in info.value.problems] == [
        "stages[0].backend.options.threads",
        "stages[1].backend.options.threads",
    ]


PYPROJECT = """
[project]
name = "myapp"

[tool.edge]
plugins = ["myapp.edgeplugin"]

[tool.edge.backends.ort-cpu]
intra_op_threads = 1
inter_op_threads = 1

[tool.edge.pipelines.ocr]
plugins = ["myapp.other"]

[[tool.edge.pipelines.ocr.stages]]
id = "det"
manifest = "bundle/manifest.json"

[tool.edge.pipelines.ocr.stages.backend]
name = "ort-cpu"
options = { intra_op_threads = 4 }
"""


def test_a_pyproject_pipeline_takes_its_name_plugins_and_backend_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path / "pyproject.toml", PYPROJECT)
    config = load_pyproject_pipeline(path, "ocr")
    assert config.name == "ocr"
    assert config.plugins == ("myapp.edgeplugin", "myapp.other")
    (det,) = config.stages
    assert dict(det.backend.options) == {"intra_op_threads": 4, "inter_op_threads": 1}
    assert det.manifest == (tmp_path / "bundle/manifest.json").resolve()


def test_tool_settings_also_apply_to_a_separate_pipeline_file(tmp_path: Path) -> None:
    settings = load_tool_settings(_write(tmp_path / "pyproject.toml", PYPROJECT))
    config = load_pipeline(_write(tmp_path / "p.toml", PIPELINE_TOML), settings=settings)
    assert config.plugins == ("myapp.edgeplugin", "mypkg.localplugin")
    assert dict(config.stages[0].backend.options) == {
        "intra_op_threads": 2,
        "inter_op_threads": 1,
    }


def test_pyproject_errors_carry_the_tool_edge_path(tmp_path: Path) -> None:
    bad = PYPROJECT.replace('id = "det"', 'id = "det"\nmax_io_bytes = "lots"')
    path = _write(tmp_path / "pyproject.toml", bad)
    with pytest.raises(ConfigError) as info:
        load_pyproject_pipeline(path, "ocr")
    assert info.value.path == "tool.edge.pipelines.ocr.stages[0].max_io_bytes"
    assert info.value.value == "lots"


def test_a_pipeline_missing_from_pyproject_names_those_defined(tmp_path: Path) -> None:
    path = _write(tmp_path / "pyproject.toml", PYPROJECT)
    with pytest.raises(ConfigError) as info:
        load_pyproject_pipeline(path, "asr")
    assert info.value.path == "tool.edge.pipelines.asr"
    assert "defined: ocr" in info.value.reason


def test_a_pyproject_opened_without_a_name_names_those_defined(tmp_path: Path) -> None:
    from edge_core.runtime.pipeline_files import load_config

    path = _write(tmp_path / "pyproject.toml", PYPROJECT)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == ("name: required with a pyproject.toml: which of its "
                               "[tool.edge.pipelines] to use (defined: ocr)")
    empty = _write(tmp_path / "empty" / "pyproject.toml", "[project]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=r"to use \(it defines none\)$"):
        load_config(empty)


def test_a_pyproject_pipeline_name_must_match_its_table_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "pyproject.toml",
        PYPROJECT.replace('plugins = ["myapp.other"]', 'plugins = ["myapp.other"]\nname = "other"'),
    )
    with pytest.raises(ConfigError) as info:
        load_pyproject_pipeline(path, "ocr")
    assert info.value.path == "tool.edge.pipelines.ocr.name"


def test_unknown_keys_in_tool_edge_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "pyproject.toml", "[tool.edge]\nplugin = ['x']\n")
    with pytest.raises(ConfigError) as info:
        load_tool_settings(path)
    assert info.value.path == "tool.edge.plugin"
    assert "unknown key" in info.value.reason


def test_a_pyproject_given_as_a_pipeline_file_points_to_the_right_loader(tmp_path: Path) -> None:
    path = _write(tmp_path / "pyproject.toml", PYPROJECT)
    with pytest.raises(ConfigError, match="load_pyproject_pipeline"):
        load_pipeline(path)


@attrs.frozen
class _OrtOptions:
    intra_op_threads: int = 1
    graph_optimization: str = "all"


def test_a_plugin_can_structure_its_options_with_the_same_strict_converter(
    tmp_path: Path,
) -> None:
    def validate(backend: str, options: Mapping[str, object], path: str) -> object:
        return structure_config(options, _OrtOptions, path=path)

    path = _write(tmp_path / "p.toml", PIPELINE_TOML)
    config = load_pipeline(path, validate_backend=validate)
    assert config.stages[0].backend.validated == _OrtOptions(intra_op_threads=2)

    bad = PIPELINE_TOML.replace("intra_op_threads = 2", 'intra_op_threads = "2"\nthreads = 1')
    with pytest.raises(InvalidConfigError) as info:
        load_pipeline(_write(tmp_path / "bad.toml", bad), validate_backend=validate)
    assert {p.path for p in info.value.problems} == {
        "stages[0].backend.options.intra_op_threads",
        "stages[0].backend.options.threads",
    }
