import hashlib

import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.manifest import (
    MANIFEST_FILENAME,
    ArtifactManifest,
    ArtifactMetadata,
    validate_relative_path,
)

SHA = hashlib.sha256(b"model").hexdigest()


def manifest(files: dict[str, str] | None = None, **metadata: object) -> ArtifactManifest:
    meta: dict[str, object] = {"graph": "model.onnx", "example_inputs": "inputs/x.npz"}
    meta.update(metadata)
    return ArtifactManifest(
        schema_version=1,
        component="ocr-det",
        files=files if files is not None else {"model.onnx": SHA, "inputs/x.npz": SHA},
        metadata=ArtifactMetadata(**meta),  # type: ignore[arg-type]
    )


def test_manifest_file_name() -> None:
    assert MANIFEST_FILENAME == "edge-manifest.json"


def test_manifest_round_trips_through_dict_and_json() -> None:
    made = manifest(precision="float16", validation={"max_abs_error": 1e-3})
    assert ArtifactManifest.from_dict(made.to_dict()) == made
    assert ArtifactManifest.from_json(made.to_json()) == made
    assert made.to_json().endswith("\n")


def test_files_are_frozen_and_the_manifest_hashable() -> None:
    files = {"model.onnx": SHA, "inputs/x.npz": SHA}
    made = manifest(files)
    files["extra.bin"] = SHA
    assert "extra.bin" not in made.files
    with pytest.raises(TypeError):
        made.files["x"] = SHA  # type: ignore[index]
    assert hash(made) == hash(manifest())


@pytest.mark.parametrize(
    "path",
    ["../m.onnx", "a/../m.onnx", "/m.onnx", "a\\m.onnx", "C:m.onnx", "a//m", "./m", "", "a\x00b"],
)
def test_paths_must_stay_inside_the_bundle(path: str) -> None:
    with pytest.raises(InvalidValue) as info:
        validate_relative_path(path, "manifest.files")
    assert info.value.value == path


def test_bad_file_entries_name_the_path() -> None:
    with pytest.raises(InvalidValue) as info:
        manifest({"model.onnx": SHA, "inputs/x.npz": SHA, "../evil": SHA})
    assert info.value.field == 'manifest.files["../evil"]'


@pytest.mark.parametrize("digest", [SHA.upper(), SHA[:-1], SHA + "0", "g" * 64, 5])
def test_digests_are_64_lowercase_hex(digest: object) -> None:
    with pytest.raises(InvalidValue) as info:
        manifest({"model.onnx": digest, "inputs/x.npz": SHA})  # type: ignore[dict-item]
    assert info.value.field == 'manifest.files["model.onnx"]'


def test_graph_and_example_inputs_must_be_listed_files() -> None:
    with pytest.raises(InvalidValue) as info:
        manifest({"model.onnx": SHA})
    assert info.value.field == "manifest.metadata.example_inputs"
    with pytest.raises(InvalidValue) as info:
        manifest(graph="other.onnx")
    assert info.value.field == "manifest.metadata.graph"


def test_schema_version_and_component_are_checked() -> None:
    data = manifest().to_dict()
    with pytest.raises(InvalidValue) as info:
        ArtifactManifest.from_dict({**data, "schema_version": 2})
    assert info.value.field == "manifest.schema_version"
    with pytest.raises(InvalidValue) as info:
        ArtifactManifest.from_dict({**data, "component": ""})
    assert info.value.field == "manifest.component"


def test_metadata_errors_are_named_under_the_manifest() -> None:
    data = manifest().to_dict()
    data["metadata"]["license"] = "MIT"
    with pytest.raises(InvalidValue) as info:
        ArtifactManifest.from_dict(data)
    assert info.value.field == "manifest.metadata.license"


def test_invalid_json_text_is_an_invalid_value() -> None:
    with pytest.raises(InvalidValue) as info:
        ArtifactManifest.from_json('{"schema_version": NaN}')
    assert info.value.field == "manifest"
