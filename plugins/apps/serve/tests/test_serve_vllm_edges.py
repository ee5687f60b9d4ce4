"""``edge serve`` at its edges, through both official OpenAI clients, on the real vLLM engine.

One server (:mod:`generate_server`) holds the OCR page pipeline, ``tiny`` (the tiny Llama
on vLLM's CPU engine, context 256) and ``page-chat`` (OCR, then the same model). The
Python ``openai`` client and the Node ``openai`` package (:mod:`clients`; its half is
skipped, with the reason, where ``node`` or the registry is missing) run the same cases:

* every refusal — the context (prompt, ``max_tokens``, their sum), bad sampling values, a
  token outside the vocabulary, fields that are not served, an unknown model, a wrong key,
  a body over the limit, a passed deadline — is its 4xx (504 for the deadline) with
  OpenAI's body: the SDK's class, ``status``, ``param`` and ``code`` are checked, and the
  server's request count shows that neither client (left to its default of 2 retries)
  sent any of them twice; a request over the context is refused so (checked before
  admission) even while all of ``tiny``'s admission slots are held by running streams;
* every sampling feature vLLM has — ``n``, ``logprobs`` / ``top_logprobs``, penalties,
  ``response_format`` (``json_object``, ``json_schema``), several prompts — gives the same
  choices streamed and whole, from both clients;
* a stream cut by its deadline, by its stage's worker dying (the stage fails and
  restarts: ``page-chat``'s generate stage has ``restart = "on-failure"``), and by the end
  of the server's grace period ends with an SSE error event in OpenAI's shape that both
  clients raise as ``APIError`` with its code, and the response ends cleanly; the
  restarted stage (a new worker and engine, generation 2) streams again;
* the server's log has no traceback, and its closing summary lists every stage's retire
  time, the generate stages' within the documented bound.

The tests run in file order: the worker-lost test comes before the sampling features so
that ``page-chat``'s restart (a vLLM engine loading) overlaps them; the restart test waits
for it; the last test stops the server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from clients import NodeRun, node_openai, run_node, run_python
from generate_server import (
    API_KEY,
    GRACE_S,
    MAX_MODEL_LEN,
    SharedServer,
    engine_unfinished,
    engine_unfinished_after_abort,
)
from prometheus_client.parser import text_string_to_metric_families
from serving import Served

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: A generate stage's retirement is bounded by its declared window plus the retire
#: deadline (``VllmStage.retire_graceful_s`` + 5 s = 10 + 3 + 5 s with the default
#: ``engine_stop_s``): docs/serve.md states it.
GENERATE_RETIRE_BOUND_S = 18.0

CHAT = [{"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "edge stage token worker"}]
GREEDY = {"temperature": 0.0, "ignore_eos": True}
#: The routes a client's generation requests are counted under ("other": refused before
#: routing, as a request without the right key is).
ROUTES = ("/v1/completions", "/v1/chat/completions", "other")


@pytest.fixture(scope="module")
def server(generate_server: SharedServer) -> Served:
    """The shared server: ``ocr``, ``tiny`` and ``page-chat``."""
    return generate_server.get()


@pytest.fixture
def client(server: Served) -> Iterator[openai.OpenAI]:
    """The Python client as a user makes it: default retries (2) and all."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=300) as made:
        yield made


def _node_or_none() -> Path | None:
    """The Node client's package directory, or None (the Node half is then skipped)."""
    return node_openai()[0]


def _requests(server: Served) -> float:
    """Requests the server has counted on the OpenAI generation routes, every outcome."""
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"},
                     timeout=60).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "edge_requests_total" and sample.labels["route"] in ROUTES)


def _case(name: str, kind: str, params: Mapping[str, Any], *, stream: bool = False,
          model: str = "tiny", **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "params": {"model": model, **params},
            "stream": stream, **extra}


# -- every refusal: its 4xx, OpenAI's body, never retried -----------------------------------

_LONG = "edge " * 300  # 301 tokens: more than the whole context
_REFUSALS: list[tuple[dict[str, Any], str, int, str | None, str]] = [
    (_case("prompt over the context", "completions", {"prompt": _LONG, "max_tokens": 4}),
     "BadRequestError", 400, "prompt", "context_length_exceeded"),
    (_case("chat over the context", "chat", {"messages": [{"role": "user", "content": _LONG}],
                                             "max_tokens": 4}),
     "BadRequestError", 400, "messages", "context_length_exceeded"),
    (_case("max_tokens over the context", "completions", {"prompt": "edge",
                                                          "max_tokens": 100_000}),
     "BadRequestError", 400, "max_tokens", "context_length_exceeded"),
    (_case("max_completion_tokens over the context", "chat",
           {"messages": CHAT, "max_completion_tokens": 100_000}),
     "BadRequestError", 400, "max_completion_tokens", "context_length_exceeded"),
    (_case("prompt and max_tokens together", "completions",
           {"prompt": "edge " * 100, "max_tokens": 200}),
     "BadRequestError", 400, "max_tokens", "context_length_exceeded"),
    (_case("second prompt of a list", "completions",
           {"prompt": [[1, 5, 9], [5] * MAX_MODEL_LEN], "max_tokens": 2}),
     "BadRequestError", 400, "prompt[1]", "context_length_exceeded"),
    (_case("token outside the vocabulary", "completions", {"prompt": [1, 100_000],
                                                           "max_tokens": 2}),
     "BadRequestError", 400, "prompt", "invalid_value"),
    (_case("a prompt list of texts and token ids", "completions",
           {"prompt": ["edge", [1, 5]], "max_tokens": 2}),
     "BadRequestError", 400, "prompt", "invalid_value"),
    (_case("temperature", "completions", {"prompt": "x", "max_tokens": 2,
                                          "temperature": -1}),
     "BadRequestError", 400, "temperature", "invalid_value"),
    (_case("top_p", "chat", {"messages": CHAT, "max_tokens": 2, "top_p": 2}),
     "BadRequestError", 400, "top_p", "invalid_value"),
    (_case("presence_penalty", "chat", {"messages": CHAT, "max_tokens": 2,
                                        "presence_penalty": 3}),
     "BadRequestError", 400, "presence_penalty", "invalid_value"),
    (_case("frequency_penalty", "completions", {"prompt": "x", "max_tokens": 2,
                                                "frequency_penalty": -2.5}),
     "BadRequestError", 400, "frequency_penalty", "invalid_value"),
    (_case("logprobs above vLLM's 20", "completions", {"prompt": "x", "max_tokens": 2,
                                                        "logprobs": 50}),
     "BadRequestError", 400, "logprobs", "invalid_value"),
    (_case("top_logprobs above vLLM's 20", "chat", {"messages": CHAT, "max_tokens": 2,
                                                     "logprobs": True, "top_logprobs": 30}),
     "BadRequestError", 400, "top_logprobs", "invalid_value"),
    (_case("n above 1 when greedy", "chat", {"messages": CHAT, "max_tokens": 2, "n": 2,
                                             "temperature": 0}),
     "BadRequestError", 400, "n", "invalid_value"),
    (_case("min_tokens above max_tokens", "completions", {"prompt": "x", "max_tokens": 2,
                                                          "min_tokens": 5}),
     "BadRequestError", 400, "min_tokens", "invalid_value"),
    (_case("echo", "completions", {"prompt": "x", "max_tokens": 2, "echo": True}),
     "BadRequestError", 400, "echo", "unsupported_parameter"),
    (_case("logit_bias", "chat", {"messages": CHAT, "max_tokens": 2,
                                  "logit_bias": {"5": 1}}),
     "BadRequestError", 400, "logit_bias", "unsupported_parameter"),
    (_case("tools", "chat", {"messages": CHAT, "max_tokens": 2, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}]}),
     "BadRequestError", 400, "tools", "unsupported_parameter"),
    (_case("response_format type", "chat", {"messages": CHAT, "max_tokens": 2,
                                            "response_format": {"type": "xml"}}),
     "BadRequestError", 400, "response_format.type", "unsupported_value"),
    (_case("stream_options without a stream", "chat",
           {"messages": CHAT, "max_tokens": 2, "stream_options": {"include_usage": True}}),
     "BadRequestError", 400, "stream_options", "invalid_value"),
    (_case("unknown model", "completions", {"prompt": "x", "max_tokens": 2}, model="nope"),
     "NotFoundError", 404, "model", "model_not_found"),
    (_case("wrong key", "completions", {"prompt": "x", "max_tokens": 2},
           apiKey="wrong-key"),
     "AuthenticationError", 401, None, "invalid_api_key"),
    (_case("passed deadline", "completions", {"prompt": "edge", "max_tokens": 230,
                                              "deadline_s": 0.05, **GREEDY}),
     "InternalServerError", 504, "deadline_s", "deadline_exceeded"),
]


def _python_refusal(server: Served, case: Mapping[str, Any]) -> dict[str, Any]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=case.get("apiKey", API_KEY),
                       timeout=300) as client:  # default retries: 2
        return run_python(client, case)


def test_every_refusal_is_its_4xx_with_openais_body_from_both_clients_never_retried(
        server: Served) -> None:
    for case, kind, status, param, code in _REFUSALS:
        before = _requests(server)
        result = _python_refusal(server, case)
        error = result["error"]
        assert error is not None, (case["name"], result)
        assert (error["class"], error["status"], error["param"], error["code"]) == (
            kind, status, param, code), (case["name"], error)
        if status == 400:
            assert error["type"] == "invalid_request_error", error
        assert "Traceback" not in error["message"]
        assert _requests(server) - before == 1, f"{case['name']}: retried"
    package = _node_or_none()
    if package is None:
        pytest.skip(f"the Node half: {node_openai()[1]}")
    before = _requests(server)
    results = run_node(package, f"{server.url}/v1", API_KEY, [c for c, *_ in _REFUSALS])
    for case, kind, status, param, code in _REFUSALS:
        error = results[case["name"]]["error"]
        assert error is not None, results[case["name"]]
        assert (error["class"], error["status"], error["param"], error["code"]) == (
            kind, status, param, code), (case["name"], error)
    assert _requests(server) - before == len(_REFUSALS)  # none sent twice


def test_a_body_over_the_limit_is_413_from_both_clients(server: Served) -> None:
    big = "x" * (33 * 1024 * 1024)  # the server's default limit is 32 MiB
    case = _case("over the body limit", "completions", {"prompt": big, "max_tokens": 2},
                 maxRetries=0)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=300) as client:
        error = run_python(client, case)["error"]
    assert error is not None and (error["status"], error["param"], error["code"]) == (
        413, "body", "request_too_large"), error
    package = _node_or_none()
    if package is None:
        pytest.skip(f"the Node half: {node_openai()[1]}")
    error = run_node(package, f"{server.url}/v1", API_KEY, [case])[case["name"]]["error"]
    assert error is not None and (error["status"], error["param"], error["code"]) == (
        413, "body", "request_too_large"), error


async def _hold(url: str, body: Mapping[str, Any], count: int,
                while_held: Any) -> Any:
    """Run ``while_held()`` (in a thread) while ``count`` streams of ``body`` are open."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=300) as http:

        async def hold() -> None:
            async with http.stream("POST", "/v1/completions", json=body) as stream:
                async for _ in stream.aiter_lines():
                    pass

        holders = [asyncio.ensure_future(hold()) for _ in range(count)]
        try:
            return await asyncio.to_thread(while_held)
        finally:
            for holder in holders:  # the disconnects cancel them in the engine
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)


#: Requests that cannot fit tiny's context, each with the limit its 400 names: token ids
#: (counted on the controller), a text prompt and chats (counted by the stage's worker
#: with the model's tokenizer and chat template, in a query that takes no slot).
_DOOMED = [
    (_case("max_tokens over the context, admission full", "completions",
           {"prompt": [1, 5, 9], "max_tokens": 100_000}, maxRetries=0), "max_tokens"),
    (_case("text prompt over the context, admission full", "completions",
           {"prompt": _LONG, "max_tokens": 4}, maxRetries=0), "prompt"),
    (_case("text prompt and max_tokens together, admission full", "completions",
           {"prompt": "edge " * 100, "max_tokens": 200}, maxRetries=0), "max_tokens"),
    (_case("chat over the context, admission full", "chat",
           {"messages": [{"role": "user", "content": _LONG}], "max_tokens": 4},
           maxRetries=0), "messages"),
    (_case("chat and max_completion_tokens together, admission full", "chat",
           {"messages": CHAT, "max_completion_tokens": 250}, maxRetries=0),
     "max_completion_tokens"),
]


def test_a_request_over_the_context_is_refused_even_while_admission_is_full(
        server: Served) -> None:
    # tiny's 8 admission slots held by 8 running requests of 128 choices each (the most
    # a request may have): the engine runs 8 sequences at a time, first come first, so
    # the first request alone takes 16 rounds of 250 steps (with 16 choices it took 2,
    # and under two busy loops it once ended while the Python client was answered). A
    # request that cannot fit — token ids, a text prompt or a chat — is still told why
    # (400, context_length_exceeded, the limit named) at once, from both clients, instead
    # of 429 or a wait in line: it is checked (and a text or chat counted by the stage's
    # worker) before admission.
    body = {"model": "tiny", "prompt": "edge", "max_tokens": 250, "n": 128, "stream": True,
            "temperature": 1.0, "seed": 7, "ignore_eos": True}
    package = _node_or_none()
    doomed = [case for case, _ in _DOOMED]

    def refused_while_held() -> tuple[list[dict[str, Any]], list[int], float]:
        end = time.monotonic() + 300
        while (held := _stages(server, "tiny")["gen"]["in_flight"]) < 8:
            assert time.monotonic() < end, held
            time.sleep(0.1)
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                           timeout=300) as made:
            started = time.monotonic()
            results = [run_python(made, case) for case in doomed]
            waited = time.monotonic() - started
        counts = [held, _stages(server, "tiny")["gen"]["in_flight"]]
        if package is not None:  # its start takes a moment: the holders may end meanwhile
            answered = run_node(package, f"{server.url}/v1", API_KEY, doomed)
            results += [answered[case["name"]] for case in doomed]
        return results, counts, waited

    results, held, waited = asyncio.run(_hold(server.url, body, 8, refused_while_held))
    limits = [param for _, param in _DOOMED] * (len(results) // len(_DOOMED))
    for result, param in zip(results, limits, strict=True):
        error = result["error"]
        assert error is not None and (error["class"], error["status"], error["param"],
                                      error["code"]) == (
            "BadRequestError", 400, param, "context_length_exceeded"), result
        assert re.search(r"\d+ too many|by \d+", error["message"]), error  # by how much
    assert waited < 30.0 * len(_DOOMED)  # answered, not left waiting for a slot
    assert held == [8, 8]  # every slot was held while the Python client was answered
    end = time.monotonic() + 120  # the holders' disconnects free the stage and the engine
    while _stages(server, "tiny")["gen"]["in_flight"] or engine_unfinished(server):
        assert time.monotonic() < end
        time.sleep(0.2)
    if package is None:
        pytest.skip(f"the Node half: {node_openai()[1]}")


# -- streams cut: a deadline, a worker lost, the grace period's end ------------------------


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _cpu_ns(pids: list[int]) -> int:
    """CPU time the threads of ``pids`` have used, in ns (``/proc/PID/task/*/schedstat``)."""
    used = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError), open(
                        f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                    used += int(stat.read().split()[0])
    return used


def _step_until(pids: list[int], ready: Any, limit_s: float = 120.0) -> None:
    """Stop ``pids``, then let them run in short steps until ``ready()``; leave them stopped.

    Each step lasts 5 ms, or longer where the machine is loaded, until they have had 2 ms
    of CPU (at most 25 ms); 45 ms stopped follow. A worker the controller has not heard
    from for 1 s and finds stopped is declared unresponsive (``edge_core.host.liveness``):
    its steps must let its heartbeat thread run within that, and on a machine with more
    runnable threads than cores a step of 5 ms of wall time may give it no CPU at all.
    """
    _signal_all(pids, signal.SIGSTOP)
    end = time.monotonic() + limit_s
    while not ready() and time.monotonic() < end:
        before = _cpu_ns(pids)
        _signal_all(pids, signal.SIGCONT)
        started = time.monotonic()
        time.sleep(0.005)
        while time.monotonic() - started < 0.025 and _cpu_ns(pids) - before < 2_000_000:
            time.sleep(0.001)
        _signal_all(pids, signal.SIGSTOP)
        time.sleep(0.045)


@contextlib.contextmanager
def _stepping(pids: list[int]) -> Iterator[None]:
    """Run ``pids`` in short steps (:func:`_step_until`) from another thread while the
    body runs; leave them stopped.

    For a body that asks the server something: left stopped while the server is slow to
    answer (a loaded machine), the worker would be silent for over 1 s and declared
    unresponsive — a lost worker the test did not make.
    """
    done = threading.Event()
    stepper = threading.Thread(target=_step_until, args=(pids, done.is_set, 600.0),
                               daemon=True)
    stepper.start()
    try:
        yield
    finally:
        done.set()
        stepper.join()


def _cut_stream(server: Served, case: dict[str, Any], cut: Any = None,
                hold: list[int] | None = None,
                ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Stream ``case`` from both clients; call ``cut(running, reading)`` once both have a chunk.

    ``running()`` tells, from the server, whether both requests are still in flight at
    the case's generate stage (the engine has not finished either); ``reading()`` whether
    either client's stream is still open. With ``hold`` (that stage's worker, which runs
    the engine, and its child processes) they are stopped before either request goes out
    and run only in short steps (:func:`_step_until`) until both clients have a chunk;
    ``cut`` is then called with them stopped, and must continue or kill them. On a loaded
    machine one request can reach the stage long after the other (a page is read first,
    the Node client is slow to start) and a client can read far behind the engine: free,
    one stream could end before the other client's first chunk, or before its own
    client's.
    """
    package = _node_or_none()
    first = threading.Event()
    found: dict[str, Any] = {}
    name = case["name"]
    pipeline = case["params"]["model"]

    def python() -> None:
        try:
            with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                               timeout=300) as made:
                found.update(run_python(made, case, on_first=first.set))
        except Exception as error:  # not the client's APIError: the test reports it
            found["error"] = {"class": type(error).__name__, "message": str(error)}
            found.setdefault("chunks", 0)
        finally:
            first.set()  # never leaves the test waiting on a thread that has ended

    thread = threading.Thread(target=python, daemon=True)
    node: NodeRun | None = None
    try:
        if hold:
            _signal_all(hold, signal.SIGSTOP)  # nothing in flight yet: no silence counts
        node = NodeRun(package, f"{server.url}/v1", API_KEY,
                       [dict(case, announce=True)]) if package else None
        assert node is None or node.started()  # both clients' requests go out together
        thread.start()
        if hold:
            started = time.monotonic()
            _step_until(hold, lambda: first.is_set() and (
                node is None or node.first(name, timeout_s=0) or node.ended(name)))
            found["held_s"] = round(time.monotonic() - started, 2)
        assert first.wait(300) and found.get("error") is None, found
        assert node is None or node.first(name), node.results()
        if cut is not None:
            expected = 1 if node is None else 2
            cut(lambda: _stages(server, pipeline)["gen"]["in_flight"] >= expected,
                lambda: thread.is_alive() or (node is not None and not node.ended(name)))
    finally:
        # Whatever happened above (cut continues or kills them, but may have raised
        # first), nothing is left stopped: a stopped engine under a live worker would
        # stall every later request of its stage without an error.
        _signal_all(hold or [], signal.SIGCONT)
        if thread.ident is not None:  # started
            thread.join(300)
        results = node.results() if node is not None else {}
    return found, results.get(case["name"])


def _ended_with(result: Mapping[str, Any], code: str) -> None:
    """The stream had chunks, then an SSE error event the client raised as APIError."""
    error = result["error"]
    assert result["chunks"] >= 1 and error is not None, result
    assert error["class"] == "APIError" and error["code"] == code, error
    assert error["type"] in ("server_error", "timeout_error"), error


def _both(server: Served, case: dict[str, Any]) -> list[dict[str, Any]]:
    """Stream ``case`` from both clients at once; their results (Python's first)."""
    package = _node_or_none()
    node = NodeRun(package, f"{server.url}/v1", API_KEY, [case]) if package else None
    found: dict[str, Any] = {}

    def python() -> None:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                           timeout=300) as made:
            found.update(run_python(made, case))

    thread = threading.Thread(target=python, daemon=True)
    assert node is None or node.started()  # both clients' requests go out together
    thread.start()
    thread.join(300)
    return [found] + ([node.results()[case["name"]]] if node is not None else [])


def test_a_deadline_that_passes_mid_stream_ends_it_with_an_error_event(
        server: Served, client: openai.OpenAI) -> None:
    # The deadline must fall after both streams' first chunk and before their 240 tokens
    # are done; how fast the engine is depends on the machine's load at that moment. It
    # starts between the two as measured now, and is halved when the streams finished
    # first, doubled when one had no chunk yet (each a correct answer of its own); once
    # both have happened it is searched between the two (their geometric mean), so a
    # narrow window on a loaded machine is found instead of stepped over each time.
    started = time.monotonic()
    list(client.completions.create(model="tiny", prompt="edge", max_tokens=1, stream=True,
                                   extra_body={"ignore_eos": True}))
    first = time.monotonic() - started
    started = time.monotonic()
    client.completions.create(model="tiny", prompt="edge stage", max_tokens=240,
                              extra_body={"ignore_eos": True})
    whole = time.monotonic() - started
    deadline = max(3 * first, whole / 3)
    early, late = 0.0, math.inf  # a deadline known to fall before a chunk / after the end
    tried = []
    for _ in range(8):
        case = _case("deadline mid-stream", "completions",
                     {"prompt": "edge stage", "max_tokens": 240,
                      "deadline_s": round(deadline, 3), **GREEDY}, stream=True)
        results = _both(server, case)
        tried.append((round(deadline, 3), [(r["chunks"], r["ok"]) for r in results]))
        for result in results:  # each answer is one the deadline allows
            error = result["error"]
            assert result["ok"] or (error is not None and error["code"] == "deadline_exceeded"
                                    and (result["chunks"] >= 1 or error["status"] == 504)), \
                result
        if all(r["chunks"] >= 1 and r["error"] is not None for r in results):
            break  # cut mid-stream, both
        if any(r["chunks"] == 0 for r in results):
            early = deadline
        else:
            late = deadline
        deadline = (deadline * 2 if late == math.inf else deadline / 2 if early == 0.0
                    else math.sqrt(early * late))
    else:
        pytest.fail(f"no deadline fell mid-stream for both clients: {tried}")
    for result in results:
        _ended_with(result, "deadline_exceeded")
    # Both aborted. A stream cut within 20 tokens of its end could also have ended by
    # itself while the probes ran: the check is weaker there.
    unfinished = engine_unfinished_after_abort(server)
    assert unfinished[-1] == 0, unfinished


def _worker_pid(server: Served, pipeline: str, stage: str) -> int:
    plan = httpx.get(f"{server.url}/v1/pipelines/{pipeline}",
                     headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60).json()["plan"]
    (found,) = [s for s in plan["stages"] if s["id"] == stage]
    return int(found["worker"]["pid"])


def _page_chat(ocr_dir: Path) -> list[dict[str, Any]]:
    """A chat whose user message carries the rendered page as an image_url part."""
    page = base64.b64encode((ocr_dir / "page.png").read_bytes()).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{page}"}}
    return [CHAT[0], {"role": "user", "content": [{"type": "text", "text": "Read it."},
                                                  image]}]


def test_a_worker_lost_mid_stream_ends_it_with_an_error_event(
        server: Served, client: openai.OpenAI, ocr_dir: Path) -> None:
    # page-chat's generate stage: its worker dies under both streams.
    case = _case("worker lost mid-stream", "chat",
                 {"messages": _page_chat(ocr_dir), "max_tokens": 150, "n": 4,
                  "temperature": 1.0, "seed": 5, "ignore_eos": True},
                 stream=True, model="page-chat")
    # The streams must still run when the worker dies: the worker (which runs the engine
    # in its own process) and its child processes are held to short steps from before the
    # requests go out until both clients have a chunk (:func:`_cut_stream`). Then, still
    # stopped, after 0.3 s for frames in flight to land, the worker is killed if the
    # server still has both requests in flight at the stage (neither stream can end whole
    # then, however far behind a client reads), and its children run on, to see their
    # parent go. 4 choices each: the stage runs 8 sequences at once, so neither request's
    # choices wait for the other's to finish (its first chunk would come only near the
    # other stream's end), and each engine step moves all 8, slowly. Otherwise both go
    # on, both streams end whole (a correct answer of its own), and the case is tried
    # again, up to three times.
    pid = _worker_pid(server, "page-chat", "gen")
    children = [child.pid for child in psutil.Process(pid).children(recursive=True)]
    tried: list[tuple[float | None, int, int | None]] = []
    killed: list[int] = []

    def cut(running: Any, reading: Any) -> None:
        time.sleep(0.3)
        if running():
            _signal_all(children, signal.SIGCONT)
            # The server may have declared the stopped worker unresponsive and killed it
            # first (it was silent for 1 s while the server was slow to answer): the same
            # loss, reported the same way.
            _signal_all([pid], signal.SIGKILL)
            killed.append(pid)
        else:
            _signal_all([pid, *children], signal.SIGCONT)

    for _ in range(3):
        python, node = _cut_stream(server, case, cut=cut, hold=[pid, *children])
        tried.append((python.get("held_s"), python["chunks"], node and node["chunks"]))
        if killed:
            break
    else:
        pytest.fail(f"a stream ended before the worker could be killed (held s, chunks): "
                    f"{tried}")
    for result in (python, node):
        if result is not None:
            _ended_with(result, "worker_lost")
    # The stage fails and restarts (restart = "on-failure": a new engine loads, through
    # the whole gate, while the next tests run): refused meanwhile with 503 and
    # Retry-After, which the client may retry (the restart cures it).
    with pytest.raises(openai.InternalServerError) as caught:
        client.with_options(max_retries=0).chat.completions.create(
            model="page-chat", messages=case["params"]["messages"], max_tokens=2)
    assert caught.value.status_code == 503 and caught.value.code == "stage_unavailable"
    assert caught.value.response.headers["retry-after"] == "1"


# -- every sampling feature: the same answer streamed and whole, from both clients ----------

_SCHEMA = {"type": "json_schema", "json_schema": {"name": "point", "schema": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
_FEATURES: list[dict[str, Any]] = [
    _case("plain", "completions", {"prompt": "edge stage token", "max_tokens": 8, **GREEDY}),
    _case("several prompts", "completions", {"prompt": ["edge stage", "token worker"],
                                             "max_tokens": 6, **GREEDY}),
    _case("several prompts, n=2", "completions", {"prompt": [[1, 5, 9], [1, 9, 5, 9]],
                                                  "n": 2, "temperature": 0.8, "seed": 5,
                                                  "max_tokens": 5, "ignore_eos": True}),
    _case("logprobs", "completions", {"prompt": "edge stage", "logprobs": 3,
                                      "max_tokens": 6, **GREEDY}),
    _case("penalties", "completions", {"prompt": "edge stage", "presence_penalty": 1.5,
                                       "frequency_penalty": 2.0, "max_tokens": 40,
                                       **GREEDY}),
    _case("no penalties", "completions", {"prompt": "edge stage", "max_tokens": 40,
                                          **GREEDY}, reference=True),
    _case("json_object", "completions", {"prompt": "edge stage", "max_tokens": 12,
                                         "response_format": {"type": "json_object"},
                                         "temperature": 0.0}),
    _case("chat", "chat", {"messages": CHAT, "max_tokens": 8, **GREEDY}),
    _case("chat n=2", "chat", {"messages": CHAT, "n": 2, "temperature": 0.9, "seed": 11,
                               "max_tokens": 6, "ignore_eos": True}),
    _case("chat logprobs", "chat", {"messages": CHAT, "logprobs": True, "top_logprobs": 3,
                                    "max_tokens": 6, **GREEDY}),
    _case("chat penalties", "chat", {"messages": CHAT, "presence_penalty": -1.0,
                                     "frequency_penalty": 1.5, "max_tokens": 10, **GREEDY}),
    _case("chat json_object", "chat", {"messages": CHAT, "max_tokens": 12,
                                       "response_format": {"type": "json_object"},
                                       "temperature": 0.0}),
    _case("chat json_schema", "chat", {"messages": CHAT, "max_tokens": 12,
                                       "response_format": _SCHEMA, "temperature": 0.0}),
]


def _rounded(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result's choices with log-probabilities to 4 decimals (for comparing runs)."""
    assert result["ok"], result
    return {index: {"text": c["text"], "finish": c["finish"],
                    "logprobs": [[t, round(lp, 4)] for t, lp in c["logprobs"]]}
            for index, c in sorted(result["choices"].items())}


def test_every_feature_gives_the_same_choices_streamed_and_whole_from_both_clients(
        client: openai.OpenAI, server: Served) -> None:
    # A reference (what the penalties change) is asked for once, whole, from Python.
    cases = [dict(case, name=f"{case['name']} ({how})", stream=how == "stream")
             for case in _FEATURES for how in ("whole", "stream")
             if how == "whole" or not case.get("reference")]
    python = {case["name"]: run_python(client, case) for case in cases}
    answers = {case["name"]: _rounded(python[f"{case['name']} (whole)"])
               for case in _FEATURES}
    for case in _FEATURES:
        name = case["name"]
        if not case.get("reference"):
            assert _rounded(python[f"{name} (stream)"]) == answers[name], name
    cases = [case for case in cases if not case.get("reference")]
    package = _node_or_none()
    node = run_node(package, f"{server.url}/v1", API_KEY, cases) if package else {}
    for case in cases:
        if node:
            base = case["name"].rsplit(" (", 1)[0]
            assert _rounded(node[case["name"]]) == answers[base], case["name"]

    def choices(name: str) -> list[dict[str, Any]]:
        return [answers[name][key] for key in sorted(answers[name], key=int)]

    assert len(choices("several prompts")) == 2 and len(choices("several prompts, n=2")) == 4
    assert len(choices("chat n=2")) == 2
    assert python["several prompts (whole)"]["usage"]["completion_tokens"] == 12
    for name in ("logprobs", "chat logprobs"):
        (only,) = choices(name)
        assert len(only["logprobs"]) == 6 and all(lp <= 0 for _, lp in only["logprobs"])
    assert choices("penalties")[0]["text"] != choices("no penalties")[0]["text"]
    for name in ("json_object", "chat json_object", "chat json_schema"):
        text = choices(name)[0]["text"].lstrip()
        assert text.startswith("{"), (name, text)  # guided: JSON from the first token
        if choices(name)[0]["finish"] == "stop":
            json.loads(text)
    if not node:
        pytest.skip(f"the Node half: {node_openai()[1]}")


def _stages(server: Served, pipeline: str) -> dict[str, dict[str, Any]]:
    listed = httpx.get(f"{server.url}/v1/pipelines/{pipeline}",
                       headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60).json()
    return {stage["id"]: stage for stage in listed["stages"]}


def test_the_stage_restarted_after_its_lost_worker_streams_again(
        server: Served, client: openai.OpenAI, ocr_dir: Path) -> None:
    # page-chat's generate stage lost its worker above and has been restarting since.
    end = time.monotonic() + 900
    while (gen := _stages(server, "page-chat")["gen"])["state"] != "ready":
        assert gen["state"] in ("failed", "restarting"), gen  # never given up
        assert time.monotonic() < end, gen
        time.sleep(1.0)
    assert gen["generation"] == 2  # a new worker and engine
    messages: list[Any] = _page_chat(ocr_dir)
    whole = client.chat.completions.create(model="page-chat", messages=messages,
                                           max_tokens=6, temperature=0.0,
                                           extra_body={"ignore_eos": True})
    streamed = list(client.chat.completions.create(
        model="page-chat", messages=messages, max_tokens=6, stream=True, temperature=0.0,
        extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == whole.choices[0].message.content and whole.usage is not None
    assert whole.usage.completion_tokens == 6
    receipt = (whole.model_extra or {})["edge"]["placement"]
    assert [s["generation"] for s in receipt if s["stage"] == "gen"] == [2]
    metrics = httpx.get(f"{server.url}/metrics", timeout=60,
                        headers={"Authorization": f"Bearer {API_KEY}"}).text
    restarts = {(s.labels["pipeline"], s.labels["stage"]): s.value
                for family in text_string_to_metric_families(metrics)
                for s in family.samples if s.name == "edge_worker_restarts_total"}
    assert restarts[("page-chat", "gen")] == 1


def test_the_end_of_the_grace_period_ends_open_streams_and_the_summary_lists_retire_times(
        generate_server: SharedServer, server: Served) -> None:
    # tiny's streams: 4 choices of 250 tokens each with 5 alternatives per token (the 8
    # sequences the engine runs at once), far longer than the grace period (0.25 s) even
    # on a quiet machine. tiny's worker is held to short steps from before the requests go
    # out until both clients have a chunk (:func:`_cut_stream`): on a loaded machine the
    # Node client's request can go out late and a client read far behind the engine, and
    # a stream end before the signal. Then, still stopped, after 0.3 s for frames in
    # flight to land, the server is asked and signalled if it still has both requests in
    # flight at the stage, and the worker runs in short steps through the grace period
    # and 0.3 s more (the grace period must not be outrun by an engine near its streams'
    # end). Otherwise nothing was cut, and the case runs again on the same server.
    #
    # The worker is never left stopped while the test waits for something slow: not while
    # the server answers (:func:`_stepping`), and not while the signal is sent, which
    # first records the server's process tree (every process's memory maps, the vLLM
    # workers' and engines' among them: 0.7 s on a 2-core host at a load of 5, more
    # under more load; the worker was left stopped through it before). A worker stopped and
    # silent for 1 s with work outstanding is declared unresponsive, rightly: its streams
    # end as worker_lost before the server was signalled or its grace period ended, and
    # that, not server_shutting_down, is then the true answer (it happened first).
    signalled: list[float] = []
    tried: list[tuple[int, bool, int | None]] = []
    held: list[int] = []

    def stop(running: Any, reading: Any) -> None:
        time.sleep(0.3)
        with _stepping(held):
            still = running()
            if still:
                server.send_signal(signal.SIGTERM)
                signalled.append(time.monotonic())  # the grace period runs from here
        if still:
            _step_until(held, lambda: not reading(), GRACE_S + 0.3)
        _signal_all(held, signal.SIGCONT)

    try:
        case = _case("open at the end of the grace period", "completions",
                     {"prompt": "edge", "max_tokens": 250, "n": 4, "logprobs": 5,
                      "temperature": 1.0, "seed": 3, "ignore_eos": True}, stream=True)
        pid = _worker_pid(server, "tiny", "gen")
        held += [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
        for _ in range(3):
            python, node = _cut_stream(server, case, cut=stop, hold=held)
            tried.append((python["chunks"], python["ok"], node and node["chunks"]))
            if signalled:
                break
        else:
            pytest.fail(f"a stream finished before the cut every time (chunks, ok): {tried}")
        ended = time.monotonic() - signalled[0]
        for result in (python, node):
            if result is not None:
                _ended_with(result, "server_shutting_down")
        assert ended >= 0.9 * GRACE_S  # the streams ran on through the grace period
    finally:
        stopped = generate_server.stop()  # waits for the exit; checks nothing is left
    assert stopped is not None
    log = "".join(stopped.stderr)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    summary = stopped.summary
    retire = summary["retire_s"]
    assert set(retire) == {"ocr", "tiny", "page-chat"}
    assert set(retire["ocr"]) == {"detect", "classify", "recognize"}
    assert set(retire["page-chat"]) == {"detect", "classify", "recognize", "gen"}
    assert all(isinstance(s, float) for stages in retire.values() for s in stages.values())
    generate = summary["closed"]["tiny"]["gen"]["retire"]
    assert generate["escalation"] == "graceful", generate  # left by itself, in its window
    assert retire["tiny"]["gen"] <= GENERATE_RETIRE_BOUND_S
    assert summary["closing_s"] >= retire["tiny"]["gen"]
