"""``edge run`` end to end in a subprocess, on the echo backend: output, profile, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def edge(*args: str, cwd: Path,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": "echo", **(env or {})}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


PIPELINE = """
name = "twice"

[[stages]]
id = "a"
[stages.backend]
name = "echo-preemptible"
[stages.backend.options]
scale = 2.0

[[stages]]
id = "b"
input_transform = "edge_echo.transforms:add_source"
[stages.backend]
name = "echo"
[stages.backend.options]
scale = 10.0
"""


def test_run_prints_plan_answer_and_writes_a_profile(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0, 2.0], np.float32))
    result = edge("run", "pipeline.toml", "--inputs", "in.npz", "--repeat", "3",
                  "--profile", "profile.json", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests"] == 3
    assert set(report["latency_p50_ms"]) == {"a", "b", "total"}
    assert [s["id"] for s in report["plan"]["stages"]] == ["a", "b"]
    assert all(v["release"] == "released" for v in report["closed"].values())
    assert report["ledger_after_close"]["reservations"] == []
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert len(profile["samples"]) == 3
    assert report["answer"] == {"x": {"dtype": "float32", "shape": [2]}}
    human = edge("run", "pipeline.toml", "--inputs", "in.npz", cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "stage a: echo-preemptible on numpy [numpy 1]" in human.stdout
    assert "latency p50 over 1 request(s)" in human.stdout
    assert "health: ready" in human.stdout
    assert "stage b: ready; generation 1, restarts 0 (restart = never)" in human.stdout
    assert report["health"]["stages"]["b"]["state"] == "ready"


def test_a_configuration_error_exits_2_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(PIPELINE.replace('id = "b"', 'id = "b"\nbogus = 1'))
    result = edge("run", "bad.toml", "--json", cwd=tmp_path)
    assert result.returncode == 2
    assert "stages[1].bogus" in json.loads(result.stdout)["error"]


def test_a_refusal_exits_1_and_leaves_no_worker(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE.replace("scale = 10.0",
                                                      'scale = 10.0\nfail_at = "warmup"'))
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    result = edge("run", "p.toml", "--inputs", "in.npz", "--json", cwd=tmp_path)
    assert result.returncode == 1
    assert "warm-up failed as configured" in json.loads(result.stdout)["error"]


def test_a_request_past_its_deadline_exits_1_and_shows_the_failed_stage(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE.replace("scale = 10.0",
                                                      "scale = 10.0\ndelay_s = 10.0"))
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    result = edge("run", "p.toml", "--inputs", "in.npz", "--deadline", "1.0", cwd=tmp_path)
    assert result.returncode == 1
    assert "DeadlineExceeded" in result.stderr
    assert "stage b: failed (a call's deadline_s expired" in result.stderr


def test_a_call_timeout_centuries_long_leaves_the_next_stages_bound_in_force(
    tmp_path: Path,
) -> None:
    """``call_timeout_s = 1e10`` on stage a (past ``threading.TIMEOUT_MAX``) must not stop
    the deadline timer: stage b's own 0.5 s bound still ends its 5 s call (exit 1)."""
    slow = PIPELINE.replace('id = "a"', 'id = "a"\ncall_timeout_s = 1e10').replace(
        "scale = 2.0", "scale = 2.0\ndelay_s = 0.3").replace(
        'id = "b"', 'id = "b"\ncall_timeout_s = 0.5').replace(
        "scale = 10.0", "scale = 10.0\ndelay_s = 5.0")
    (tmp_path / "p.toml").write_text(slow)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    result = edge("run", "p.toml", "--inputs", "in.npz", "--json", cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout
    report = json.loads(result.stdout)
    assert "DeadlineExceeded" in report["error"] and "call_timeout_s expired: 0.5" in \
        report["error"], report["error"]


def test_worker_logs_are_files_named_in_the_plan_unless_verbose(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0, 2.0], np.float32))
    (tmp_path / "tmp").mkdir()  # where the command makes its log folder (TMPDIR)
    result = edge("run", "pipeline.toml", "--inputs", "in.npz", "--json", cwd=tmp_path,
                  env={"TMPDIR": str(tmp_path / "tmp")})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    logs = Path(report["worker_logs"])
    assert logs.parent == tmp_path / "tmp"
    for stage in report["plan"]["stages"]:  # as they were during the run
        log = Path(stage["worker"]["log"])
        assert log.parent == logs
        assert log.name == f"{stage['id']}.g{stage['generation']}.log"
    assert list((tmp_path / "tmp").iterdir()) == []  # the workers said nothing: removed
    verbose = edge("run", "pipeline.toml", "--inputs", "in.npz", "--json", "--verbose",
                   cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stderr
    report = json.loads(verbose.stdout)
    assert report["worker_logs"] is None
    assert all(stage["worker"]["log"] is None for stage in report["plan"]["stages"])


CANDIDATES = """
name = "fallback"

[[stages]]
id = "a"

[[stages.candidates]]
backend = { name = "echo", options = { wrong_numerics = true } }

[[stages.candidates]]
backend = { name = "echo-preemptible", options = { scale = 2.0 } }
"""


def test_run_json_lists_every_candidate_tried_with_one_chosen(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(CANDIDATES)
    np.savez(tmp_path / "in.npz", x=np.array([1.0, 2.0], np.float32))
    result = edge("run", "pipeline.toml", "--inputs", "in.npz", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (stage,) = report["plan"]["stages"]
    assert stage["backend"] == "echo-preemptible"
    tried = stage["candidates"]
    assert [(c["backend"], c["outcome"], c["layer"]) for c in tried] == [
        ("echo", "refused", "numerics"), ("echo-preemptible", "chosen", None)]
    assert "max_abs_error" in tried[0]["reason"] and tried[1]["reason"] is None
    assert report["plan"]["config"]["stages"][0]["candidates"][1]["backend"] == "echo-preemptible"
    assert report["ledger_after_close"]["reservations"] == []
    human = edge("run", "pipeline.toml", "--inputs", "in.npz", cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "    candidate echo refused at numerics: NumericsRefused: " in human.stdout


def test_the_health_lines_say_how_many_replicas_are_live() -> None:
    from edge_core.cli.run_cmd import _health_lines

    stage = {"state": "ready", "reason": None, "generation": 1, "restarts": 0,
             "policy": {"restart": "on-failure"}}
    health = {"stages": {"a": {**stage, "state": "failed", "reason": "worker lost"},
                         "a#1": stage, "b": stage},
              "replicas": {"a": {"declared": 2, "live": 1, "state": "degraded"},
                           "b": {"declared": 1, "live": 1, "state": "ready"}}}
    lines = [line.strip() for line in _health_lines(health)]
    assert lines[0] == ("stage a: failed (worker lost); generation 1, restarts 0 "
                        "(restart = on-failure)")
    assert lines[-1] == "stage a: 1 of 2 replicas live (degraded)"
    assert len(lines) == 4  # no replica line for a stage of one


def test_the_health_lines_name_a_stage_whose_bundle_changed() -> None:
    """A stage whose bundle a ``finish`` or transform found rewritten is ``ready`` (its
    worker serves) yet the pipeline is ``degraded``: its line says why."""
    from edge_core.cli.run_cmd import _health_lines

    stage = {"state": "ready", "reason": None, "generation": 1, "restarts": 0,
             "policy": {"restart": "never"}, "bundle_changed": None}
    changed = {"type": "BundleChanged", "layer": "artifact",
               "message": "/b/edge-manifest.json: rewritten since the stage opened"}
    health = {"stages": {"a": {**stage, "bundle_changed": changed}, "b": stage}}
    assert [line.strip() for line in _health_lines(health)] == [
        "stage a: ready (bundle changed: /b/edge-manifest.json: rewritten since the stage "
        "opened); generation 1, restarts 0 (restart = never)",
        "stage b: ready; generation 1, restarts 0 (restart = never)"]


def test_a_request_failed_in_the_worker_is_one_line_its_traceback_left_to_debug(
        tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    args = ("run", "pipeline.toml", "--inputs", "in.npz", "--params", '{"fail_call": true}')
    plain = edge(*args, cwd=tmp_path)
    assert plain.returncode == 1
    (line,) = [text for text in plain.stderr.splitlines() if "RequestFailed" in text]
    assert "InjectedFailure: call failed as the request asked" in line
    assert "--debug or EDGE_DEBUG=1 prints the worker's traceback" in line
    assert "Traceback" not in plain.stderr and "worker traceback" not in plain.stderr
    report = json.loads(edge(*args, "--json", cwd=tmp_path).stdout)
    assert "Traceback" not in report["error"]
    assert "error_detail" not in report  # InjectedFailure holds no field, reason, value
    assert report["detail"].startswith("Traceback (most recent call last)")
    assert 'raise InjectedFailure("call failed as the request asked")' in report["detail"]
    debug = edge(*args, "--debug", cwd=tmp_path)
    assert debug.returncode == 1
    assert "--- worker traceback ---" in debug.stderr
    assert 'raise InjectedFailure("call failed as the request asked")' in debug.stderr


def test_a_workers_error_names_its_field_reason_and_value_in_the_json_document(
        tmp_path: Path) -> None:
    """The worker's error's own fields, as it sent them (``RequestFailed.error_detail``):
    a caller reads the field there, not out of the message."""
    one = PIPELINE.split("[[stages]]\nid = \"b\"")[0].replace(
        'id = "a"', 'id = "a"\nmax_io_bytes = 4096')
    (tmp_path / "pipeline.toml").write_text(one)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    failed = edge("run", "pipeline.toml", "--inputs", "in.npz", "--params",
                  '{"pad_output_bytes": 8192}', "--json", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    report = json.loads(failed.stdout)
    assert "EventTooLarge: event.outputs: the done event's output tensors" in report["error"]
    detail = report["error_detail"]
    assert (detail["field"], detail["value"]) == ("event.outputs", 4 + 8192)
    assert detail["reason"].startswith("the done event's output tensors are 8196 bytes, "
                                       "over the channel's max_io_bytes 4096")
    # each input's failed result under --input carries it too
    (tmp_path / "pipeline.toml").write_text('prepare = "edge_echo.ends:prepare"\n' + one)
    (tmp_path / "mine.txt").write_text("4 5")
    failed = edge("run", "pipeline.toml", "--input", "mine.txt", "--params",
                  '{"pad_output_bytes": 8192}', "--json", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    (result,) = json.loads(failed.stdout)["results"]
    assert (result["ok"], result["error_detail"]["field"]) == (False, "event.outputs")
    assert result["error_detail"]["value"] == 8 + 8192


def test_a_demand_on_an_unknown_pool_names_the_file_its_path_and_the_closest_pool(
        tmp_path: Path) -> None:
    # Found as the pipeline reserves (the pools are the probes'): the file's own path of
    # the demand, not the ledger's owner ('twice/a.demands[...]'), and the pool meant.
    typo = PIPELINE.replace("scale = 2.0",
                            'scale = 2.0\n[stages.resources.demands]\n"machine:rma" = 1')
    (tmp_path / "pool.toml").write_text(typo)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    refused = edge("run", "pool.toml", "--inputs", "in.npz", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert ('edge: pool.toml: stages[0].resources.demands["machine:rma"] (stage \'a\'): unknown '
            "pool (did you mean 'machine:ram'? known: machine:ram): 'machine:rma'"
            ) in refused.stderr
    body = json.loads(edge("run", "pool.toml", "--inputs", "in.npz", "--json",
                           cwd=tmp_path).stdout)
    assert body["file"] == "pool.toml"
    assert body["problems"] == UNKNOWN_POOL


UNKNOWN_POOL = ['stages[0].resources.demands["machine:rma"] (stage \'a\'): unknown pool (did '
                "you mean 'machine:ram'? known: machine:ram): 'machine:rma'"]


@pytest.mark.parametrize("argv", [
    ["plan"], ["plan", "--probe-only"], ["profile", "--inputs", "in.npz", "--out", "p.json"],
    ["serve", "--port", "0"], ["run", "--inputs", "in.npz"]],
    ids=["plan", "plan --probe-only", "profile", "serve", "run"])
def test_every_command_refuses_a_stage_without_candidates_on_an_unknown_pool_as_the_files(
        tmp_path: Path, argv: list[str]) -> None:
    # The stage has one backend and nothing to fall back to: a configuration problem
    # (exit 2) at the file's path, as edge run says it; not 'no candidate' (exit 1), and
    # edge profile writes no profile for it (docs/cli.md).
    typo = PIPELINE.replace("scale = 2.0",
                            'scale = 2.0\n[stages.resources.demands]\n"machine:rma" = 1')
    (tmp_path / "pool.toml").write_text(typo)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    command, *options = argv
    refused = edge(command, "pool.toml", *options, "--json", cwd=tmp_path,
                   env={"EDGE_PLUGINS": "echo,serve"})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    body = json.loads(refused.stdout)
    assert body["ok"] is False, body
    if command == "serve":  # several files: each problem after its file's path
        assert body["problems"] == UNKNOWN_POOL
        assert body["error"].startswith(f"{tmp_path / 'pool.toml'}: {UNKNOWN_POOL[0]}")
    else:
        assert body["file"] == "pool.toml" and body["problems"] == UNKNOWN_POOL, body
    assert not (tmp_path / "p.json").exists()


def test_a_candidates_unknown_pool_is_named_at_its_own_resources(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("""
name = "c"
[[stages]]
id = "a"
[[stages.candidates]]
backend = { name = "echo" }
resources = { demands = { "machine:rma" = 1 } }
[[stages.candidates]]
backend = { name = "echo" }
""")
    plan = edge("plan", "c.toml", "--probe-only", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr  # the next candidate would serve
    assert ('candidate 0 echo: refused at configuration: UnknownPool: stages[0].candidates[0]'
            '.resources.demands["machine:rma"] (stage \'a\'): unknown pool (did you mean '
            "'machine:ram'?") in plan.stdout, plan.stdout


def test_a_worker_log_folder_is_removed_at_exit_when_every_log_is_empty(
        tmp_path: Path) -> None:
    # it was removed only when no worker started: every run whose workers said nothing
    # left a folder of empty logs behind in the temporary folder. A command that failed
    # keeps the folder it named (it was removed too, and the line pointed at nothing)
    temporary = tmp_path / "tmp"  # where the command makes its log folder (TMPDIR)
    temporary.mkdir()
    unknown_pool = PIPELINE.replace("scale = 2.0",
                                    'scale = 2.0\n[stages.resources.demands]\n"foo:bar" = 1')
    (tmp_path / "pool.toml").write_text(unknown_pool)
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    refused = edge("run", "pool.toml", "--inputs", "in.npz", cwd=tmp_path,
                   env={"TMPDIR": str(temporary)})
    assert refused.returncode == 2 and "unknown pool" in refused.stderr
    (named,) = [line.removeprefix("edge: worker logs: ")
                for line in refused.stderr.splitlines() if line.startswith("edge: worker logs: ")]
    kept = Path(named)  # made, empty at exit: kept, the command failed
    assert list(temporary.iterdir()) == [kept] and list(kept.iterdir()) == []
    served = edge("run", "pipeline.toml", "--inputs", "in.npz", "--json", cwd=tmp_path,
                  env={"TMPDIR": str(temporary)})
    assert served.returncode == 0, served.stderr
    report = json.loads(served.stdout)  # names the folder and logs as they were
    folder = Path(report["worker_logs"])
    assert folder.parent == temporary
    assert sorted(stage["worker"]["log"] for stage in report["plan"]["stages"]) == [
        str(folder / "a.g1.log"), str(folder / "b.g1.log")]
    assert list(temporary.iterdir()) == [kept]  # both logs empty: gone, and the folder


NOISY_WORKER = """
import sys


def create():
    print("NOISY-LOAD err", file=sys.stderr, flush=True)
    from edge_echo.worker import create as echo
    return echo()
"""


def test_a_worker_log_folder_where_a_worker_wrote_is_kept_whole(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    noisy = tmp_path / "noisy"
    noisy.mkdir()
    (noisy / "noisy_worker.py").write_text(NOISY_WORKER)
    route = (f'[stages.backend.route]\nname = "noisy"\ninterpreter = "{sys.executable}"\n'
             f'entry = "noisy_worker:create"\npython_path = ["{noisy}"]\n')
    (tmp_path / "pipeline.toml").write_text(  # stage a speaks as it loads, b says nothing
        PIPELINE.replace("scale = 2.0\n", "scale = 2.0\n" + route, 1))
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    result = edge("run", "pipeline.toml", "--inputs", "in.npz", "--json", cwd=tmp_path,
                  env={"TMPDIR": str(temporary)})
    assert result.returncode == 0, result.stderr
    assert "NOISY" not in result.stdout + result.stderr
    folder = Path(json.loads(result.stdout)["worker_logs"])
    assert list(temporary.iterdir()) == [folder]
    assert sorted(p.name for p in folder.iterdir()) == ["a.g1.log", "b.g1.log"]
    assert "NOISY-LOAD err" in (folder / "a.g1.log").read_text()
    assert (folder / "b.g1.log").stat().st_size == 0  # kept beside the one that spoke


def test_a_profile_path_no_file_can_have_is_refused_before_anything_opens(
        tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    result = edge("run", "pipeline.toml", "--inputs", "in.npz", "--profile",
                  "p" * 300 + ".json", "--json", cwd=tmp_path)  # over NAME_MAX
    assert result.returncode == 2
    assert "cannot be written: File name too long" in json.loads(result.stdout)["error"]
    assert "worker logs" not in result.stderr  # refused before anything opened


@pytest.mark.skipif(not (os.path.exists("/dev/full") and os.access("/dev", os.W_OK)),
                    reason="needs /dev/full and a /dev this user may write in (root)")
def test_a_profile_the_disk_refuses_keeps_the_answers_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    args = ("run", "pipeline.toml", "--inputs", "in.npz", "--profile", "/dev/full")
    report = edge(*args, "--json", cwd=tmp_path)  # /dev/full: every write is ENOSPC
    assert report.returncode == 1
    document = json.loads(report.stdout)
    assert document["ok"] is False and document["answer"] == {"x": {"dtype": "float32",
                                                                     "shape": [1]}}
    assert document["profile_error"] == ("--profile /dev/full: not written: "
                                         "No space left on device")
    assert document["ledger_after_close"]["reservations"] == []
    text = edge(*args, cwd=tmp_path)
    assert text.returncode == 1 and "latency p50 over 1 request(s)" in text.stdout
    assert "profile written" not in text.stdout
    assert "edge: --profile /dev/full: not written: No space left on device" in text.stderr


def test_without_inputs_a_bundle_of_a_stage_that_keeps_none_gives_its_example_inputs(
        tmp_path: Path) -> None:
    """A loaded stage without a ``bundle`` (the echo worker's, a guide-built backend's)."""
    from edge_core.artifacts import create_manifest

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.bin").write_bytes(b"weights")
    np.savez(bundle / "x.npz", x=np.array([1.0, 2.0, 3.0], np.float32))
    create_manifest(bundle, component="echoed", graph="model.bin", example_inputs="x.npz")
    (tmp_path / "pipeline.toml").write_text(
        'name = "one"\n[[stages]]\nid = "a"\nmanifest = "bundle"\n'
        '[stages.backend]\nname = "echo"\n')
    result = edge("run", "pipeline.toml", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["answer"] == {"x": {"dtype": "float32", "shape": [3]}}
    assert "the example inputs bundled with stage 'a' (x.npz)" in json.dumps(report)
    profiled = edge("profile", "pipeline.toml", "--out", "p.json", "--json", cwd=tmp_path)
    assert profiled.returncode == 0, profiled.stderr
    assert "example_inputs(x.npz)" in (tmp_path / "p.json").read_text()


def test_without_inputs_the_hint_names_the_option_a_pipeline_without_prepare_takes(
        tmp_path: Path) -> None:
    """No ``prepare``: the hint is ``--inputs NPZ`` (``--input FILE`` would be refused)."""
    from edge_core.artifacts import create_manifest

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.bin").write_bytes(b"weights")
    np.savez(bundle / "x.npz", x=np.array([1.0, 2.0, 3.0], np.float32))
    create_manifest(bundle, component="echoed", graph="model.bin", example_inputs="x.npz")
    (tmp_path / "pipeline.toml").write_text(
        'name = "one"\n[[stages]]\nid = "a"\nmanifest = "bundle"\n'
        '[stages.backend]\nname = "echo"\n')
    result = edge("run", "pipeline.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    hint = next(x for x in result.stdout.splitlines() if x.startswith("input: "))
    assert hint == ("input: no --inputs given, so this read the example inputs bundled with "
                    "stage 'a' (x.npz); to give your own tensors (an .npz by input name): "
                    "edge run pipeline.toml --inputs NPZ")
    np.savez(tmp_path / "mine.npz", x=np.array([4.0, 5.0, 6.0], np.float32))
    followed = edge("run", "pipeline.toml", "--inputs", "mine.npz", "--json", cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    assert json.loads(followed.stdout)["input"] == "--inputs mine.npz"
    refused = edge("run", "pipeline.toml", "--input", "mine.npz", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--input: the pipeline names no 'prepare' function" in refused.stderr


def test_without_inputs_or_example_the_refusal_offers_only_what_the_pipeline_takes(
        tmp_path: Path) -> None:
    """No input and no bundled example: the refusal names the options that would be taken.

    Without ``prepare`` it offered ``--input FILE`` too, which is then refused (the
    pipeline names no 'prepare' function); it offers ``--inputs NPZ`` and says why not
    ``--input``. With ``prepare`` both are offered. Each offer, followed, is served.
    """
    from edge_core.artifacts import create_manifest

    from .test_run_process_starts import HOOKED_EDGE

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.bin").write_bytes(b"weights")
    create_manifest(bundle, component="bundle", graph="model.bin")
    stage = 'name = "one"\n[[stages]]\nid = "a"\nmanifest = "bundle"\n' \
            '[stages.backend]\nname = "echo"\n'
    (tmp_path / "pipeline.toml").write_text(stage)
    _refused_before_any_start(
        tmp_path, HOOKED_EDGE, "inputs: give --inputs NPZ (the first stage, 'a', bundles no "
        "example inputs to read instead; --input FILE needs a 'prepare' function, and the "
        "pipeline names none)")
    np.savez(tmp_path / "mine.npz", x=np.array([4.0, 5.0], np.float32))
    logs = {"EDGE_WORKER_LOG_DIR": str(tmp_path / "logs")}  # not a folder left in /tmp
    followed = edge("run", "pipeline.toml", "--inputs", "mine.npz", cwd=tmp_path, env=logs)
    assert followed.returncode == 0, followed.stderr

    (tmp_path / "pipeline.toml").write_text('prepare = "edge_echo.ends:prepare"\n' + stage)
    _refused_before_any_start(
        tmp_path, HOOKED_EDGE, "inputs: give --input FILE or --inputs NPZ (the first stage, "
        "'a', bundles no example inputs to read instead)")
    (tmp_path / "mine.txt").write_text("4 5")
    followed = edge("run", "pipeline.toml", "--input", "mine.txt", cwd=tmp_path, env=logs)
    assert followed.returncode == 0, followed.stderr


def _refused_before_any_start(folder: Path, hooked_edge: str, error: str,
                              *extra: str) -> None:
    """``edge run`` and ``edge profile`` on ``folder``'s pipeline.toml, with and without
    ``--json``: exit 2 with ``error``, no process started, no profile written."""
    env = {**os.environ, "EDGE_PLUGINS": "echo"}
    for argv in (["run", "pipeline.toml"], ["profile", "pipeline.toml", "--out", "p.json"]):
        for as_json in ((), ("--json",)):
            done = subprocess.run([sys.executable, "-c", hooked_edge, *argv, *extra,
                                   *as_json], cwd=folder, env=env, capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 2, (argv, done.stderr)
            starts = next(x for x in done.stderr.splitlines() if x.startswith("STARTS "))
            assert json.loads(starts.removeprefix("STARTS ")) == [], argv  # no process
            assert "worker logs" not in done.stderr, argv
            if as_json:
                body = json.loads(done.stdout)
                assert body["ok"] is False and body["error"] == error, argv
                assert body["plugin_errors"] == [], argv
            else:
                assert f"edge: {error}\n" in done.stderr, argv
    assert not (folder / "p.json").exists()


def test_without_inputs_a_candidate_bundle_without_examples_is_refused_before_any_start(
        tmp_path: Path) -> None:
    """The only candidate of the first stage has its own bundle, without example inputs.

    The check before opening read the stage's manifest (which has some) rather than the
    candidate's own: ``edge run`` loaded the stage, started its worker, and only then
    refused; ``edge profile`` failed its run (exit 1) after the first open. Both refuse
    now (exit 2) with no process started: every candidate's own bundle is read.
    """
    from edge_core.artifacts import create_manifest

    from .test_run_process_starts import HOOKED_EDGE

    for name, examples in (("with", True), ("without", False)):
        bundle = tmp_path / name
        bundle.mkdir()
        (bundle / "model.bin").write_bytes(b"weights")
        np.savez(bundle / "x.npz", x=np.array([1.0, 2.0], np.float32))
        create_manifest(bundle, component=name, graph="model.bin",
                        example_inputs="x.npz" if examples else None)
    (tmp_path / "pipeline.toml").write_text(
        'name = "one"\n[[stages]]\nid = "a"\nmanifest = "with"\n'
        '[[stages.candidates]]\nmanifest = "without"\n'
        '[stages.candidates.backend]\nname = "echo"\n')
    error = ("inputs: give --inputs NPZ (the first stage, 'a', bundles no example inputs "
             "to read instead; --input FILE needs a 'prepare' function, and the pipeline "
             "names none)")
    _refused_before_any_start(tmp_path, HOOKED_EDGE, error)


def test_params_without_inputs_on_a_graph_first_stage_are_refused_before_any_start(
        tmp_path: Path) -> None:
    """``--params '{}'`` without inputs on a first stage whose backend does not generate.

    ``--params`` skipped the early check (a prompt-only generate stage takes no tensors):
    ``edge run`` started the worker and then failed the request (exit 1), ``edge profile``
    did the same. Both refuse now (exit 2) with no process started, naming the inputs.
    """
    from edge_core.artifacts import create_manifest

    from .test_run_process_starts import HOOKED_EDGE

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.bin").write_bytes(b"weights")
    create_manifest(bundle, component="bundle", graph="model.bin")
    (tmp_path / "pipeline.toml").write_text(
        'name = "one"\n[[stages]]\nid = "a"\nmanifest = "bundle"\n'
        '[stages.backend]\nname = "echo"\n')
    error = ("inputs: give --inputs NPZ (the first stage, 'a', bundles no example inputs "
             "to read instead, and --params alone gives no tensors: only a generate stage "
             "runs without them; its backends: echo; --input FILE needs a 'prepare' "
             "function, and the pipeline names none)")
    _refused_before_any_start(tmp_path, HOOKED_EDGE, error, "--params", "{}")
