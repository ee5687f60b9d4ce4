"""create_manifest: what it records, and the bundles it refuses to describe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_contracts.manifest import MANIFEST_FILENAME, ArtifactManifest
from edge_core.artifacts import (
    BundleRefused,
    ManifestExists,
    ManifestSchemaInvalid,
    MemberPathRefused,
    ReferenceRefused,
    create_manifest,
    verify_bundle,
)

from .bundles import (
    NOT_ONNX_GRAPHS,
    edit_manifest,
    matmul_model,
    passthrough_model,
    sha256_of,
    write_bundle,
)


def test_created_manifest_lists_every_file_with_its_digest_and_round_trips(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "ocr-det", create=False)
    (directory / "sub").mkdir()
    (directory / "sub" / "vocab.txt").write_text("abc")
    created = create_manifest(
        directory, example_inputs="inputs.npz", expected_outputs="expected.npz",
        checkpoint_revision="rev-1", precision="float32", layout="NC", exporter="onnx 1.x",
        calibration={"method": "none"}, validation={"bound": {"max_abs": 1e-5}},
    )
    manifest = ArtifactManifest.from_json((directory / MANIFEST_FILENAME).read_text())
    assert manifest == created.manifest
    assert manifest.component == "ocr-det"
    assert manifest.metadata.graph == "model.onnx"
    assert dict(manifest.files) == {
        name: sha256_of(directory / name)
        for name in ("expected.npz", "inputs.npz", "model.onnx", "sub/vocab.txt", "weights.bin")
    }
    assert dict(manifest.metadata.validation or {}) == {
        "bound": {"max_abs": 1e-5}, "expected_outputs": "expected.npz"}
    assert created.manifest_sha256 == sha256_of(directory / MANIFEST_FILENAME)
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert verified.manifest == created.manifest
        assert verified.manifest_sha256 == created.manifest_sha256
        assert verified.total_bytes == created.total_bytes


def test_existing_manifest_is_kept_unless_overwrite_is_asked(bundle: Path) -> None:
    before = (bundle / MANIFEST_FILENAME).read_bytes()
    with pytest.raises(ManifestExists, match="already exists") as caught:
        create_manifest(bundle)
    assert caught.value.field == "manifest"
    assert caught.value.value == str(bundle.resolve() / MANIFEST_FILENAME)
    assert (bundle / MANIFEST_FILENAME).read_bytes() == before
    created = create_manifest(bundle, overwrite=True, component="again")
    assert created.manifest.component == "again"
    assert not [p for p in bundle.iterdir() if p.name.endswith(".tmp")]


def test_graph_must_be_named_when_the_bundle_holds_several(tmp_path: Path) -> None:
    import onnx

    directory = write_bundle(tmp_path / "b", external=False, create=False)
    onnx.save_model(matmul_model(), directory / "second.onnx")
    with pytest.raises(ReferenceRefused, match=r"exactly one file named \.onnx") as caught:
        create_manifest(directory)
    assert caught.value.value == ["model.onnx", "second.onnx"]
    assert create_manifest(directory, graph="second.onnx").manifest.metadata.graph == (
        "second.onnx")


def test_the_only_graph_named_onnx_in_any_case_is_the_default_graph(
    tmp_path: Path, staging_root: Path
) -> None:
    """The default graph is found by the name the checks use: .onnx in any case."""
    directory = write_bundle(tmp_path / "b", external=False, graph_name="MODEL.ONNX",
                             create=False)
    (directory / "model.onnx.bin").write_bytes(b"not a candidate: it ends in .bin")
    created = create_manifest(directory, example_inputs="inputs.npz")
    assert created.manifest.metadata.graph == "MODEL.ONNX"
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert verified.graph.name == "MODEL.ONNX"


@pytest.mark.parametrize("other", ["Second.ONNX", "model.onnx"])
def test_two_graphs_named_onnx_in_different_case_are_two_candidates(
    tmp_path: Path, other: str
) -> None:
    """MODEL.ONNX beside Second.ONNX, or beside model.onnx: the graph must be given."""
    import onnx

    directory = write_bundle(tmp_path / "b", external=False, graph_name="MODEL.ONNX",
                             create=False)
    onnx.save_model(matmul_model(), directory / other)
    with pytest.raises(ReferenceRefused) as caught:
        create_manifest(directory, example_inputs="inputs.npz")
    assert caught.value.field == "manifest.metadata.graph"
    assert caught.value.reason == ("must be given: the bundle does not hold exactly one "
                                   "file named .onnx (in any case)")
    assert caught.value.value == sorted(["MODEL.ONNX", other])
    assert not (directory / MANIFEST_FILENAME).exists()
    created = create_manifest(directory, graph=other, example_inputs="inputs.npz")
    assert created.manifest.metadata.graph == other


@pytest.mark.parametrize(("options", "field", "kind"), [
    ({"graph": "../model.onnx"}, "manifest.metadata.graph", ManifestSchemaInvalid),
    ({"example_inputs": "a//inputs.npz"}, "manifest.metadata.example_inputs",
     ManifestSchemaInvalid),
    ({"precision": 3}, "manifest.metadata.precision", ManifestSchemaInvalid),
    ({"validation": {"expected_outputs": "inputs.npz"}, "expected_outputs": "expected.npz"},
     "manifest.metadata.validation.expected_outputs", ReferenceRefused),
    ({"graph": "absent.onnx"}, "manifest.metadata.graph", ReferenceRefused),
])
def test_every_metadata_refusal_at_creation_names_the_field_as_verification_does(
    tmp_path: Path, options: dict[str, Any], field: str, kind: type[BundleRefused]
) -> None:
    """manifest.metadata.<key>, as the graph checks and every refusal of verify name it."""
    directory = write_bundle(tmp_path / "b", create=False)
    with pytest.raises(kind) as caught:
        create_manifest(directory, **options)
    assert caught.value.field == field
    assert not (directory / MANIFEST_FILENAME).exists()


def test_symlink_leading_outside_is_refused_at_creation(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    (tmp_path / "outside.bin").write_bytes(b"x")
    (directory / "escape.bin").symlink_to(tmp_path / "outside.bin")
    with pytest.raises(MemberPathRefused, match="outside the bundle"):
        create_manifest(directory)
    assert not (directory / MANIFEST_FILENAME).exists()


def test_symlinked_directory_is_refused_at_creation(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    (directory / "real").mkdir()
    (directory / "alias").symlink_to(directory / "real", target_is_directory=True)
    with pytest.raises(MemberPathRefused, match="symlinked directories"):
        create_manifest(directory)


def test_file_name_with_a_colon_is_refused_at_creation(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    (directory / "a:b.bin").write_bytes(b"x")
    with pytest.raises(MemberPathRefused, match="colon"):
        create_manifest(directory)


def test_expected_outputs_conflicting_with_validation_are_refused(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    with pytest.raises(ReferenceRefused, match="differs"):
        create_manifest(directory, expected_outputs="expected.npz",
                        validation={"expected_outputs": "inputs.npz"})


def test_external_data_missing_from_the_directory_is_refused_at_creation(
    tmp_path: Path,
) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    (directory / "weights.bin").unlink()
    with pytest.raises(ReferenceRefused, match=r"weights\.bin"):
        create_manifest(directory)
    assert not (directory / MANIFEST_FILENAME).exists()


def test_manifest_is_written_as_canonical_json(bundle: Path) -> None:
    text = (bundle / MANIFEST_FILENAME).read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def _graph_bundle(directory: Path, graph: str, data: bytes) -> Path:
    import numpy as np

    directory.mkdir()
    (directory / graph).write_bytes(data)
    np.savez(directory / "inputs.npz", x=np.ones((1, 64), np.float32))
    return directory


@pytest.mark.parametrize("name", ["model.onnx", "model.ONNX"])
@pytest.mark.parametrize(("data", "missing"), NOT_ONNX_GRAPHS)
def test_a_graph_named_onnx_that_is_not_an_onnx_model_is_refused_at_creation(
    tmp_path: Path, name: str, data: bytes, missing: str
) -> None:
    directory = _graph_bundle(tmp_path / "b", name, data)
    with pytest.raises(ReferenceRefused) as caught:
        create_manifest(directory, graph=name, example_inputs="inputs.npz")
    assert caught.value.field == "manifest.metadata.graph"
    assert caught.value.value == name
    assert caught.value.reason.startswith(f"named .onnx but {missing}")
    assert caught.value.reason.endswith(
        ": an ONNX model needs a graph with at least one input and one output (a file in "
        "another format must not be named .onnx)")
    assert not (directory / MANIFEST_FILENAME).exists()
    # as the default graph (the only file named .onnx, in any case): the same
    with pytest.raises(ReferenceRefused, match=r"^manifest\.metadata\.graph: named "):
        create_manifest(directory, example_inputs="inputs.npz")


@pytest.mark.parametrize("member", ["sub/x.onnx", "buckets/B1.ONNX"])
@pytest.mark.parametrize(("data", "missing"), NOT_ONNX_GRAPHS)
def test_another_member_named_onnx_that_is_not_an_onnx_model_is_refused_at_creation(
    tmp_path: Path, member: str, data: bytes, missing: str
) -> None:
    """Beside a valid graph, a file named .onnx (a derived bundle's per-bucket graph, say)
    is held to the graph's rule, and named by its own field."""
    directory = write_bundle(tmp_path / "b", create=False)
    (directory / member).parent.mkdir(parents=True, exist_ok=True)
    (directory / member).write_bytes(data)
    with pytest.raises(ReferenceRefused) as caught:
        create_manifest(directory, graph="model.onnx", example_inputs="inputs.npz")
    assert caught.value.field == f'manifest.files["{member}"]'
    assert caught.value.value == member
    assert caught.value.reason.startswith(f"named .onnx but {missing}")
    assert caught.value.reason.endswith("(a file in another format must not be named .onnx)")
    assert not (directory / MANIFEST_FILENAME).exists()


def test_another_member_named_onnx_that_is_a_model_is_accepted_beside_the_graph(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    (directory / "buckets").mkdir()
    (directory / "buckets" / "B1.ONNX").write_bytes(passthrough_model().SerializeToString())
    created = create_manifest(directory, graph="model.onnx", example_inputs="inputs.npz")
    assert "buckets/B1.ONNX" in created.manifest.files
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert verified.manifest == created.manifest


def test_a_graph_without_nodes_that_passes_its_input_through_is_accepted(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = _graph_bundle(tmp_path / "b", "model.onnx",
                              passthrough_model().SerializeToString())
    create_manifest(directory, example_inputs="inputs.npz")
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert verified.manifest.metadata.graph == "model.onnx"


@pytest.mark.parametrize("name", ["weights.bin", "params.npz", "model.onnx.bin"])
@pytest.mark.parametrize(("data", "missing"), NOT_ONNX_GRAPHS)
def test_a_graph_not_named_onnx_may_be_any_file(
    tmp_path: Path, staging_root: Path, name: str, data: bytes, missing: str
) -> None:
    """A bundle for a backend that does not run ONNX names its own weights as its graph."""
    directory = _graph_bundle(tmp_path / "b", name, data)
    created = create_manifest(directory, graph=name, example_inputs="inputs.npz")
    assert created.manifest.metadata.graph == name
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert verified.graph.read_bytes() == data


def test_example_inputs_that_lack_a_graph_input_are_refused_at_creation(
    tmp_path: Path, staging_root: Path
) -> None:
    # the expected outputs given as the example inputs (y, not x): it was refused only by
    # a stage's warm-up, after its worker started ("inputs of the graph missing: ['x']")
    directory = write_bundle(tmp_path / "b", create=False)
    with pytest.raises(ReferenceRefused) as info:
        create_manifest(directory, example_inputs="expected.npz")
    assert str(info.value) == (
        "manifest.metadata.example_inputs: lacks the graph's input(s) ['x']: model.onnx "
        "takes ['x'], the archive holds ['y'] (example inputs are the arrays the graph is "
        "fed, by input name): 'expected.npz'")
    assert not (directory / MANIFEST_FILENAME).exists()
    create_manifest(directory, example_inputs="inputs.npz")  # x: accepted
    edit_manifest(directory, lambda data: data["metadata"].update(
        example_inputs="expected.npz"))  # by hand: verification refuses it the same way
    with pytest.raises(ReferenceRefused, match=r"lacks the graph's input\(s\) \['x'\]"):
        verify_bundle(directory, staging_root=staging_root)


def test_a_graph_input_an_initializer_gives_is_not_required_of_the_example_inputs(
    tmp_path: Path, staging_root: Path
) -> None:
    # IR < 4 lists initializers among the inputs: W has a value, only x must be fed
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    directory = tmp_path / "b"
    directory.mkdir()
    onnx.save_model(helper.make_model(graph), directory / "model.onnx")
    np.savez(directory / "inputs.npz", x=np.ones((1, 4), np.float32))
    np.savez(directory / "w.npz", W=np.ones((4, 4), np.float32))
    create_manifest(directory, example_inputs="inputs.npz")
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert verified.manifest.metadata.example_inputs == "inputs.npz"
    with pytest.raises(ReferenceRefused, match=r"lacks the graph's input\(s\) \['x'\]: "
                       r"model.onnx takes \['x'\], the archive holds \['W'\]"):
        create_manifest(directory, example_inputs="w.npz", overwrite=True)


def test_expected_outputs_that_name_no_output_of_the_graph_are_refused_at_creation(
    tmp_path: Path, staging_root: Path
) -> None:
    # the example inputs given as the expected outputs (x, not y): it was written, and a
    # stage's warm-up refused it as "outputs differ ... beyond the bound: max_abs_error=0.0"
    directory = write_bundle(tmp_path / "b", create=False)
    with pytest.raises(ReferenceRefused) as info:
        create_manifest(directory, example_inputs="inputs.npz", expected_outputs="inputs.npz")
    assert str(info.value) == (
        "manifest.metadata.validation.expected_outputs: names no output of the graph: ['x']: "
        "model.onnx gives ['y'], the archive holds ['x'] (expected outputs are the graph's "
        "outputs for the example inputs, by output name): 'inputs.npz'")
    assert not (directory / MANIFEST_FILENAME).exists()
    create_manifest(directory, example_inputs="inputs.npz", expected_outputs="expected.npz")
    edit_manifest(directory, lambda data: data["metadata"]["validation"].update(
        expected_outputs="inputs.npz"))  # by hand: verification refuses it the same way
    with pytest.raises(ReferenceRefused, match="names no output of the graph: \\['x'\\]"):
        verify_bundle(directory, staging_root=staging_root)
