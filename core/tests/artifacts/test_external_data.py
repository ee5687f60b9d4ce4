"""ONNX external data: read from the protobuf bytes (no onnx import in core), and refused
unless every location is a verified member."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx.external_data_helper import _get_all_tensors, uses_external_data

from edge_core.artifacts import (
    ReferenceRefused,
    create_manifest,
    external_refs,
    onnx_refs,
    references,
    verify_bundle,
)

from .bundles import (
    constant_model,
    edit_manifest,
    if_model,
    matmul_model,
    passthrough_model,
    sha256_of,
    write_bundle,
)


def _onnx_locations(path: Path) -> set[tuple[str, str]]:
    """What the onnx package itself says: (tensor, location) of every external tensor."""
    model = onnx.load(path, load_external_data=False)
    found = set()
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            entries = {e.key: e.value for e in tensor.external_data}
            found.add((tensor.name, entries["location"]))
    return found


@pytest.mark.parametrize("model", [matmul_model, if_model, constant_model],
                         ids=["matmul", "if-subgraph", "constant-attribute"])
def test_reader_finds_the_same_external_tensors_as_the_onnx_package(
    tmp_path: Path, model: object
) -> None:
    directory = write_bundle(tmp_path / "b", model=model(), create=False)  # type: ignore[operator]
    refs = external_refs(directory / "model.onnx", "graph")
    assert {(r.tensor, r.location) for r in refs} == _onnx_locations(directory / "model.onnx")
    assert refs and all(r.length is not None for r in refs)


def test_initializer_of_a_subgraph_is_found(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", model=if_model(), create=False)
    wheres = {r.tensor: r.where for r in external_refs(directory / "model.onnx", "graph")}
    model = onnx.load(directory / "model.onnx", load_external_data=False)
    names = [a.name for a in model.graph.node[0].attribute]
    then = names.index("then_branch")
    assert wheres["TW"] == f"graph.node[0].attribute[{then}].g.initializer[0]"


def test_graph_with_embedded_weights_has_no_external_references(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", external=False, create=False)
    assert external_refs(directory / "model.onnx", "graph") == ()


def _point_weights_at(directory: Path, location: str) -> None:
    model = onnx.load(directory / "model.onnx", load_external_data=False)
    for tensor in _get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, directory / "model.onnx")
    edit_manifest(directory, lambda m: m["files"].update(
        {"model.onnx": sha256_of(directory / "model.onnx")}))


def test_external_data_outside_the_verified_set_is_refused(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b")
    (directory / "weights.bin").rename(directory / "unlisted.bin")
    _point_weights_at(directory, "unlisted.bin")
    edit_manifest(directory, lambda m: m["files"].pop("weights.bin"))
    with pytest.raises(ReferenceRefused, match="not in the verified set") as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert caught.value.value == "unlisted.bin"
    assert "graph.initializer[0].external_data.location" in caught.value.field


@pytest.mark.parametrize("location", ["../weights.bin", "/tmp/weights.bin", "sub\\w.bin",
                                      "C:weights.bin"])
def test_external_data_location_escaping_the_model_directory_is_refused(
    tmp_path: Path, staging_root: Path, location: str
) -> None:
    directory = write_bundle(tmp_path / "b")
    _point_weights_at(directory, location)
    with pytest.raises(ReferenceRefused) as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert caught.value.value == location


def test_external_data_in_a_subdirectory_resolves_against_the_graph_directory(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b", graph_name="graphs/model.onnx")
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert dict(verified.references.external_data) == {
            "graphs/model.onnx": ("graphs/weights.bin",)}


def test_external_data_range_past_the_end_of_its_file_is_refused(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b")
    data = (directory / "weights.bin").read_bytes()
    (directory / "weights.bin").write_bytes(data[: len(data) // 2])
    edit_manifest(directory, lambda m: m["files"].update(
        {"weights.bin": sha256_of(directory / "weights.bin")}))
    with pytest.raises(ReferenceRefused, match="offset \\+ length"):
        verify_bundle(directory, staging_root=staging_root)


def test_truncated_graph_is_refused_as_unreadable(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    data = (directory / "model.onnx").read_bytes()
    (directory / "model.onnx").write_bytes(data[: len(data) - 7])
    with pytest.raises(ReferenceRefused, match="not a readable ONNX model"):
        external_refs(directory / "model.onnx", "graph")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_either_parse_or_are_refused_never_crash(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "fuzz.onnx"
        path.write_bytes(data)
        try:
            refs = external_refs(path, "graph")
        except ReferenceRefused:
            return
        assert isinstance(refs, tuple)


def test_verification_imports_neither_onnx_nor_onnxruntime(bundle: Path) -> None:
    code = (
        "import sys; from edge_core.artifacts import verify_bundle;"
        f"verify_bundle({str(bundle)!r}, stage=False);"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _bundle_of_two_models(directory: Path) -> Path:
    """A graph with external weights, another member named .onnx sorted before it (so the
    graph, checked first, is not the loop's first member), and a third, ``.ONNX``, after."""
    write_bundle(directory, create=False)
    (directory / "a.onnx").write_bytes(passthrough_model().SerializeToString())
    (directory / "buckets").mkdir()
    (directory / "buckets" / "B1.ONNX").write_bytes(passthrough_model().SerializeToString())
    return directory


def _check(directory: Path, how: str, staging_root: Path) -> None:
    if how == "create":
        create_manifest(directory, graph="model.onnx", example_inputs="inputs.npz",
                        expected_outputs="expected.npz")
        return
    create_manifest(directory, graph="model.onnx", example_inputs="inputs.npz",
                    expected_outputs="expected.npz")
    with verify_bundle(directory, stage=how == "staged", staging_root=staging_root):
        pass


@pytest.mark.parametrize("how", ["create", "staged", "in-place"])
def test_the_model_reader_opens_each_member_once(
    tmp_path: Path, staging_root: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The graph check and the external-data scan share one read of each .onnx member
    (every other member is opened once too, to see whether its bytes are a model)."""
    directory = _bundle_of_two_models(tmp_path / "b")
    opened: list[str] = []

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(path).name)
        return open(path, *args, **kwargs)

    monkeypatch.setattr(onnx_refs, "open", counting_open, raising=False)
    _check(directory, how, staging_root)
    listed = ["B1.ONNX", "a.onnx", "expected.npz", "inputs.npz", "model.onnx", "weights.bin"]
    expected = listed if how == "create" else listed * 2  # create, then verify
    assert sorted(opened) == sorted(expected)


@pytest.mark.parametrize("how", ["create", "staged", "in-place"])
def test_check_references_scans_each_member_once_graph_first(
    tmp_path: Path, staging_root: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    directory = _bundle_of_two_models(tmp_path / "b")
    scanned: list[str] = []

    def counting_scan(path: Path) -> onnx_refs.ModelScan:
        scanned.append(path.name)
        return onnx_refs.scan_model(path)

    monkeypatch.setattr(references, "scan_model", counting_scan)
    _check(directory, how, staging_root)
    once = ["model.onnx", "a.onnx", "B1.ONNX", "expected.npz", "inputs.npz", "weights.bin"]
    assert scanned == (once if how == "create" else once * 2)


def test_the_graph_is_refused_before_a_member_sorted_ahead_of_it(tmp_path: Path) -> None:
    """Order of the checks: the graph's own refusal first, then each member in order."""
    directory = _bundle_of_two_models(tmp_path / "b")
    (directory / "a.onnx").write_bytes(b"")
    (directory / "model.onnx").write_bytes(b"")
    with pytest.raises(ReferenceRefused) as caught:
        create_manifest(directory, graph="model.onnx", example_inputs="inputs.npz")
    assert (caught.value.field, caught.value.value) == ("manifest.metadata.graph",
                                                        "model.onnx")
    (directory / "model.onnx").write_bytes(passthrough_model().SerializeToString())
    with pytest.raises(ReferenceRefused) as caught:
        create_manifest(directory, graph="model.onnx", example_inputs="inputs.npz")
    assert (caught.value.field, caught.value.value) == ('manifest.files["a.onnx"]', "a.onnx")
