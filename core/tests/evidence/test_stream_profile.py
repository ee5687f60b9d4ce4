"""A streamed stage profiled end to end: the speech-shaped measures, with no model behind it.

The echo backend's streaming mode sends chunks at a set rate, each standing for 50 ms of
media: one class streams steadily (faster than real time), the other stalls half a second
mid-stream (playback runs dry). One profile (real workers, a faked sysfs) is shared by
the tests; each checks one part of it against the raw events it came from.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest

from edge_core.evidence.profiling import ProfileSettings, run_profile
from edge_core.evidence.qualify import record_from_profile
from edge_core.evidence.status import Status
from edge_core.evidence.workload_file import read_workload

from .conftest import write_pipeline
from .test_conditions import fake_sysfs

CHUNKS, PER_CHUNK, MEDIA_S = 12, 2, 0.05


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One profile of a streaming echo stage: two classes at concurrency 1 and 2."""
    import numpy as np

    tmp = tmp_path_factory.mktemp("stream")
    np.savez(tmp / "x.npz", x=np.ones((2, 2), dtype=np.float32))
    (tmp / "classes.jsonl").write_text(
        json.dumps({"class": "steady", "params": {}}) + "\n"
        + json.dumps({"class": "stalling",
                      "params": {"stall_after": 3, "stall_s": 0.5, "allocate_mb": 64}}) + "\n")
    stage = {"id": "speak", "resources": {"demands": {"machine:ram": "64 MiB"}},
             "backend": {"name": "echo-preemptible", "options": {
                 "stream_chunks": CHUNKS, "chunk_rate_hz": 50.0,
                 "tokens_per_chunk": PER_CHUNK, "chunk_seconds": MEDIA_S}}}
    path = write_pipeline(tmp, [stage], admission=2, name="speech")
    settings = ProfileSettings(requests=3, warmup_requests=1, concurrency=(1, 2),
                               process_start_repeats=1, matched_requests=2, startup_samples=2,
                               slow_consumer_pause_s=0.3, duration_s=1.5, window_s=0.5,
                               sysfs=str(fake_sysfs(tmp / "sys")))
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGE_PLUGINS", "echo")
    try:
        profile = run_profile(path, npz_files=[str(tmp / "x.npz")],
                              classes=read_workload(tmp / "classes.jsonl"), settings=settings,
                              command=["edge", "profile", str(path)])
    finally:
        mp.undo()
    assert profile["outcome"] == {"ok": True}, profile["outcome"]
    return profile


def _levels(profile: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(g["name"], lvl["concurrency"]): lvl for g in profile["baseline"]["groups"]
            for lvl in g["levels"]}


def test_the_stage_is_seen_to_stream_and_every_class_and_level_is_measured(
        streamed: dict[str, Any]) -> None:
    assert streamed["streamed"] is True
    levels = _levels(streamed)
    assert set(levels) == {("steady", 1), ("steady", 2), ("stalling", 1), ("stalling", 2)}
    for level in levels.values():
        assert level["status"] == "measured" and len(level["samples"]) == 3
        assert level["stream"]["n"] == 3 and level["stream"]["streamed"] == 3


def test_token_counts_and_rates_agree_with_the_raw_events(streamed: dict[str, Any]) -> None:
    for level in _levels(streamed).values():
        decode_tokens = 0
        decode_ns = 0
        intervals: list[float] = []
        for sample in level["samples"]:
            tokens = [event[2] for event in sample["events"]]
            assert sum(tokens) == sample["num_tokens"] == CHUNKS * PER_CHUNK
            arrived = [event[1] for event in sample["events"]]
            assert arrived == sorted(arrived)
            decode_tokens += sum(tokens[1:])
            decode_ns += arrived[-1] - arrived[0]
            intervals += [(b - a) / 1e6 / k for a, b, k in
                          zip(arrived, arrived[1:], tokens[1:], strict=False) for _ in range(k)]
        stream = level["stream"]
        assert stream["tokens"]["total"] == stream["tokens"]["reported_total"] == 3 * 24
        decode = stream["decode_tokens_per_s"]
        assert decode["n"] == decode_tokens == len(intervals)
        assert decode["pooled"] == pytest.approx(decode_tokens / (decode_ns / 1e9), rel=1e-9)
        mean_ms = stream["inter_token_ms"]["mean_ms"]
        assert mean_ms == pytest.approx(sum(intervals) / len(intervals), rel=1e-9)
        assert decode["pooled"] * mean_ms / 1e3 == pytest.approx(1.0, rel=0.01)
        assert stream["prefill_tokens_per_s"]["n"] == 3  # echo reports its prompt size
        assert stream["tail_ms"]["n"] == 3


def test_real_time_measures_tell_a_steady_stream_from_a_stalling_one(
        streamed: dict[str, Any]) -> None:
    levels = _levels(streamed)
    for concurrency in (1, 2):
        steady = levels[("steady", concurrency)]["stream"]["realtime"]
        stalling = levels[("stalling", concurrency)]["stream"]["realtime"]
        assert steady["media_s"] == stalling["media_s"] == pytest.approx(3 * CHUNKS * MEDIA_S)
        assert steady["first_chunk_ms"]["n"] == 3
        # half a second without chunks, with at most ~0.15 s of media buffered, runs dry
        assert stalling["requests_with_deficits"] == 3
        assert stalling["deficit_s"] > 3 * 0.3
        assert steady["deficit_s"] < stalling["deficit_s"]
        assert steady["rtf"]["max"] < stalling["rtf"]["min"]
        assert stalling["rtf"]["min"] > 1.0  # slower than real time: it stalled


def test_a_slow_consumer_sees_the_events_wait_and_none_lost(streamed: dict[str, Any]) -> None:
    slow = streamed["baseline"]["stream_cases"]["slow_consumer"]
    assert slow["pause_s"] == 0.3
    assert slow["complete"] is True and slow["in_order"] is True
    assert slow["tokens"] == slow["reported_tokens"] == CHUNKS * PER_CHUNK
    assert 1 <= slow["buffered_events"] <= CHUNKS - 1
    assert slow["buffered_data_bytes"] > 0
    assert slow["delivery_gaps_ms"]["first_after_pause"] >= 150.0
    assert "no back-pressure" in slow["bound"]["statement"]


def test_cancelling_a_stream_takes_effect_within_the_kits_bound(
        streamed: dict[str, Any]) -> None:
    cancel = streamed["baseline"]["stream_cases"]["cancellation"]
    assert cancel["measured"] is True
    assert cancel["outcome"] == "cancelled-in-place" and cancel["ended"] == "cancelled"
    assert cancel["within_bound"] is True and cancel["bound_ms"] == 1000.0
    assert cancel["cancel_to_end_ms"] >= cancel["cancel_call_ms"] >= 0.0
    assert cancel["events_before_cancel"] >= 1 and cancel["events_after_cancel"] == 0
    assert isinstance(cancel["events_during_cancel"], int)
    assert cancel["next_request"]["served"] is True


def test_memory_is_told_apart_per_tree_segment_and_pool(streamed: dict[str, Any]) -> None:
    memory = streamed["baseline"]["memory"]
    told = memory["told_apart"]
    assert told["separable"] is True  # this kernel lets the owner reset VmHWM
    tree = told["trees"]["speak"]
    assert tree["loading_peak_bytes"] > 0
    assert tree["runtime_peak_bytes"] >= 64 * 2**20  # the stalling requests' 64 MiB
    segments = {s["segment"]: s for s in told["segments"]}
    assert set(segments) == {"steady@c1", "steady@c2", "stalling@c1", "stalling@c2"}
    for segment in segments.values():
        assert set(segment["growth_bytes"]) == {"speak"}
        assert segment["peak_bytes"]["speak"] > 0
    assert segments["stalling@c1"]["peak_bytes"]["speak"] > (
        segments["steady@c1"]["peak_bytes"]["speak"])
    sampled = memory["sampled"]
    assert sampled["samples"] > 10 and sampled["peak_of_sum_bytes"] >= 64 * 2**20
    pool = memory["pools"]["speak"]["machine:ram"]
    assert pool["observation"] == "observed"
    assert pool["demand_bytes"] == 64 * 2**20
    assert pool["loading_over_demand"] is False and pool["runtime_over_demand"] is True


def test_the_profile_names_its_operating_conditions(streamed: dict[str, Any]) -> None:
    found = streamed["conditions"]
    labels = [shot["label"] for shot in found["snapshots"]]
    assert labels[0] == "before" and labels[-1] == "after"
    assert "steady@c1 start" in labels and "stalling@c2 end" in labels
    summary = found["summary"]
    assert summary["frequency"]["source"] == "sysfs"
    assert summary["frequency"]["changed"] is False
    assert summary["frequency"]["governors"] == ["powersave"]
    assert summary["temperature_c"]["hottest_max_c"] == 61.5
    assert summary["power"]["before"]["source"] == "battery"
    assert summary["power"]["before"]["mode"] == "low-power"
    assert len(summary["load_average"]["before"]) == 3
    assert found["compiled_cache"] == {"speak": "none"}


def test_runs_alternate_and_the_tracer_overhead_is_stated(streamed: dict[str, Any]) -> None:
    runs = streamed["instrumentation"]
    assert runs["sequence"] == ["untraced", "traced", "untraced", "traced", "untraced"]
    for figure in ("open_s", "first_output_s", "matched_p50_ms"):
        assert len(runs[figure]["traced"]) == 2 and len(runs[figure]["untraced"]) == 3
        assert isinstance(runs[figure]["overhead"], float)
        assert isinstance(runs[figure]["order_effect"], float)
    assert runs["matched_requests"] == 2
    first = streamed["runs"][0]
    assert first["role"] == "untraced" and first["warm_restart"]["instrumented"] is False
    assert streamed["traced"]["warm_restart"]["instrumented"] is True
    matched = first["matched"]["samples"]
    assert all(s["events"] == CHUNKS and s["first_event_s"] < s["total_s"] for s in matched)
    phases = streamed["startup"]["phases"]["speak"]  # --startup-samples 2: two of each
    assert len(phases["worker_start_s"]["samples"]) == 2
    assert phases["worker_start_s"]["median"] > 0
    by_cache = streamed["startup"]["by_cache"]["speak"]["none"]
    assert len(by_cache["open_s"]) == 5 and len(by_cache["load_s"]) == 2  # every run; traced


def test_the_profile_carries_the_runtime_identity_and_inventories(
        streamed: dict[str, Any]) -> None:
    identity = streamed["identity"]
    assert re.fullmatch(r"[0-9a-f]{64}", identity["digest"])
    backend = identity["runtime"]["backends"]["echo-preemptible"]
    assert backend["distribution"] == "edge-echo" and backend["available"] is True
    assert "edge-core" in identity["controller_packages"]["packages"]
    assert identity["source"]["vcs"] == "git"  # the tests run from the checkout
    assert identity["route_packages"] == {}  # the stage runs on the controller's Python


def test_a_sustained_run_gives_windows_and_trends(streamed: dict[str, Any]) -> None:
    run = streamed["baseline"]["sustained"]
    assert run["concurrency"] == 2  # the highest admitted level
    assert len(run["windows"]) == 3 and run["requests"] >= 2
    assert sum(w["requests"] for w in run["windows"]) + run["completed_after_end"] == (
        run["requests"])
    for window in run["windows"]:
        assert window["worker_rss_bytes"] > 0
        assert window["mean_mhz"] == 2100.0 and window["hottest_c"] == 61.5
    assert set(run["trend"]) >= {"p50_ms", "p95_ms", "worker_rss_bytes", "mean_mhz",
                                 "hottest_c", "ttft_p95_ms"}
    assert run["trend"]["mean_mhz"]["per_10min"] == 0.0  # three windows, flat


def test_the_record_keeps_streams_cases_memory_and_conditions(
        streamed: dict[str, Any]) -> None:
    from edge_core.evidence.html_report import render_html
    from edge_core.evidence.markdown_report import render_markdown
    from edge_core.evidence.matrix import build_matrix

    record = record_from_profile(streamed, targets=["rtf_max <= 100", "cancel_ms <= 1000"],
                                 targets_origin="test")
    assert record.status is Status.PROFILE_ONLY  # echo has no reference to compare with
    assert record.verdicts["functional"]["verdict"] == "unjudged"
    assert record.verdicts["reliability"]["verdict"] == "met"
    performance = record.verdicts["performance"]
    assert performance["verdict"] == "unjudged"  # 3 requests per level, below the 20
    assert [t["outcome"] for t in performance["targets"]] == ["met", "met"]
    assert set(record.performance["streams"]) == {"steady@c1", "steady@c2", "stalling@c1",
                                                  "stalling@c2"}
    assert "sample" not in record.performance["stream_cases"]["slow_consumer"]
    assert any("runtime peak over the declared demand: stage speak machine:ram" in note
               for note in record.notes)
    assert record.conditions["summary"]["temperature_c"]["hottest_max_c"] == 61.5
    assert record.identity["digest"] == streamed["identity"]["digest"]
    text = render_markdown(build_matrix([(record, "r.json")]))
    assert "TTFT p50 " in text and "| steady@c1 | 3 |" in text
    assert "OVER DEMAND" in text and "| temperature |" in text
    assert "| cancellation | cancelled-in-place, cancelled: acknowledged in " in text
    during = streamed["baseline"]["stream_cases"]["cancellation"]["events_during_cancel"]
    assert (f"; {during} event(s) during the cancel, 0 event(s) after the cancel |"
            in text)
    # a record made before events_during_cancel was counted prints its count alone
    cases = record.performance["stream_cases"]
    older = attrs.evolve(record, performance={**record.performance, "stream_cases": {
        **cases, "cancellation": {k: v for k, v in cases["cancellation"].items()
                                  if k != "events_during_cancel"}}})
    older_text = render_markdown(build_matrix([(older, "r.json")]))
    assert "during the cancel" not in older_text
    assert "); 0 event(s) after the cancel |" in older_text
    assert "| slow consumer | paused 0.3 s: " in text
    page = render_html(build_matrix([(record, "r.json")]))
    assert page.count("<svg") == 1  # the TTFT samples (no graph latencies here)
