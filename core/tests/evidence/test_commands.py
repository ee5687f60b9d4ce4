"""`edge profile`, `edge qualify` and `edge matrix` as a user runs them (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .conftest import echo_stage, write_pipeline

QUICK = ["--requests", "3", "--warmup", "1", "--concurrency", "1,2", "--process-starts", "1"]


def edge(*args: str, cwd: Path,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `edge` command line in a child interpreter."""
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def test_profile_qualify_matrix_from_a_working_pipeline(tmp_path: Path,
                                                        echo_inputs: Path) -> None:
    pipeline = write_pipeline(tmp_path, [echo_stage("a")], admission=2, name="echoes")
    profiled = edge("profile", str(pipeline), "--inputs", str(echo_inputs), *QUICK,
                    "--out", "out/p.json", cwd=tmp_path,
                    env={**os.environ, "EDGE_PROGRESS": "1"})
    assert profiled.returncode == 0, profiled.stderr
    assert "100% 7 requests/7 requests" in profiled.stderr  # the progress bar
    assert "x.npz @ concurrency 2: p50" in profiled.stdout
    assert "profile written to out/p.json" in profiled.stdout
    profile = json.loads((tmp_path / "out" / "p.json").read_text())
    assert profile["command"]["argv"][:3] == ["edge", "profile", str(pipeline)]
    assert "--concurrency" in profile["command"]["argv"]

    qualified = edge("qualify", "--profile", "out/p.json", "--device", "test-host",
                     "--json", cwd=tmp_path)
    assert qualified.returncode == 0, qualified.stderr
    answer = _json(qualified)
    # echo's numerical check is its own (no bundle): a profile, not complete-model evidence
    assert answer["status"] == "PROFILE_ONLY"
    assert answer["cell"] == ["test-host", "echoes", "echo / numpy"]
    record_path = tmp_path / answer["record"]
    assert record_path.parent.name == "qualification"

    matrix = edge("matrix", "qualification", "--out-dir", "report", "--json", cwd=tmp_path)
    assert matrix.returncode == 0, matrix.stderr
    summary = _json(matrix)
    assert summary["cells"] == 1 and summary["counts"]["PROFILE_ONLY"] == 1
    page = (tmp_path / "report" / "matrix.html").read_text()
    assert f'href="../qualification/{record_path.name}"' in page
    assert "](../qualification/" in (tmp_path / "report" / "matrix.md").read_text()


def test_a_failing_pipeline_exits_1_and_still_writes_a_profile(tmp_path: Path,
                                                               echo_inputs: Path) -> None:
    pipeline = write_pipeline(tmp_path, [echo_stage("a", fail_at="warmup")])
    result = edge("profile", str(pipeline), "--inputs", str(echo_inputs), *QUICK,
                  "--out", "p.json", cwd=tmp_path)
    assert result.returncode == 1
    assert "FAILED at open: RemoteError" in result.stdout
    qualified = edge("qualify", "--profile", "p.json", "--out", "r.json", cwd=tmp_path)
    assert qualified.returncode == 0
    assert qualified.stdout.startswith("FAILED: ")
    assert "failing layer: runtime" in qualified.stdout
    assert "next step:" in qualified.stdout


def test_a_hub_job_record_becomes_a_record(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps({
        "status": "success", "device": "Galaxy S24", "model": "detect",
        "job_ids": {"profile": "jp"}, "inference_time_ms": 2.5}))
    result = edge("qualify", "--hub-job", "job.json", "--out", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PROFILE_ONLY: detect x Galaxy S24")
    assert json.loads((tmp_path / "r.json").read_text())["source"]["job_ids"] == {"profile": "jp"}


def test_unreadable_or_invalid_inputs_are_usage_errors_naming_the_problem(
        tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "job.json").write_text(json.dumps({"status": "success"}))
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))
    bad = edge("qualify", "--profile", "bad.json", cwd=tmp_path)
    assert bad.returncode == 2 and "bad.json: cannot read JSON" in bad.stderr
    job = edge("qualify", "--hub-job", "job.json", cwd=tmp_path)
    assert job.returncode == 2
    assert job.stderr == ("edge: job.json: device: must be a name or an object with a "
                          "name: None\n")  # the field, with the file it is in
    record = edge("qualify", "--profile", "other.json", "--json", cwd=tmp_path)
    assert record.returncode == 2
    assert json.loads(record.stdout)["error"].startswith("other.json: schema: must be one of")
    other = edge("matrix", "other.json", cwd=tmp_path)
    assert other.returncode == 2
    assert ("other.json: schema: must be one of ['edge.qualification/1', "
            "'edge.qualification/2']") in other.stderr
    levels = edge("profile", "p.toml", "--concurrency", "0", cwd=tmp_path)
    assert levels.returncode == 2 and "--concurrency: levels must be >= 1" in levels.stderr
    requests = edge("profile", "p.toml", "--requests", "0", cwd=tmp_path)
    assert requests.returncode == 2
    assert "argument --requests: must be at least 1: '0'" in requests.stderr


def test_profile_a_streamed_stage_with_a_workload_and_targets(tmp_path: Path,
                                                              echo_inputs: Path) -> None:
    stage = {"id": "s", "backend": {"name": "echo-preemptible", "options": {
        "stream_chunks": 4, "chunk_rate_hz": 100.0, "tokens_per_chunk": 3}}}
    pipeline = write_pipeline(tmp_path, [stage], admission=2, name="streams")
    (tmp_path / "w.jsonl").write_text('{"class": "short", "params": {"stream_chunks": 2}}\n'
                                      '{"class": "long", "params": {}}\n')
    (tmp_path / "t.toml").write_text('targets = ["ttft_p95_ms <= 60000"]\n')
    profiled = edge("profile", str(pipeline), "--inputs", str(echo_inputs), "--workload",
                    "w.jsonl", "--targets", "t.toml", "--requests", "2", "--warmup", "0",
                    "--concurrency", "1,2", "--process-starts", "1", "--matched-requests",
                    "1", "--no-warm-restart", "--slow-consumer-pause", "0.1", "--out",
                    "p.json", "--json", cwd=tmp_path)
    assert profiled.returncode == 0, profiled.stderr
    answer = _json(profiled)
    assert answer["streamed"] is True
    for name, tokens in (("short", 6), ("long", 12)):
        for level in ("c1", "c2"):
            row = answer["streams"][name][level]
            assert row["n"] == 2 and row["errors"] == 0
            assert row["ttft_ms"]["n"] == 2
            assert row["inter_token_ms"]["n"] == 2 * (tokens - 3)  # after the first delta
            assert row["decode_tokens_per_s"]["n"] == 2 * (tokens - 3)
            assert row["prefill_tokens_per_s"]["n"] == 2
            assert row["tokens"]["total"] == 2 * tokens
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["targets"] == ["ttft_p95_ms <= 60000"]
    argv = profile["command"]["argv"]
    assert argv[argv.index("--workload") + 1] == "w.jsonl" and "--targets" in argv
    qualified = edge("qualify", "--profile", "p.json", "--out", "r.json", cwd=tmp_path)
    assert qualified.returncode == 0, qualified.stderr
    assert "performance: unjudged (fewer than the protocol's 20 requests" in qualified.stdout


def test_edge_run_flags_a_peak_over_the_declared_demand_in_its_plan(
        tmp_path: Path, echo_inputs: Path) -> None:
    stage = {**echo_stage("a"), "resources": {"demands": {"machine:ram": "96 MiB"}}}
    pipeline = write_pipeline(tmp_path, [stage], name="mem")
    within = edge("run", str(pipeline), "--inputs", str(echo_inputs), "--json", cwd=tmp_path)
    assert within.returncode == 0, within.stderr
    (plan_stage,) = _json(within)["plan"]["stages"]
    row = plan_stage["memory_after_requests"]["machine:ram"]
    assert row["demand_bytes"] == 96 * 2**20 and row["over_demand"] is False
    assert 0 < row["observed_peak_bytes"] < 96 * 2**20
    over = edge("run", str(pipeline), "--inputs", str(echo_inputs), "--params",
                '{"allocate_mb": 128}', cwd=tmp_path)
    assert over.returncode == 0, over.stderr
    assert "memory: machine:ram peak " in over.stdout
    assert "after the requests is over the declared demand 96 MiB" in over.stdout


def test_profile_and_qualification_records_carry_a_peak_over_the_declared_demand(
        tmp_path: Path, echo_inputs: Path) -> None:
    """The evidence record (issue 32): the profile's stage check, the record's ratio."""
    stage = {**echo_stage("a"), "resources": {"demands": {"machine:ram": "96 MiB"}}}
    pipeline = write_pipeline(tmp_path, [stage], name="mem")
    profiled = edge("profile", str(pipeline), "--inputs", str(echo_inputs), "--params",
                    '{"allocate_mb": 128}', "--requests", "2", "--warmup", "0",
                    "--concurrency", "1", "--process-starts", "1", "--startup-samples", "0",
                    "--matched-requests", "1", "--no-warm-restart", "--out", "p.json",
                    cwd=tmp_path)
    assert profiled.returncode == 0, profiled.stderr
    profile = json.loads((tmp_path / "p.json").read_text())
    check = profile["baseline"]["memory"]["stages"]["a"]["demand_check"]
    ram = check["pools"]["machine:ram"]
    assert check["over_demand"] is True and ram["verdict"] == "over"
    assert ram["demand_bytes"] == 96 * 2**20 and ram["peak_bytes"] > 96 * 2**20 + 64 * 2**20
    assert ram["peak_over_demand"] == round(ram["peak_bytes"] / (96 * 2**20), 3) > 1.0
    qualified = edge("qualify", "--profile", "p.json", "--out", "r.json", cwd=tmp_path)
    assert qualified.returncode == 0, qualified.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    found = record["performance"]["memory"]["a"]
    assert found["over_demand"] is True
    assert found["peak_over_demand"] == {"machine:ram": ram["peak_over_demand"]}
    assert found["reserved"] == {"machine:ram": 96 * 2**20}


def test_bad_workloads_targets_and_params_are_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "w.jsonl").write_text('{"class": "a", "prompt": "x"}\n{"prompt": "y"}\n')
    (tmp_path / "t.toml").write_text('targets = ["ttft_p95 <= 1"]\n')
    cases = [
        (["profile", "p.toml", "--workload", "w.jsonl"],
         "workload:2.class: must be a non-empty printable string"),
        (["profile", "p.toml", "--targets", "t.toml"], "unknown metric 'ttft_p95'"),
        (["profile", "p.toml", "--params", "{nope"], "--params: not JSON"),
        (["profile", "p.toml", "--params", "[1]"], "--params: must be a JSON object"),
        (["profile", "p.toml", "--params", "{}", "--workload", "w.jsonl"],
         "give --workload or --params, not both"),
        (["profile", "p.toml", "--duration", "0"], "not a positive duration"),
        # a window longer than the run was one window with no trend; without a run, ignored
        (["profile", "p.toml", "--duration", "30s", "--window", "1m"],
         "--window 60s: longer than --duration 30s (the run would be one window, "
         "with no trend)"),
        (["profile", "p.toml", "--window", "10s"],
         "--window 10s: only with --duration (it divides the sustained run)"),
        (["profile", "p.toml", "--startup-samples", "-1"],
         "argument --startup-samples: must be at least 0: '-1'"),
        (["qualify", "--profile", "p.json", "--targets", "t.toml"], "unknown metric"),
    ]
    (tmp_path / "p.json").write_text("{}")
    for name in ("latin.toml", "latin.jsonl", "latin.json"):  # 0xe9, 'é' as latin-1 writes it
        (tmp_path / name).write_bytes(b'{"x": "caf\xe9"}\n')
    not_utf8 = "not valid UTF-8 (byte 10: invalid continuation byte)"
    cases += [
        (["profile", "p.toml", "--targets", "latin.toml"], f"latin.toml: {not_utf8}"),
        (["profile", "p.toml", "--workload", "latin.jsonl"], f"{not_utf8}: 'latin.jsonl'"),
        (["qualify", "--profile", "p.json", "--targets", "latin.toml"],
         f"latin.toml: {not_utf8}"),
        (["qualify", "--profile", "latin.json"], f"latin.json: {not_utf8}"),
        (["matrix", "latin.json"], f"latin.json: {not_utf8}"),
    ]
    for args, message in cases:
        result = edge(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)


def _probes(result: subprocess.CompletedProcess[str]) -> int:
    """How many times the echo plugin's edge_probe ran (EDGE_TRACE_HOOKS traces each call)."""
    return sum(1 for line in result.stderr.splitlines()
               if line.startswith("[edge-trace] edge_probe@echo("))


def test_edge_profile_asks_each_probe_once_per_open_and_records_those_answers(
        tmp_path: Path, echo_inputs: Path) -> None:
    # Before, the pool check before the runs probed, and after them the profile's probe
    # reports and runtime identity asked twice more: 4 probes for one open, 5 for three.
    pipeline = write_pipeline(tmp_path, [echo_stage("a")])
    env = {**os.environ, "EDGE_TRACE_HOOKS": "1"}
    for samples, opens in (("0", 1), ("1", 3)):  # untraced (baseline) / + traced, untraced
        profiled = edge("profile", str(pipeline), "--inputs", str(echo_inputs), *QUICK,
                        "--startup-samples", samples, "--out", f"p{samples}.json",
                        cwd=tmp_path, env=env)
        assert profiled.returncode == 0, profiled.stderr
        assert _probes(profiled) == opens, profiled.stderr  # each open's own, no other
        profile = json.loads((tmp_path / f"p{samples}.json").read_text())
        assert [row["backend"] for row in profile["probes"]] == ["echo"]
        assert profile["probes"][0]["available"] is True
        assert profile["identity"]["runtime"]["backends"]["echo"]["available"] is True
    # a pool the host does not have: the check asks the backends before anything opens
    demanding = write_pipeline(tmp_path, [{**echo_stage("a"), "resources": {
        "demands": {"machine:vram:0": "1 MiB"}}}], name="vram")
    refused = edge("profile", str(demanding), "--inputs", str(echo_inputs), *QUICK,
                   "--out", "v.json", cwd=tmp_path, env=env)
    assert refused.returncode == 2, refused.stderr
    assert ('stages[0].resources.demands["machine:vram:0"] (stage \'a\'): unknown pool'
            in refused.stderr)
    assert _probes(refused) == 1 and not (tmp_path / "v.json").exists()
