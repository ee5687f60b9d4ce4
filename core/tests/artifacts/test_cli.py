"""``edge manifest create|verify``: exit codes, --json documents, progress on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.cli import main
from edge_core.progress import PROGRESS_ENV

from .bundles import edit_manifest, sha256_of, write_bundle


def _edge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``edge`` entry point in a child process."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from edge_core.cli import main; sys.exit(main())",
         *args],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **(env or {})},
    )


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = capsys.readouterr().out
    data: dict[str, Any] = json.loads(out)
    return data


def test_create_then_verify_round_trip_with_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_bundle(tmp_path / "det", create=False)
    code = main(["manifest", "create", str(directory), "--example-inputs", "inputs.npz",
                 "--expected-outputs", str(directory / "expected.npz"), "--precision",
                 "float32", "--validation", '{"bound": {"max_abs": 0.001}}', "--json"])
    created = _json(capsys)
    assert code == 0 and created["ok"] is True
    assert created["component"] == "det" and created["graph"] == "model.onnx"
    assert created["expected_outputs"] == "expected.npz"
    assert created["external_data"] == {"model.onnx": ["weights.bin"]}
    assert created["manifest_sha256"] == sha256_of(directory / MANIFEST_FILENAME)
    assert main(["manifest", "verify", str(directory), "--json"]) == 0
    verified = _json(capsys)
    assert verified["ok"] is True
    assert verified["manifest_sha256"] == created["manifest_sha256"]
    assert verified["files"] == 4 and verified["unlisted"] == []


def test_verify_names_every_unlisted_entry_even_one_no_manifest_could_list(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (bundle / "escape").symlink_to(outside)  # leads outside the bundle
    (bundle / "linked-dir").symlink_to(tmp_path)  # a symlinked directory
    (bundle / "odd\nname.txt").write_text("x")  # not a valid member name
    (bundle / "extra.txt").write_text("x")
    named = ["escape", "extra.txt", "linked-dir", "odd\nname.txt"]
    assert main(["manifest", "verify", str(bundle), "--json"]) == 0
    assert sorted(_json(capsys)["unlisted"]) == named
    assert main(["manifest", "verify", str(bundle)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "not listed" in line]
    assert [line.split("(never loaded): ")[1] for line in sorted(notes)] == [
        "'odd\\nname.txt'", "escape", "extra.txt", "linked-dir"]  # one line each


def test_verify_of_a_tampered_bundle_exits_1_with_the_refusal(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(bundle / "weights.bin", "ab") as handle:
        handle.write(b"!")
    assert main(["manifest", "verify", str(bundle), "--json"]) == 1
    failure = _json(capsys)
    assert failure["ok"] is False
    assert failure["refusal"]["kind"] == "DigestMismatch"
    assert failure["refusal"]["field"] == 'manifest.files["weights.bin"]'
    assert failure["error"].startswith('manifest.files["weights.bin"]: sha256 differs')


def test_verify_without_json_prints_the_refusal_on_stderr(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (bundle / "inputs.npz").unlink()
    assert main(["manifest", "verify", str(bundle)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'edge: manifest.files["inputs.npz"]: listed in the manifest' in captured.err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifest", "verify", str(tmp_path / "absent"), "--json"]) == 2
    assert _json(capsys)["ok"] is False
    directory = write_bundle(tmp_path / "b", create=False)
    assert main(["manifest", "create", str(directory), "--calibration", "[1]"]) == 2
    assert "--calibration: must be a JSON object" in capsys.readouterr().err
    assert main(["manifest"]) == 2  # argparse's refusal: exit 2, usage on stderr
    assert "usage: edge manifest" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "given", "named"), [
    ("--example-inputs", "input.npz", "did you mean 'inputs.npz'? its files: expected.npz, "
     "inputs.npz, model.onnx, weights.bin): 'input.npz'"),
    ("--expected-outputs", "expect.npz", "did you mean 'expected.npz'? its files: "),
    ("--graph", "modle.onnx", "did you mean 'model.onnx'? its files: "),
    ("--example-inputs", "zzz.bin", "(its files: expected.npz, inputs.npz, model.onnx, "
     "weights.bin): 'zzz.bin'"),
])
def test_create_names_a_file_argument_that_is_not_in_the_bundle_with_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, given: str, named: str,
) -> None:
    # it read "manifest.metadata.example_inputs: must be a key of files: 'input.npz'":
    # neither the option, the folder, nor the file that was meant
    directory = write_bundle(tmp_path / "b", create=False)
    args = ["--example-inputs", "inputs.npz", option, given]
    assert main(["manifest", "create", str(directory), *args, "--json"]) == 2
    failure = _json(capsys)
    assert failure["error"].startswith(f"{option}: no such file in {directory} (")
    assert named in failure["error"], failure["error"]
    assert failure["field"] == option and failure["value"] == given
    assert not (directory / MANIFEST_FILENAME).exists()


def test_create_names_a_file_outside_the_bundle_and_takes_one_inside_by_any_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    outside = tmp_path / "elsewhere.npz"
    np.savez(outside, x=np.ones((1, 64), np.float32))
    assert main(["manifest", "create", str(directory), "--example-inputs", str(outside)]) == 2
    assert capsys.readouterr().err == (
        f"edge: --example-inputs: not a file inside {directory} (file arguments are paths "
        "inside the bundle folder: copy the file there, or name it relative to the folder): "
        f"{str(outside)!r}\n")
    monkeypatch.chdir(directory)  # ../b/inputs.npz from inside the bundle is inputs.npz
    assert main(["manifest", "create", ".", "--example-inputs", "../b/inputs.npz",
                 "--json"]) == 0
    assert _json(capsys)["example_inputs"] == "inputs.npz"


def test_create_on_a_bundle_with_a_manifest_exits_2_naming_it_and_force_replaces_it(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = bundle.resolve() / MANIFEST_FILENAME
    before = manifest.read_bytes()
    assert main(["manifest", "create", str(bundle), "--json"]) == 2
    failure = _json(capsys)
    assert failure["ok"] is False
    assert failure["error"] == (f"DIR: already has a manifest; pass --force to replace it "
                                f"(nothing was written): {str(manifest)!r}")
    assert failure["refusal"] == {
        "kind": "ManifestExists", "field": "manifest",
        "reason": "already exists (overwrite=True, or edge manifest create --force, "
                  "replaces it)",
        "value": str(manifest)}
    assert main(["manifest", "create", str(bundle)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"edge: DIR: already has a manifest; pass --force to replace it "
                            f"(nothing was written): {str(manifest)!r}\n")
    assert manifest.read_bytes() == before
    assert main(["manifest", "create", str(bundle), "--force", "--component", "x"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {manifest}")
    assert json.loads(manifest.read_text())["component"] == "x"


def test_force_refuses_a_directory_named_like_the_manifest_with_exit_2(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = bundle.resolve() / MANIFEST_FILENAME
    manifest.unlink()
    manifest.mkdir()  # a rename cannot replace it: was an internal error (exit 1)
    assert main(["manifest", "create", str(bundle), "--force", "--json"]) == 2
    failure = _json(capsys)
    assert failure["error"] == ("manifest: is a directory: only a manifest file is replaced "
                                f"(remove the directory): {str(manifest)!r}")
    assert failure["refusal"]["kind"] == "ManifestSchemaInvalid"
    assert manifest.is_dir() and sorted(p.name for p in bundle.iterdir()
                                        if p.name.startswith(".edge-manifest.")) == []


def test_create_exits_2_for_a_refused_bundle_and_verify_exits_1(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What create is given is its input (exit 2); what verify answers is a check (exit 1)."""
    np.save(bundle / "bare.npy", np.ones(3))
    (bundle / "bare.npy").replace(bundle / "inputs.npz")
    assert main(["manifest", "create", str(bundle), "--force", "--example-inputs",
                 "inputs.npz", "--json"]) == 2
    created = _json(capsys)
    assert created["refusal"]["kind"] == "ReferenceRefused"
    assert created["refusal"]["field"] == "manifest.metadata.example_inputs"
    assert main(["manifest", "verify", str(bundle), "--json"]) == 1
    assert _json(capsys)["refusal"]["kind"] == "DigestMismatch"


def test_create_over_the_file_limit_says_more_than_the_limit_not_where_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk stops at the first file over 4096: 4097 was named as if it were the count."""
    from edge_contracts.manifest import MAX_FILES

    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(MAX_FILES + 50):
        (folder / f"f{index}.bin").write_bytes(b"")
    assert main(["manifest", "create", str(folder), "--graph", "f0.bin", "--json"]) == 2
    created = _json(capsys)
    assert created["error"] == f"bundle: must hold <= {MAX_FILES} files: 'more than {MAX_FILES}'"
    assert created["refusal"]["value"] == f"more than {MAX_FILES}"
    assert not (folder / MANIFEST_FILENAME).exists()
    assert main(["manifest", "create", str(folder), "--graph", "f0.bin"]) == 2
    assert capsys.readouterr().err == (f"edge: bundle: must hold <= {MAX_FILES} files: "
                                       f"'more than {MAX_FILES}'\n")


@pytest.mark.parametrize(("data", "missing"), [
    (b"", "the file is empty (0 bytes)"),
    (b"\xff\xfe not protobuf", "not a readable ONNX model (unexpected wire type 7"),
])
def test_a_graph_named_onnx_that_is_not_onnx_exits_2_at_create_and_1_at_verify(
    bundle: Path, capsys: pytest.CaptureFixture[str], data: bytes, missing: str
) -> None:
    graph = bundle / "model.onnx"
    graph.write_bytes(data)
    assert main(["manifest", "create", str(bundle), "--force", "--example-inputs",
                 "inputs.npz", "--json"]) == 2
    failure = _json(capsys)
    assert failure["refusal"]["kind"] == "ReferenceRefused"
    assert failure["refusal"]["field"] == "manifest.metadata.graph"
    assert failure["refusal"]["value"] == "model.onnx"
    assert failure["error"].startswith(f"manifest.metadata.graph: named .onnx but {missing}")
    assert main(["manifest", "create", str(bundle), "--force"]) == 2
    assert capsys.readouterr().err.startswith(
        f"edge: manifest.metadata.graph: named .onnx but {missing}")
    # a manifest written by hand for it: verify refuses it as a failed check
    edit_manifest(bundle, lambda m: m["files"].update({"model.onnx": sha256_of(graph)}))
    assert main(["manifest", "verify", str(bundle), "--json"]) == 1
    refused = _json(capsys)
    assert refused["ok"] is False
    assert refused["refusal"]["field"] == "manifest.metadata.graph"
    assert refused["error"].startswith(f"manifest.metadata.graph: named .onnx but {missing}")


def test_another_member_named_onnx_that_is_empty_exits_2_at_create_and_1_at_verify(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beside a valid graph, an empty buckets/b1.onnx is refused naming its own field."""
    (bundle / "buckets").mkdir()
    member = bundle / "buckets" / "b1.onnx"
    member.write_bytes(b"")
    field = 'manifest.files["buckets/b1.onnx"]'
    assert main(["manifest", "create", str(bundle), "--force", "--graph", "model.onnx",
                 "--example-inputs", "inputs.npz", "--json"]) == 2
    failure = _json(capsys)
    assert failure["refusal"]["kind"] == "ReferenceRefused"
    assert (failure["refusal"]["field"], failure["refusal"]["value"]) == (field,
                                                                         "buckets/b1.onnx")
    assert failure["error"].startswith(f"{field}: named .onnx but the file is empty (0 bytes)")
    edit_manifest(bundle, lambda m: m["files"].update({"buckets/b1.onnx": sha256_of(member)}))
    assert main(["manifest", "verify", str(bundle), "--json"]) == 1
    refused = _json(capsys)
    assert refused["ok"] is False
    assert refused["refusal"]["field"] == field
    assert refused["error"].startswith(f"{field}: named .onnx but the file is empty (0 bytes)")


def test_a_graph_in_another_format_is_accepted_by_create_and_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle for a backend that does not run ONNX names its own file as the graph."""
    directory = tmp_path / "tanh"
    directory.mkdir()
    (directory / "weights.bin").write_bytes(b"\xff\xfe not protobuf")
    np.savez(directory / "example.npz", x=np.zeros((2, 3), np.float32))
    assert main(["manifest", "create", str(directory), "--graph", "weights.bin",
                 "--example-inputs", "example.npz", "--json"]) == 0
    assert _json(capsys)["graph"] == "weights.bin"
    assert main(["manifest", "verify", str(directory), "--json"]) == 0
    assert _json(capsys)["graph"] == "weights.bin"


def test_create_without_example_inputs_notes_which_backends_refuse_the_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The note names who refuses such a bundle: the ONNX Runtime backends, not every stage.

    It said "a stage cannot load this bundle"; a stage on a backend that needs no example
    inputs (here the echo backend, served with ``--inputs``) loads and serves it.
    """
    directory = tmp_path / "plain"
    directory.mkdir()
    (directory / "weights.bin").write_bytes(b"weights")
    assert main(["manifest", "create", str(directory), "--graph", "weights.bin"]) == 0
    notes = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  note:")]
    assert notes == ["  note: no example inputs: the ONNX Runtime backends refuse to load "
                     "this bundle until its manifest names them (edge manifest create DIR "
                     "--example-inputs FILE --force); another backend decides for itself"]
    (tmp_path / "pipeline.toml").write_text(
        'name = "one"\n[[stages]]\nid = "a"\nmanifest = "plain"\n'
        '[stages.backend]\nname = "echo"\n')
    np.savez(tmp_path / "x.npz", x=np.array([1.0, 2.0], np.float32))
    served = subprocess.run(
        [sys.executable, "-m", "edge_core.cli", "run", "pipeline.toml", "--inputs", "x.npz",
         "--json"], cwd=tmp_path, env={**os.environ, "EDGE_PLUGINS": "echo",
                                        "EDGE_WORKER_LOG_DIR": str(tmp_path / "logs")},
        capture_output=True, text=True, timeout=120, check=False)
    assert served.returncode == 0, served.stderr
    report = json.loads(served.stdout)
    assert report["plan"]["stages"][0]["id"] == "a"
    assert report["ledger_after_close"]["reservations"] == []
    assert all(v["release"] == "released" for v in report["closed"].values())


def test_real_entry_point_shows_progress_when_forced_and_never_under_json(
    tmp_path: Path,
) -> None:
    directory = write_bundle(tmp_path / "big", create=False)
    (directory / "blob.bin").write_bytes(os.urandom(12 << 20))
    forced = {PROGRESS_ENV: "1"}
    created = _edge("manifest", "create", str(directory), "--json", env=forced)
    assert created.returncode == 0, created.stderr
    assert created.stderr == ""
    assert json.loads(created.stdout)["ok"] is True
    verified = _edge("manifest", "verify", str(directory), env=forced)
    assert verified.returncode == 0, verified.stderr
    assert "100% 12." in verified.stderr and "MiB" in verified.stderr
    assert verified.stdout.startswith(f"verified {directory.resolve()}")
    quiet = _edge("manifest", "verify", str(directory), env={PROGRESS_ENV: "auto"})
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_importing_the_command_and_the_library_does_not_import_numpy() -> None:
    code = ("import sys, edge_core.cli, edge_core.artifacts, edge_core.progress;"
            "sys.exit(1 if 'numpy' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
