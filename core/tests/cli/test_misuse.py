"""Command-line misuse: exit 2, every problem named at once, and no worker started.

Each row runs a real ``edge`` subprocess (the echo test backend) with a worker log
folder set: a worker that started would leave its log file there, so an empty folder
shows that every check ran before anything was loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ONE = """
name = "one"
prepare = "edge_echo.ends:prepare"
finish = "edge_echo.ends:finish"

[[stages]]
id = "a"
[stages.backend]
name = "echo"
"""

THREE = """
name = "three"

[[stages]]
id = "a"
backend = { name = "ecko" }

[[stages]]
id = "b"
input_transform = "edge_echo.transforms:passthrough"
backend = { name = "echo", options = { delay_s = -1.0 } }

[[stages]]
id = "c"
input_transform = "edge_echo.transforms:passthrough"
backend = { name = "echo", options = { scael = 2.0 } }
"""

#: Three problems: a backend's name, a stage nobody declares, a stage reading itself.
CHAIN = """
name = "chain"

[[stages]]
id = "a"
backend = { name = "ecko" }

[[stages]]
id = "b"
input_transform = "edge_echo.transforms:passthrough"
inputs_from = ["zzz"]
backend = { name = "echo" }

[[stages]]
id = "c"
input_transform = "edge_echo.transforms:passthrough"
inputs_from = ["c"]
backend = { name = "echo" }
"""

CHAIN_PROBLEMS = ["stages[0].backend.name", "did you mean 'echo'?",
                  "stages[1].inputs_from (stage 'b'): no such stage (stages: ['a', 'b', 'c']): "
                  "'zzz'",
                  "stages[2].inputs_from (stage 'c'): a stage cannot read its own outputs: 'c'"]

CANDIDATES = """
name = "fallback"

[[stages]]
id = "a"
[[stages.candidates]]
backend = { name = "not-installed" }
[[stages.candidates]]
backend = { name = "echo" }
"""


def edge(*args: str, cwd: Path,
         plugins: str = "echo,serve") -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    logs = cwd / "worker-logs"
    logs.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_DEBUG", "EDGE_PLUGINS"}}
    env.update({"EDGE_PLUGINS": plugins, "EDGE_WORKER_LOG_DIR": str(logs)})
    done = subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    return done, sorted(logs.iterdir())


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "one.toml").write_text(ONE)
    (tmp_path / "three.toml").write_text(THREE)
    (tmp_path / "fallback.toml").write_text(CANDIDATES)
    (tmp_path / "typo.toml").write_text(ONE.replace('name = "echo"', 'name = "ecoh"'))
    (tmp_path / "badopt.toml").write_text(ONE + "[stages.backend.options]\nallocate_mb = -3\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(16))
    np.savez(tmp_path / "pickled.npz", x=np.array([object()], dtype=object))
    for file, line in (("replicas.toml", "replicas = 100000"),
                       ("reference.toml", 'reference_backend = "ecoh"')):
        (tmp_path / file).write_text(ONE.replace('id = "a"', f'id = "a"\n{line}'))
    (tmp_path / "a.txt").write_text("1 2\n")
    (tmp_path / "target.toml").write_text(ONE + '[stages.placement]\ntarget = "nmupy"\n')
    (tmp_path / "candtarget.toml").write_text(CANDIDATES + 'placement = { target = "cuda" }\n')
    (tmp_path / "chain.toml").write_text(CHAIN)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pyproject.toml").write_text(
        "[tool.edge.pipelines.chain]\n" + CHAIN.replace('name = "chain"\n', "").replace(
            "[[stages]]", "[[tool.edge.pipelines.chain.stages]]"))
    (tmp_path / "deep.json").write_text('{"name": "x", "stages": ' + "[" * 10**5 + "]" * 10**5
                                        + "}")
    (tmp_path / "hugeio.toml").write_text(
        ONE.replace('id = "a"', 'id = "a"\nmax_io_bytes = 9223372036854775807'))
    (tmp_path / "targets.toml").write_text('targets = ["latency >>> 5"]\n' + ONE)
    (tmp_path / "latin1.toml").write_bytes(ONE.replace('"one"', '"caf\u00e9"').encode("latin-1"))
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "noprepare.toml").write_text(ONE.replace('prepare = "edge_echo.ends:prepare"\n',
                                                         ""))
    return tmp_path


THREE_PROBLEMS = ["stages[0].backend.name", "did you mean 'echo'?",
                  "stages[1].backend.options.delay_s", "stages[2].backend.options.scael"]

#: (command line, what stderr must name) — every row exits 2 and starts no worker.
TABLE = [
    (["run", "typo.toml", "--input", "a.txt"],
     ["typo.toml: stages[0].backend.name", "did you mean 'echo'?", "'ecoh'"]),
    (["plan", "typo.toml"], ["typo.toml: stages[0].backend.name", "did you mean 'echo'?"]),
    (["plan", "typo.toml", "--probe-only"], ["typo.toml: stages[0].backend.name"]),
    (["profile", "typo.toml", "--requests", "1"], ["typo.toml: stages[0].backend.name"]),
    (["serve", "typo.toml", "--port", "0"], ["typo.toml: stages[0].backend.name"]),
    (["run", "badopt.toml", "--input", "a.txt"],
     ["badopt.toml: stages[0].backend.options.allocate_mb", "-3"]),
    (["plan", "badopt.toml"], ["badopt.toml: stages[0].backend.options.allocate_mb"]),
    (["profile", "badopt.toml"], ["badopt.toml: stages[0].backend.options.allocate_mb"]),
    (["run", "three.toml"], ["three.toml: 3 configuration problems", *THREE_PROBLEMS]),
    (["plan", "three.toml"], ["three.toml: 3 configuration problems", *THREE_PROBLEMS]),
    (["profile", "three.toml"], ["three.toml: 3 configuration problems", *THREE_PROBLEMS]),
    (["serve", "three.toml", "one.toml"], ["three.toml: 3 configuration problems",
                                           *THREE_PROBLEMS]),
    # the stages' wiring is checked with the rest of the file, by every command
    (["run", "chain.toml", "--input", "a.txt"],
     ["chain.toml: 3 configuration problems", *CHAIN_PROBLEMS]),
    (["plan", "chain.toml"], ["chain.toml: 3 configuration problems", *CHAIN_PROBLEMS]),
    (["plan", "chain.toml", "--probe-only"], ["chain.toml: 3 configuration problems",
                                              *CHAIN_PROBLEMS]),
    (["profile", "chain.toml", "--requests", "1"], ["chain.toml: 3 configuration problems",
                                                    *CHAIN_PROBLEMS]),
    (["serve", "chain.toml", "--port", "0"], ["chain.toml: 3 configuration problems",
                                              *CHAIN_PROBLEMS]),
    # a pyproject.toml without --name: the pipelines it defines are named (serve, which
    # has no --name, says it takes pipeline files instead of asking for one)
    (["run", "proj/pyproject.toml", "--input", "a.txt"],
     ["proj/pyproject.toml: --name: required with a pyproject.toml: which of its "
      "[tool.edge.pipelines] to use (defined: chain)"]),
    (["plan", "proj/pyproject.toml"], ["proj/pyproject.toml: --name: required", "chain"]),
    (["profile", "proj/pyproject.toml"], ["proj/pyproject.toml: --name: required", "chain"]),
    (["serve", "proj/pyproject.toml", "one.toml", "--port", "0"],
     ["proj/pyproject.toml: PIPELINE: edge serve takes pipeline files (.toml, .yaml, "
      ".json), not a pyproject.toml's [tool.edge.pipelines] (defined: chain): write the "
      "pipeline's table to a file of its own"]),
    (["plan", "proj/pyproject.toml", "--name", "chain"],
     ["proj/pyproject.toml: 3 configuration problems",
      "tool.edge.pipelines.chain.stages[1].inputs_from (stage 'b'): no such stage",
      "tool.edge.pipelines.chain.stages[2].inputs_from (stage 'c'): a stage cannot read its "
      "own"]),
    # a max_io_bytes the worker channel cannot carry: refused by the file's check
    (["run", "hugeio.toml", "--input", "a.txt"],
     ["hugeio.toml: stages[0].max_io_bytes (stage 'a'): must be at most 4611686018427387904 "
      "bytes",
      "9223372036854775807"]),
    (["profile", "hugeio.toml", "--input", "a.txt"], ["hugeio.toml: stages[0].max_io_bytes"]),
    (["run", "one.toml", "--inputs", "image.png"],
     ["--inputs image.png: not an .npz archive", "use --input"]),
    (["run", "one.toml", "--inputs", "pickled.npz"], ["--inputs pickled.npz"]),
    (["run", "one.toml", "--inputs", "missing.npz"], ["--inputs missing.npz: no such file"]),
    (["run", "one.toml", "--input", "missing.txt"], ["input missing.txt: ", "No such file"]),
    (["profile", "one.toml", "--input", "missing.txt"],
     ["--input missing.txt: No such file or directory"]),
    (["profile", "one.toml", "--input", "a.txt", "--input", "gone.png"],
     ["--input gone.png: No such file or directory"]),
    (["profile", "one.toml", "--input", "dir"], ["--input dir: is a directory, not a file"]),
    (["profile", "one.toml", "--input", "fifo"], ["--input fifo: not a regular file"]),
    (["profile", "one.toml", "--inputs", "missing.npz"],
     ["--inputs missing.npz: No such file or directory"]),
    (["profile", "one.toml", "--inputs", "image.png"],
     ["--inputs image.png: not an .npz archive"]),
    (["profile", "three.toml", "--input", "missing.txt"],  # the input before the file's
     ["--input missing.txt: No such file or directory"]),
    (["profile", "noprepare.toml", "--input", "a.txt"],
     ["--input a.txt: the pipeline names no 'prepare' function"]),
    (["run", "one.toml", "--input", "dir/"], ["--input dir/: the directory holds no file"]),
    # plan's --input (what a measured selection times) is checked as profile's is
    (["plan", "one.toml", "--input", "missing.txt"],
     ["--input missing.txt: No such file or directory"]),
    (["plan", "one.toml", "--input", "dir"], ["--input dir: is a directory, not a file"]),
    (["plan", "three.toml", "--input", "missing.txt"],  # the input before the file's
     ["--input missing.txt: No such file or directory"]),
    # ... and refused where the pipeline times nothing (one stage, one candidate)
    (["plan", "one.toml", "--input", "a.txt"],
     ["--input: pipeline 'one' times nothing to read it with (no stage lists more than "
      "one candidate", "drop --input"]),
    # a --params name the final stage's backend does not read: named, as edge serve's
    # 400 names it (it was passed on and ignored)
    (["run", "one.toml", "--input", "a.txt", "--params", '{"delay": 1, "delay_s": 0}'],
     ["--params: not a parameter of this pipeline: 'delay' (its final stage 'a', on echo, "
      "reads: allocate_mb, chunk_rate_hz, crash, delay_s, "]),
    (["run", "nope.toml"], ["nope.toml: cannot read (No such file or directory)"]),
    # a folder where PIPELINE is expected: said so, with what to give (each command that
    # takes PIPELINE shares the loader); a folder with a pyproject.toml names it
    (["run", "dir", "--input", "a.txt"],
     ["dir: a folder, not a file: give a pipeline file (.toml, .yaml, .yml or .json), "
      "or a pyproject.toml with --name NAME"]),
    (["plan", "proj"], ["proj: a folder, not a file: ", "with --name NAME (this one holds "
                        "proj/pyproject.toml)"]),
    (["profile", "dir", "--out", "p.json"], ["dir: a folder, not a file: "]),
    # edge serve takes no pyproject.toml: its refusal offers none
    (["serve", "dir", "one.toml", "--port", "0"],
     ["dir: a folder, not a file: give a pipeline file (.toml, .yaml, .yml or .json)"]),
    (["plan", "one.toml", "--name", "other"], ["--name: picks one of a pyproject.toml's "
                                               "pipelines", "'other'"]),
    (["plan", "replicas.toml"], ["replicas.toml: stages[0].replicas (stage 'a'): must be "
                                 "at most 256",
                                 "100000"]),
    (["plan", "reference.toml"], ["reference.toml: stages[0].reference_backend",
                                  "did you mean 'echo'?", "'ecoh'"]),
    (["plan", "nope.toml"], ["nope.toml: cannot read"]),
    # a placement target the backend does not place on: named before any worker starts
    # (else the warm-up gate refused it, exit 1, after loading)
    (["run", "target.toml", "--input", "a.txt"],
     ["target.toml: stages[0].placement.target (stage 'a'): backend 'echo' does not place "
      "work on this target (did you mean 'numpy'? it places on: numpy): 'nmupy'"]),
    (["plan", "target.toml", "--probe-only"], ["target.toml: stages[0].placement.target"]),
    (["serve", "target.toml", "--port", "0"], ["target.toml: stages[0].placement.target"]),
    (["plan", "candtarget.toml"],  # the installed candidate's own target; not the other's
     ["candtarget.toml: stages[0].candidates[1].placement.target (stage 'a'): candidate 1 "
      "backend 'echo' does not place work on this target (it places on: numpy): 'cuda'"]),
    (["plan", "latin1.toml"], ["latin1.toml: not valid UTF-8 (byte "]),
    (["plan", "deep.json"], ["deep.json: not read as JSON: arrays or tables nested too deeply"]),
    (["plan", "targets.toml"], ["targets.toml: targets[0]: not of the form", "'latency >>> 5'"]),
    (["run", "latin1.toml", "--input", "a.txt"], ["latin1.toml: not valid UTF-8 (byte "]),
    (["run", "one.toml"], ["give --input FILE or --inputs NPZ", "'a'"]),
    (["conformance", "ecoh"], ["no installed plugin provides this backend",
                               "did you mean 'echo'", "'ecoh'"]),
    (["probe", "--backend", "ecoh"], ["--backend: ", "did you mean 'echo'"]),
    # --probe-only times nothing: the timing options are refused, not ignored, before the
    # pipeline file is read (typo.toml's own problem is not reached)
    (["plan", "typo.toml", "--probe-only", "--remeasure"],
     ["--probe-only: not with --remeasure (", "drop --probe-only"]),
    (["plan", "typo.toml", "--probe-only", "--input", "a.txt"],
     ["--probe-only: not with --input ("]),
    (["plan", "one.toml", "--input", "a.txt", "--remeasure", "--probe-only"],
     ["--probe-only: not with --input or --remeasure ("]),
]


@pytest.mark.parametrize(("argv", "named"), TABLE, ids=[" ".join(a) for a, _ in TABLE])
def test_misuse_exits_2_naming_every_problem_before_any_worker_starts(
    work: Path, argv: list[str], named: list[str],
) -> None:
    done, logs = edge(*argv, cwd=work)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if not line.startswith("edge: worker")]
    assert len(errors) == 1, done.stderr  # one line, every problem in it
    for text in named:
        assert text in errors[0], (text, errors[0])
    assert logs == [], f"a worker started: {logs}"


def test_a_folder_given_to_serve_names_its_pipeline_files_and_offers_no_name_option(
    work: Path,
) -> None:
    (work / "models").mkdir()
    (work / "models" / "b.yaml").write_text("name: b\n")
    (work / "models" / "pyproject.toml").write_text("")
    done, logs = edge("serve", "models", "--port", "0", "--json", cwd=work)
    assert done.returncode == 2, done.stdout + done.stderr
    problems = json.loads(done.stdout)["problems"]
    assert problems == ["models: a folder, not a file: give a pipeline file (.toml, .yaml, "
                        ".yml or .json) (this one holds b.yaml)"]
    assert logs == []


def test_json_lists_each_problem_with_the_file(work: Path) -> None:
    done, logs = edge("plan", "three.toml", "--json", cwd=work)
    assert done.returncode == 2
    body = json.loads(done.stdout)
    assert body["ok"] is False and body["file"] == "three.toml"
    assert [p.split(":")[0] for p in body["problems"]] == [  # the path, then the stage's id
        "stages[0].backend.name (stage 'a')", "stages[1].backend.options.delay_s (stage 'b')",
        "stages[2].backend.options.scael (stage 'c')"]
    assert logs == []


def test_probe_only_with_a_timing_option_is_refused_in_json_naming_the_options(
    work: Path,
) -> None:
    for extra, given in ((["--remeasure"], ["--remeasure"]),
                         (["--input", "a.txt"], ["--input"]),
                         (["--input", "a.txt", "--remeasure"], ["--input", "--remeasure"])):
        done, logs = edge("plan", "typo.toml", "--probe-only", *extra, "--json", cwd=work)
        assert done.returncode == 2, done.stdout + done.stderr
        body = json.loads(done.stdout)
        assert body["ok"] is False and body["options"] == ["--probe-only", *given]
        assert body["error"].startswith(f"--probe-only: not with {' or '.join(given)} ("), body
        assert "stages[0]" not in body["error"]  # refused before the file was read
        assert logs == []
    # without --probe-only, --remeasure is taken (the plan opens, its gates run in full);
    # --input only where a measured choice reads it: one.toml has none, so it is refused
    # (test_placement_cli.py times it on a pipeline that has one)
    done, logs = edge("plan", "one.toml", "--remeasure", "--input", "a.txt", "--json",
                      cwd=work)
    assert done.returncode == 2 and json.loads(done.stdout)["options"] == ["--input"]
    assert logs == []
    done, _ = edge("plan", "one.toml", "--remeasure", "--json", cwd=work)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["mode"] == "open"


def test_structure_and_backend_problems_are_named_together(work: Path) -> None:
    (work / "mixed.toml").write_text(THREE.replace('id = "c"', 'id = "c"\nrepliccas = 2'))
    done, logs = edge("run", "mixed.toml", cwd=work)
    assert done.returncode == 2
    for text in ["stages[2].repliccas", *THREE_PROBLEMS]:
        assert text in done.stderr, text
    assert logs == []


def test_backend_manifest_and_transform_problems_are_named_together(work: Path) -> None:
    broken = THREE.replace('id = "c"', 'id = "c"\nmanifest = "no/such/bundle"').replace(
        "edge_echo.transforms:passthrough", "edge_echo.transforms:no_such_function", 1)
    (work / "four.toml").write_text(broken)
    done, logs = edge("plan", "four.toml", "--json", cwd=work)
    assert done.returncode == 2, done.stderr
    paths = sorted(p.split(":")[0] for p in json.loads(done.stdout)["problems"])
    assert paths == ["stages[0].backend.name (stage 'a')",
                     "stages[1].backend.options.delay_s (stage 'b')",
                     "stages[1].input_transform (stage 'b')",
                     "stages[2].backend.options.scael (stage 'c')",
                     "stages[2].manifest (stage 'c')"]
    assert logs == []


def test_an_uninstalled_candidate_stays_a_refusal_and_the_next_one_serves(work: Path) -> None:
    done, _ = edge("plan", "fallback.toml", "--probe-only", "--json", cwd=work)
    assert done.returncode == 0, done.stderr
    (stage,) = json.loads(done.stdout)["stages"]
    first, second = stage["candidates"]
    assert first["backend"] == "not-installed" and first["layer"] == "backend"
    assert second["backend"] == "echo" and second["outcome"] != "refused"


#: A regular file that even root cannot open to read (a write-only sysctl); opening it
#: for reading has no effect.
WRITE_ONLY = Path("/proc/sys/vm/compact_memory")


def test_profile_refuses_an_unreadable_input_by_name(work: Path) -> None:
    if os.geteuid() != 0:
        (work / "secret.png").write_bytes(b"x")
        (work / "secret.png").chmod(0)
    elif WRITE_ONLY.exists():  # root reads a file whatever its mode
        (work / "secret.png").symlink_to(WRITE_ONLY)
    else:
        pytest.skip("running as root without a write-only file to point at")
    done, logs = edge("profile", "one.toml", "--input", "secret.png", cwd=work)
    assert done.returncode == 2, done.stderr
    assert "--input secret.png: cannot be read (Permission denied)" in done.stderr
    assert logs == []


def test_a_refused_profile_input_leaves_nothing_behind(work: Path) -> None:
    """Exit 2 in JSON too; no profile or record written, no worker, no segment of its own."""
    from edge_contracts.shm import segment_names, segment_owner

    logs = work / "worker-logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_DEBUG", "EDGE_PLUGINS"}}
    env.update({"EDGE_PLUGINS": "echo", "EDGE_WORKER_LOG_DIR": str(logs)})
    before = set(segment_names())
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_core.cli", "profile", "one.toml", "--input",
         "missing.png", "--json", "--out", "p.json", "--records", "records"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 2, err
    body = json.loads(out)
    assert body["ok"] is False
    assert body["error"] == "--input missing.png: No such file or directory"
    assert body["option"] == "--input" and body["input"] == "missing.png"
    assert not (work / "p.json").exists() and not (work / "records").exists()
    assert list(logs.iterdir()) == [], "a worker started"
    left = [name for name in set(segment_names()) - before
            if (owner := segment_owner(name)) is not None and owner.pid == process.pid]
    assert left == []


#: (command line, the option its one error line names) — refused by the command line's own
#: checks: exit 2 before the pipeline file is even read.
OPTIONS = [
    # a port beyond 65535: was an internal error (OverflowError, exit 1) at bind, after
    # every pipeline had opened
    (["serve", "one.toml", "--port", "99999"], "--port"),
    (["serve", "one.toml", "--port", "-1"], "--port"),
    (["run", "one.toml", "--input", "a.txt", "--repeat", "0"], "--repeat"),
    (["run", "one.toml", "--input", "a.txt", "--repeat", "-1"], "--repeat"),
    (["run", "one.toml", "--input", "a.txt", "--deadline", "0"], "--deadline"),
    (["run", "one.toml", "--input", "a.txt", "--deadline", "-1"], "--deadline"),
    (["run", "one.toml", "--input", "a.txt", "--deadline", "nan"], "--deadline"),
    (["run", "one.toml", "--input", "a.txt", "--params", "[1, 2]"], "--params"),
    (["run", "one.toml", "--input", "a.txt", "--params", "null"], "--params"),
    # JSON has no NaN nor Infinity: refused here, not by each request once the stage opened
    (["run", "one.toml", "--input", "a.txt", "--params", '{"t": NaN}'], "--params"),
    (["run", "one.toml", "--input", "a.txt", "--params", '{"t": [-Infinity]}'], "--params"),
    (["run", "one.toml", "--input", "a.txt", "--params", '{"t": 1e999}'], "--params"),
    (["profile", "one.toml", "--input", "a.txt", "--params", '{"t": NaN}'], "--params"),
    (["run", "one.toml", "--input", "a.txt", "--inputs", "x.npz"], "--inputs"),
    (["run", "one.toml", "--repeat", "abc"], "--repeat"),
    (["probe", "--timeout", "0"], "--timeout"),
    (["probe", "--timeout", "nan"], "--timeout"),
    (["probe", "--timeout", "inf"], "--timeout"),
    (["cleanup", "--bogus"], "--bogus"),
    # profile's counts and seconds, named as typed (not as the settings' field names) and
    # refused when not finite: the profile file is JSON, which has no NaN nor Infinity
    (["profile", "one.toml", "--input", "a.txt", "--requests", "0"], "--requests"),
    (["profile", "one.toml", "--input", "a.txt", "--warmup", "-1"], "--warmup"),
    (["profile", "one.toml", "--input", "a.txt", "--process-starts", "0"], "--process-starts"),
    (["profile", "one.toml", "--input", "a.txt", "--startup-samples", "-1"],
     "--startup-samples"),
    (["profile", "one.toml", "--input", "a.txt", "--matched-requests", "0"],
     "--matched-requests"),
    (["profile", "one.toml", "--input", "a.txt", "--slow-consumer-pause", "nan"],
     "--slow-consumer-pause"),
    (["profile", "one.toml", "--input", "a.txt", "--slow-consumer-pause", "inf"],
     "--slow-consumer-pause"),
    (["profile", "one.toml", "--input", "a.txt", "--chunk-seconds", "inf"], "--chunk-seconds"),
    (["profile", "one.toml", "--input", "a.txt", "--chunk-seconds", "nan"], "--chunk-seconds"),
    (["profile", "one.toml", "--input", "a.txt", "--duration", "9" * 400], "--duration"),
    # counts that size the run have a ceiling (10**23 requests was a run without end)
    (["profile", "one.toml", "--input", "a.txt", "--requests", str(10**23)], "--requests"),
    (["profile", "one.toml", "--input", "a.txt", "--startup-samples", "9" * 5000],
     "--startup-samples"),
    # lengths and repeats have a ceiling too (--duration 9999h was taken)
    (["profile", "one.toml", "--input", "a.txt", "--duration", "169h"], "--duration"),
    (["profile", "one.toml", "--input", "a.txt", "--window", "25h"], "--window"),
    (["run", "one.toml", "--input", "a.txt", "--repeat", str(10**23)], "--repeat"),
]


#: Each count option of ``edge profile`` and its documented ceiling (docs/cli.md).
PROFILE_CEILINGS = {"--requests": 100_000, "--warmup": 100_000,
                    "--matched-requests": 100_000, "--process-starts": 1_000,
                    "--startup-samples": 100}


@pytest.mark.parametrize(("option", "ceiling"), PROFILE_CEILINGS.items())
def test_a_profile_count_above_its_documented_ceiling_is_refused_naming_it(
        option: str, ceiling: int) -> None:
    from edge_core.cli import parser_and_commands
    from edge_core.cli.common import UsageError

    parser, _ = parser_and_commands("profile")
    args = parser.parse_args(["profile", "p.toml", option, str(ceiling)])
    assert getattr(args, option[2:].replace("-", "_")) == ceiling
    for value in (str(ceiling + 1), str(10**23), "9" * 5000):
        with pytest.raises(UsageError) as refused:
            parser.parse_args(["profile", "p.toml", option, value])
        assert refused.value.message.startswith(
            f"edge profile: error: argument {option}: must be at most {ceiling}: "), value
    page = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text("utf-8")
    section = page.split("## edge profile\n", 1)[1].split("\n## ", 1)[0]
    documented = " ".join(section.split(f"  {option} N", 1)[1].split("\n  --", 1)[0].split())
    assert f"at most {ceiling})" in documented, documented


#: Each length option of ``edge profile``, its documented ceiling (docs/cli.md) and the
#: ceiling in seconds.
PROFILE_LENGTHS = {"--duration": ("168h", 168 * 3600.0), "--window": ("24h", 24 * 3600.0)}


@pytest.mark.parametrize(("option", "ceiling"), PROFILE_LENGTHS.items())
def test_a_profile_length_above_its_documented_ceiling_is_refused_naming_it(
        option: str, ceiling: tuple[str, float]) -> None:
    """``--duration`` and ``--window`` took any finite length (``--duration 99999h``)."""
    from edge_core.cli import parser_and_commands
    from edge_core.cli.common import UsageError

    shown, seconds = ceiling
    parser, _ = parser_and_commands("profile")
    args = parser.parse_args(["profile", "p.toml", option, shown])
    assert getattr(args, option[2:]) == seconds
    for value in (f"{seconds + 1:g}", f"{seconds / 60 + 1:g}m", "99999h", "9" * 300):
        with pytest.raises(UsageError) as refused:
            parser.parse_args(["profile", "p.toml", option, value])
        assert refused.value.message.startswith(
            f"edge profile: error: argument {option}: must be at most {shown} "
            f"({seconds:g} s): "), value
    page = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text("utf-8")
    section = page.split("## edge profile\n", 1)[1].split("\n## ", 1)[0]
    documented = " ".join(section.split(f"  {option} DURATION", 1)[1]
                          .split("\n  --", 1)[0].split())
    assert f"at most {shown})" in documented, documented


def test_run_repeat_above_its_documented_ceiling_is_refused_naming_it() -> None:
    """``edge run --repeat`` had no ceiling (``--repeat 10**23`` ran until killed)."""
    from edge_core.cli import parser_and_commands
    from edge_core.cli.common import UsageError

    parser, _ = parser_and_commands("run")
    assert parser.parse_args(["run", "p.toml", "--repeat", "100000"]).repeat == 100_000
    for value in ("100001", str(10**23), "9" * 5000):
        with pytest.raises(UsageError) as refused:
            parser.parse_args(["run", "p.toml", "--repeat", value])
        assert refused.value.message.startswith(
            "edge run: error: argument --repeat: must be at most 100000: "), value
    page = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text("utf-8")
    section = page.split("## edge run\n", 1)[1].split("\n## ", 1)[0]
    documented = " ".join(section.split("  --repeat N", 1)[1].split("\n  --", 1)[0].split())
    assert "at most 100000)" in documented, documented


@pytest.mark.parametrize(("argv", "option"), OPTIONS, ids=[" ".join(a) for a, _ in OPTIONS])
def test_a_refused_option_exits_2_naming_it_and_answers_json_when_asked(
    work: Path, argv: list[str], option: str,
) -> None:
    done, logs = edge(*argv, cwd=work)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    *usage, error = done.stderr.strip().splitlines()
    assert usage and usage[0].startswith("usage: edge"), done.stderr
    assert ": error: " in error and option in error, done.stderr
    assert done.stdout == ""
    as_json, _ = edge(*argv, "--json", cwd=work)
    assert as_json.returncode == 2, as_json.stdout + as_json.stderr
    body = json.loads(as_json.stdout)  # one JSON document on stdout, as every refusal
    assert body["ok"] is False and option in body["error"], body
    assert logs == [], f"a worker started: {logs}"


#: (command line, what its one error line names) — where a command would write, checked
#: before anything opens.
OUTPUTS = [
    (["run", "one.toml", "--input", "a.txt", "--jsonl", "--json"], "--jsonl: not with --json"),
    (["run", "one.toml", "--input", "a.txt", "--profile", "dir"],
     "--profile dir: is a directory"),
    (["run", "one.toml", "--input", "a.txt", "--profile", "a.txt/p.json"],
     "--profile a.txt/p.json: "),
    (["profile", "one.toml", "--input", "a.txt", "--out", "dir"], "--out dir: is a directory"),
    (["profile", "one.toml", "--input", "a.txt", "--records", "a.txt"],
     "--records a.txt: exists and is not a directory"),
    # --sysfs is read, not written, but a root that is not there would only make every
    # condition 'unavailable' in silence
    (["profile", "one.toml", "--input", "a.txt", "--sysfs", "nope"],
     "--sysfs nope: not an existing directory"),
    (["profile", "one.toml", "--input", "a.txt", "--sysfs", "a.txt", "--json"],
     "--sysfs a.txt: not an existing directory"),
    # matrix and qualify check where they write before reading a record or a profile (the
    # record and profile named here do not even exist)
    (["matrix", "nope.json", "--out-dir", "a.txt"], "--out-dir a.txt: exists and is not a"),
    (["matrix", "nope.json", "--out-dir", "a.txt/m", "--json"], "--out-dir a.txt/m: "),
    (["qualify", "--profile", "nope.json", "--out", "dir"], "--out dir: is a directory"),
    (["qualify", "--profile", "nope.json", "--out-dir", "a.txt", "--json"],
     "--out-dir a.txt: exists and is not a directory"),
    (["qualify", "--hub-job", "nope.json", "--out", "a.txt/r.json"], "--out a.txt/r.json: "),
]


@pytest.mark.parametrize(("argv", "named"), OUTPUTS, ids=[" ".join(a) for a, _ in OUTPUTS])
def test_an_output_that_cannot_be_written_exits_2_before_anything_opens(
    work: Path, argv: list[str], named: str,
) -> None:
    done, logs = edge(*argv, cwd=work)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    if "--json" in argv:  # the refusal is the JSON document on stdout
        errors = [json.loads(done.stdout)["error"]]
    else:
        errors = [line for line in done.stderr.splitlines()
                  if not line.startswith("edge: worker")]
    assert len(errors) == 1 and named in errors[0], done.stdout + done.stderr
    assert logs == [], f"a worker started: {logs}"


BUNDLES = """
name = "bundles"

[[stages]]
id = "none"
backend = { name = "ort-cpu" }

[[stages]]
id = "file"
input_transform = "edge_echo.transforms:passthrough"
backend = { name = "ort-cpu" }
manifest = "a.txt"

[[stages]]
id = "folder"
input_transform = "edge_echo.transforms:passthrough"
backend = { name = "ort-cpu" }
manifest = "dir"

[[stages]]
id = "echo"
input_transform = "edge_echo.transforms:passthrough"
backend = { name = "echo" }
"""


def test_a_stage_whose_backend_needs_a_bundle_names_one_before_anything_starts(
        work: Path) -> None:
    (work / "bundles.toml").write_text(BUNDLES)
    done, logs = edge("run", "bundles.toml", "--input", "a.txt", cwd=work,
                      plugins="echo,ort-cpu")
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if not line.startswith("edge: worker")]
    assert len(errors) == 1, done.stderr
    for named in ("3 configuration problems",
                  "stages[0].manifest (stage 'none'): backend 'ort-cpu' needs an artifact "
                  "bundle",
                  "stages[1].manifest (stage 'file'): name a bundle folder or its "
                  "edge-manifest.json: ",
                  "stages[2].manifest (stage 'folder'): a folder without edge-manifest.json"):
        assert named in errors[0], (named, errors[0])
    assert "stages[3]" not in errors[0]  # echo needs no bundle
    assert logs == [], f"a worker started: {logs}"
