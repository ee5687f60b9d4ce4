"""Stream measures on samples built by hand: per-token intervals, rates, real time."""

from __future__ import annotations

import pytest

from edge_core.evidence.streams import event_tokens, level_summary, request_measures

MS = 1_000_000  # nanoseconds


def _sample(arrivals_ms: list[float], tokens: list[int], *, submitted_ms: float = 0.0,
            done_ms: float | None = None, durations: list[float | None] | None = None,
            prompt: int | None = 12) -> dict[str, object]:
    durations = durations or [None] * len(arrivals_ms)
    events = [[int(a * MS) - 200_000, int(a * MS), k, d]  # created 0.2 ms before arrival
              for a, k, d in zip(arrivals_ms, tokens, durations, strict=True)]
    done = done_ms if done_ms is not None else arrivals_ms[-1] + 1.0
    return {"submitted_ns": int(submitted_ms * MS), "events": events,
            "done_ns": int(done * MS), "done_created_ns": int(done * MS) - 100_000,
            "prompt_tokens": prompt, "num_tokens": sum(tokens), "stages_s": {"gen": 0.1},
            "total_s": (done - submitted_ms) / 1e3}


def test_a_delta_of_k_tokens_counts_k_intervals_and_rate_times_interval_is_one() -> None:
    # first token at 50 ms; then a delta of 3 tokens 30 ms later, one of 1 token 10 ms later
    measured = request_measures(_sample([50.0, 80.0, 90.0], [2, 3, 1]))
    assert measured["ttft_s"] == pytest.approx(0.050)
    assert measured["tokens"] == 6
    assert measured["decode_tokens"] == 4  # the tokens after the first delta
    assert measured["decode_s"] == pytest.approx(0.040)
    assert measured["intervals_s"] == pytest.approx([0.010, 0.010, 0.010, 0.010])
    rate = measured["decode_tokens"] / measured["decode_s"]
    mean = sum(measured["intervals_s"]) / len(measured["intervals_s"])
    assert rate * mean == pytest.approx(1.0)
    assert measured["prefill_tokens_per_s"] == pytest.approx(12 / 0.050)
    assert measured["tail_s"] == pytest.approx(0.001)
    assert measured["worker_tail_s"] == pytest.approx(0.0011)
    assert measured["delivery_lag_s"] == pytest.approx([0.0002] * 3)


def test_events_without_tokens_do_not_break_the_per_token_identity() -> None:
    # a text-only event (0 tokens) between two token deltas; a trailing empty one
    measured = request_measures(_sample([10.0, 15.0, 30.0, 40.0], [1, 0, 2, 0]))
    assert measured["decode_tokens"] == 2 and measured["decode_s"] == pytest.approx(0.020)
    assert measured["intervals_s"] == pytest.approx([0.010, 0.010])


def test_a_request_with_one_delta_has_no_decode_figures() -> None:
    measured = request_measures(_sample([20.0], [5]))
    assert measured["decode_tokens"] == 0 and measured["intervals_s"] == []
    summary = level_summary([_sample([20.0], [5])])
    assert summary["decode_tokens_per_s"]["pooled"] is None
    assert summary["inter_token_ms"] == {"n": 0}


def test_playback_deficits_rtf_and_first_chunk() -> None:
    # 0.1 s chunks arriving at 100, 150, 350, 370 ms: playback starts at 100 ms; with the
    # second chunk it has media until 300 ms; the third comes at 350 ms (a 50 ms
    # deficit), then it plays until 450 ms and the fourth, at 370 ms, is in time
    measured = request_measures(_sample([100.0, 150.0, 350.0, 370.0], [1, 1, 1, 1],
                                        durations=[0.1, 0.1, 0.1, 0.1]))
    realtime = measured["realtime"]
    assert realtime["first_chunk_s"] == pytest.approx(0.100)
    assert realtime["media_s"] == pytest.approx(0.4)
    assert realtime["deficits"] == 1 and realtime["deficit_s"] == pytest.approx(0.050)
    assert realtime["rtf"] == pytest.approx(0.370 / 0.4)
    assert realtime["chunk_gaps_s"] == pytest.approx([0.05, 0.2, 0.02])


def test_without_a_media_duration_there_are_no_real_time_measures() -> None:
    assert "realtime" not in request_measures(_sample([10.0, 20.0], [1, 1]))


def test_a_level_pools_every_token_and_keeps_counts() -> None:
    samples = [_sample([50.0, 80.0, 90.0], [2, 3, 1]), _sample([40.0, 60.0], [1, 4])]
    summary = level_summary(samples, stage_ids=["gen"])
    assert summary["n"] == 2 and summary["streamed"] == 2
    assert summary["tokens"]["total"] == 11 == summary["tokens"]["reported_total"]
    decode = summary["decode_tokens_per_s"]
    assert decode["n"] == 8  # 4 + 4 decode tokens
    assert decode["pooled"] == pytest.approx(8 / 0.060)
    gaps = summary["inter_token_ms"]
    assert gaps["n"] == 8
    assert decode["pooled"] * gaps["mean_ms"] / 1e3 == pytest.approx(1.0)
    assert summary["ttft_ms"]["n"] == 2
    assert summary["prefill_tokens_per_s"]["pooled"] == pytest.approx(24 / 0.090)
    assert summary["stages"]["gen"]["n"] == 2


def test_event_tokens_counts_ids_else_one_chunk() -> None:
    assert event_tokens({"token_ids": [1, 2, 3]}) == 3
    assert event_tokens({"tokens": 4}) == 4
    assert event_tokens({"text": "a chunk"}) == 1
