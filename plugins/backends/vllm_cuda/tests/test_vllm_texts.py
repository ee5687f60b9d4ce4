"""Generated texts travel as output tensors, and the stage puts them back into the DONE.

An event's header, its data included, must fit the worker channel's ``max_header_bytes``
(64 KiB); a DONE carrying every choice's text in its data failed its request
(``EventTooLarge``) once ``n`` choices of ``max_tokens`` were long enough. The worker now
sends the texts as ``text_utf8`` (uint8) and ``text_lengths`` (int64) outputs
(:mod:`edge_vllm_cuda.texts`), and :func:`edge_vllm_cuda.stage.restore_texts` gives the
DONE its ``text`` and ``choices[i].text`` back, without those outputs.

Without an engine: the encoding, the rebuilt data, the worker memory handed on, and the
refusals of outputs that do not describe the choices. On the real vLLM CPU engine: 128
choices whose texts are far over 64 KiB come back whole, each equal to its streamed
tokens' text.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from vllm_pipelines import opened

from edge_contracts.buffers import BufferDescriptor
from edge_contracts.requests import EventKind, StageEvent
from edge_core.runtime.errors import RequestFailed
from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.results import ResultOutputs
from edge_core.stage import RetainedOutputs
from edge_vllm_cuda.stage import restore_texts
from edge_vllm_cuda.texts import (
    TEXT_BYTES,
    TEXT_LENGTHS,
    TextsMalformed,
    decode_texts,
    encode_texts,
    with_texts,
)

#: The worker channel's header limit (``Limits.max_header_bytes``' default).
HEADER_LIMIT = 65536
#: The keys of the DONE's data, in the order users always got them.
DONE_KEYS = ["finish_reason", "text", "num_tokens", "prompt_tokens", "choices",
             "prompt_sha256", "engine_unfinished"]
CHOICE_KEYS = ["index", "finish_reason", "text", "num_tokens"]

TEXTS = ["edge stage", "", "é ü \u2013 日本 \ufffd", "x" * 300]


def _worker_data(count: int) -> dict[str, Any]:
    """A DONE's data as the worker sends it: no text anywhere."""
    return {"finish_reason": "length", "num_tokens": 2 * count, "prompt_tokens": 3,
            "choices": [{"index": i, "finish_reason": "length" if i else "stop",
                         "num_tokens": 2} for i in range(count)],
            "prompt_sha256": "ab" * 32, "engine_unfinished": 0}


def _event(kind: EventKind, outputs: Mapping[str, np.ndarray], data: Mapping[str, Any],
           seq: int = 0) -> StageEvent:
    descriptors = tuple(BufferDescriptor.for_shape("w", 1, str(a.dtype), a.shape)
                        for a in outputs.values())
    return StageEvent("r1", "gen", 0, 1, seq, kind, kind is EventKind.DONE,
                      outputs=descriptors, data=data)


class Releases:
    """A stand-in for a retention's ``release``: counts its calls, no view still alive."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return False


def _done_outputs(texts: list[str]) -> dict[str, np.ndarray]:
    ids = np.arange(2 * len(texts), dtype=np.int64)
    outputs = {"token_ids": ids, "choice_lengths": np.full(len(texts), 2, dtype=np.int64)}
    outputs.update(encode_texts(texts))
    return outputs


def test_texts_round_trip_as_utf8_bytes_and_lengths_in_choice_order() -> None:
    outputs = encode_texts(TEXTS)
    assert list(outputs) == [TEXT_BYTES, TEXT_LENGTHS]
    assert outputs[TEXT_BYTES].dtype == np.uint8 and outputs[TEXT_LENGTHS].dtype == np.int64
    assert outputs[TEXT_BYTES].tobytes() == "".join(TEXTS).encode("utf-8")
    assert outputs[TEXT_LENGTHS].tolist() == [len(t.encode("utf-8")) for t in TEXTS]
    assert decode_texts(outputs, len(TEXTS)) == TEXTS
    assert decode_texts(encode_texts([""]), 1) == [""]  # no bytes at all


def test_the_data_gets_text_and_each_choices_text_back_where_they_always_were() -> None:
    rebuilt = with_texts(_worker_data(len(TEXTS)), TEXTS)
    assert list(rebuilt) == DONE_KEYS
    assert rebuilt["text"] == TEXTS[0]
    assert [list(choice) for choice in rebuilt["choices"]] == [CHOICE_KEYS] * len(TEXTS)
    assert [choice["text"] for choice in rebuilt["choices"]] == TEXTS
    assert [choice["finish_reason"] for choice in rebuilt["choices"]] == [
        "stop", "length", "length", "length"]


@pytest.mark.parametrize(("outputs", "count", "field", "reason"), [
    ({TEXT_BYTES: np.zeros(3, np.uint8)}, 1, "outputs.text_lengths", "missing"),
    ({TEXT_BYTES: np.zeros(3, np.int8), TEXT_LENGTHS: np.array([3])}, 1,
     "outputs.text_utf8", "1-D uint8"),
    ({TEXT_BYTES: np.zeros(3, np.uint8), TEXT_LENGTHS: np.array([[3]])}, 1,
     "outputs.text_lengths", "1-D int64"),
    ({TEXT_BYTES: np.zeros(3, np.uint8), TEXT_LENGTHS: np.array([1, 2])}, 3,
     "outputs.text_lengths", "one length per choice (3)"),
    ({TEXT_BYTES: np.zeros(3, np.uint8), TEXT_LENGTHS: np.array([1, 1])}, 2,
     "outputs.text_lengths", "adding up to the 3 bytes"),
    ({TEXT_BYTES: np.zeros(3, np.uint8), TEXT_LENGTHS: np.array([4, -1])}, 2,
     "outputs.text_lengths", "adding up to the 3 bytes"),
    ({TEXT_BYTES: np.frombuffer(b"ok\xff", np.uint8), TEXT_LENGTHS: np.array([2, 1])}, 2,
     "outputs.text_utf8", "choice 1's text is not UTF-8"),
])
def test_text_outputs_that_do_not_describe_the_choices_are_refused_naming_the_field(
        outputs: dict[str, np.ndarray], count: int, field: str, reason: str) -> None:
    with pytest.raises(TextsMalformed) as raised:
        decode_texts(outputs, count)
    assert raised.value.field == field and reason in raised.value.reason


def test_data_whose_choices_are_not_one_per_text_is_refused() -> None:
    with pytest.raises(TextsMalformed) as raised:
        with_texts(_worker_data(2), ["a", "b", "c"])
    assert raised.value.field == "data.choices" and raised.value.value == 2
    with pytest.raises(TextsMalformed):
        with_texts({"finish_reason": "stop"}, ["a"])


def test_the_stage_yields_the_done_with_its_texts_and_without_their_outputs() -> None:
    token = _event(EventKind.TOKEN, {}, {"choice": 0, "index": 0, "token_ids": [1],
                                         "text": "edge"})
    outputs = _done_outputs(TEXTS)
    done = _event(EventKind.DONE, outputs, _worker_data(len(TEXTS)), seq=1)
    released = Releases()
    retained = RetainedOutputs(outputs, released)
    del outputs
    closed: list[bool] = []

    def worker_events() -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        try:
            yield token, {}
            yield done, retained
        finally:
            closed.append(True)

    events = list(restore_texts(worker_events()))
    assert events[0] == (token, {})  # a token event passes as it is
    event, tensors = events[1]
    assert event.kind is EventKind.DONE and (event.seq, event.request_id) == (1, "r1")
    assert list(event.data) == DONE_KEYS and event.data["text"] == TEXTS[0]
    assert [choice["text"] for choice in event.data["choices"]] == TEXTS
    assert list(tensors) == ["token_ids", "choice_lengths"]
    assert [d.dtype.value for d in event.outputs] == ["int64", "int64"]
    assert [d.shape for d in event.outputs] == [(8,), (4,)]
    # still views of worker memory: the runtime gives them back with the same release
    assert isinstance(tensors, RetainedOutputs) and tensors.release is retained.release
    assert tensors["token_ids"] is retained["token_ids"]
    assert released.calls == 0 and closed == [True]


def test_a_done_whose_text_outputs_are_malformed_fails_its_request_and_gives_memory_back(
        ) -> None:
    outputs = _done_outputs(["a", "b"])
    outputs[TEXT_LENGTHS] = np.array([1, 5], dtype=np.int64)
    done = _event(EventKind.DONE, outputs, _worker_data(2))
    released = Releases()
    retained = RetainedOutputs(outputs, released)
    del outputs
    events = restore_texts(iter([(done, retained)]))
    del retained
    with pytest.raises(RequestFailed) as raised:
        next(events)
    assert raised.value.error_type == "TextsMalformed" and raised.value.request_id == "r1"
    assert "outputs.text_lengths: must be lengths adding up to the 2 bytes of text_utf8" in (
        raised.value.error_message)
    assert released.calls == 1


def test_a_done_without_text_outputs_and_other_events_pass_untouched() -> None:
    plain = {"token_ids": np.arange(3, dtype=np.int64)}
    done = _event(EventKind.DONE, plain, {"finish_reason": "stop", "text": "kept"})
    ((event, tensors),) = list(restore_texts(iter([(done, plain)])))
    assert event is done and tensors is plain


# -- on the real engine -----------------------------------------------------------------


@pytest.fixture
def wide(pipeline_file: Any) -> Iterator[Pipeline]:
    """A vllm-cuda stage that runs 128 sequences at once in a context of 512 tokens.

    Opened and closed around its one test, so that the leak check sees it all gone: the
    controller keeps the worker's output segments mapped while the stage lives.
    """
    with opened(pipeline_file("wide", max_model_len=512, max_num_seqs=128)) as pipeline:
        yield pipeline


@pytest.mark.vllm
@pytest.mark.slow
def test_128_choices_whose_texts_are_far_over_the_header_limit_all_come_back(
        wide: Pipeline) -> None:
    """Before the texts travelled as tensors this request failed with EventTooLarge (its
    DONE's header would have been about 200 KB)."""
    choices, tokens = 128, 480
    params = {"prompts": ["edge stage token", "worker engine stream"], "n": choices // 2,
              "max_tokens": tokens, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    pending = wide.stage("gen").submit({}, params=params)
    streamed: list[list[str]] = [[] for _ in range(choices)]
    ids: list[list[int]] = [[] for _ in range(choices)]
    for event, _ in pending.events():
        streamed[event.data["choice"]].append(event.data["text"])
        ids[event.data["choice"]].extend(event.data["token_ids"])
    result = pending.result()
    try:
        texts = ["".join(pieces) for pieces in streamed]
        size = sum(len(text.encode("utf-8")) for text in texts)
        assert size > 1.5 * HEADER_LIMIT, size  # far over what a header may hold
        assert any(ord(c) > 127 for text in texts for c in text)  # multi-byte UTF-8 too
        final = result.events[-1]
        assert final.kind is EventKind.DONE
        assert list(final.data) == DONE_KEYS
        assert final.data["text"] == texts[0]
        assert [list(choice) for choice in final.data["choices"]] == [CHOICE_KEYS] * choices
        assert [choice["text"] for choice in final.data["choices"]] == texts
        assert [choice["index"] for choice in final.data["choices"]] == list(range(choices))
        assert [choice["num_tokens"] for choice in final.data["choices"]] == [tokens] * choices
        assert final.data["num_tokens"] == choices * tokens
        assert sorted(result.outputs) == ["choice_lengths", "token_ids"]
        assert len(final.outputs) == 2
        assert result.outputs["choice_lengths"].tolist() == [tokens] * choices
        assert result.outputs["token_ids"].tolist() == [i for c in ids for i in c]
        # token_ids came as a view of the worker's memory (its 480 KB went through shared
        # memory), handed on with its release: acknowledged with no view left alive
        assert isinstance(result.outputs, ResultOutputs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result.ack()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught
    finally:
        result.ack()  # a no-op once acknowledged
