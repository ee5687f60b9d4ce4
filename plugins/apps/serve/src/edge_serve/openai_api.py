"""OpenAI-compatible generation: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

The model name is the pipeline's name; a pipeline is served here when its last stage is
a generate stage:

* its only stage: ``prompt`` (completions) or ``messages`` (chat, text parts only) go to
  the stage as its parameters; chat messages are rendered by the worker with the model's
  own chat template;
* graph stages before it, and a ``prepare``: chat only. The one ``image_url`` part (a
  ``data:`` URL) is read by ``prepare`` into the first stage's inputs; the chat's text
  (image parts removed) goes to the transforms as the input ``carry:messages``; the
  transform before the generate stage builds the prompt, merged over the caller's
  sampling parameters (:mod:`edge_serve.chat`, :mod:`edge_serve.generation`). A
  completion has no image to give it: 400 naming ``prompt``.

Served fields besides the prompt: ``max_tokens`` (chat: also ``max_completion_tokens``),
``temperature``, ``top_p``, ``seed``, ``stop``, ``n`` (choices per prompt), ``logprobs``
(completions: how many alternatives; chat: a boolean, with ``top_logprobs``),
``presence_penalty``, ``frequency_penalty``, ``response_format`` (``text``,
``json_object``, ``json_schema``: the engine's guided decoding), ``stream``,
``stream_options.include_usage``, ``user`` (ignored), and a completion's ``prompt`` as a
list (choice ``i * n + j`` answers prompt ``i``); vLLM's own ``top_k``, ``min_p``,
``min_tokens``, ``repetition_penalty``, ``ignore_eos``; and ``deadline_s``. Any other field
is refused with 400 naming it (``unsupported_parameter``), and what the stage refuses is
400 naming the field as the client sent it (:mod:`edge_serve.outcomes`). What the stage
can refuse without running it (``Pipeline.check_params``: malformed values, a prompt and
``max_tokens`` over the context — token ids counted on the controller, texts and chats
by the stage's worker with the model's own tokenizer and chat template, in a ``query``
that takes no slot) is refused before the request waits for anything, so a doomed
request never holds or awaits an admission slot. That check runs in a thread, off the
event loop: a count waits for one round trip to the worker.

``stream: true`` answers with server-sent events: for a chat first each choice's role,
then one chunk per token event of a choice, each choice's finish reason in a chunk of its
own, the usage when asked for, then ``data: [DONE]``. A stream that cannot end normally
ends with one error event in OpenAI's shape (``data: {"error": {...}}``) and then
``data: [DONE]``: when its deadline passes, when the stage fails or is restarting, and
when the server's grace period ends (:mod:`edge_serve.draining`).

A client that goes away cancels its request alone, never retiring a worker: the stage
fences it and a preemptible backend aborts it inside the engine (vLLM's ``abort``);
counted as outcome ``cancelled``. A deadline (``deadline_s`` in the body, or
``X-Edge-Deadline``) does the same when it passes: 504 before the first token, an error
event after it. Non-streamed answers carry an ``edge`` object: the stage's terminal event
data (finish reasons, token counts, how many requests the engine still held when it
finished) and the request's placement receipt; in a stream, the finish chunk of the last
choice to finish carries the receipt.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_serve.bodies import deadline_of, json_body
from edge_serve.chat import read_chat
from edge_serve.generation import Finished, Generation, TokenFeed
from edge_serve.outcomes import (
    HttpRefusal,
    deadline_passed,
    describe,
    from_exception,
    server_stopping,
)
from edge_serve.queueing import Claim
from edge_serve.served import ServedPipeline, retrieve
from edge_serve.signals import Signals
from edge_serve.submitted import watch_disconnect

__all__ = ["routes"]

#: Fields passed to the stage under the same name.
_SAMPLING = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop", "n",
                       "presence_penalty", "frequency_penalty", "top_k", "min_p",
                       "min_tokens", "repetition_penalty", "ignore_eos"})
_COMMON = frozenset({"model", "stream", "stream_options", "user", "deadline_s",
                     "response_format"})
_COMPLETION_KEYS = _SAMPLING | _COMMON | {"prompt", "logprobs"}
_CHAT_KEYS = _SAMPLING | _COMMON | {"messages", "max_completion_tokens", "logprobs",
                                    "top_logprobs"}
_OUTCOME_KEY = "edge.outcome"
_PIPELINE_KEY = "edge.pipeline"
_MAX_LOGPROBS = 20


class _Stopping(Exception):
    """The grace period ended while the request was open (handed through its feed)."""


def _state(request: Request) -> Any:
    return request.app.state.edge


def _refuse(field: str, reason: str, value: object = None, *,
            code: str = "invalid_value") -> HttpRefusal:
    return HttpRefusal(400, field, reason, value, kind="InvalidValue", code=code)


def _model(request: Request, body: Mapping[str, Any]) -> ServedPipeline:
    """The generate pipeline named by ``model``: 400 when absent, 404 when unknown."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise _refuse("model", "must name a served generate pipeline", name,
                      code="missing_required_parameter")
    served: ServedPipeline | None = _state(request).pipelines.get(name)
    if served is None or served.openai is None:
        raise HttpRefusal(404, "model", "no generate pipeline of that name is served", name,
                          kind="NotFound", code="model_not_found")
    request.scope[_PIPELINE_KEY] = name
    return served


def _sampling(body: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    """The stage's sampling parameters (checked by the stage itself before sending)."""
    params = {key: body[key] for key in _SAMPLING if body.get(key) is not None}
    if chat and body.get("max_completion_tokens") is not None:
        params["max_tokens"] = body["max_completion_tokens"]  # as vLLM: it wins
    logprobs = body.get("logprobs")
    if chat:
        top = body.get("top_logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _refuse("logprobs", "must be a boolean (top_logprobs says how many "
                          "alternatives)", logprobs)
        if top is not None and logprobs is not True:
            raise _refuse("top_logprobs", "needs logprobs: true", top)
        if logprobs is True:
            params["logprobs"] = _count(top, "top_logprobs") if top is not None else 0
    elif logprobs is not None:
        params["logprobs"] = _count(logprobs, "logprobs")
    params.update(_response_format(body.get("response_format")))
    return params


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_LOGPROBS:
        raise _refuse(field, f"must be an integer in [0, {_MAX_LOGPROBS}]", value)
    return value


def _response_format(value: object) -> dict[str, Any]:
    """``response_format`` as the stage's guided decoding (``text`` is none)."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        assert isinstance(value, dict)
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _refuse("response_format.json_schema.schema", "must be a JSON Schema "
                          "object", schema)
        return {"json_schema": schema}
    raise _refuse("response_format.type", "must be text, json_object or json_schema", kind,
                  code="unsupported_value")


def _prompt(value: object) -> dict[str, Any]:
    """A completion's prompt: a string, token ids, or a list of either (several prompts)."""
    if isinstance(value, str) and value:
        return {"prompt": value}
    if isinstance(value, list) and value:
        if all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            return {"prompt_token_ids": value}
        if all(isinstance(p, str) for p in value) or all(isinstance(p, list) for p in value):
            if len(value) == 1:
                return _prompt(value[0])
            return {"prompts": value}
    raise _refuse("prompt", "must be a string, token ids, a list of strings or a list of "
                  "token-id lists", value)


def _stream_options(body: Mapping[str, Any]) -> bool:
    """Whether the stream ends with a usage chunk; anything else in the options is refused."""
    options = body.get("stream_options")
    if options is None:
        return False
    if body.get("stream") is not True:
        raise _refuse("stream_options", "only allowed with stream: true", options)
    if not isinstance(options, dict):
        raise _refuse("stream_options", "must be an object", options)
    unknown = sorted(set(options) - {"include_usage"})
    if unknown:
        raise _refuse(f"stream_options.{unknown[0]}", "not served (served: include_usage)",
                      options[unknown[0]], code="unsupported_parameter")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise _refuse("stream_options.include_usage", "must be a boolean", include)
    return include


def _renamer(body: Mapping[str, Any], *, chat: bool) -> Callable[[str], str]:
    """A stage parameter's name as the client sent it (for the refusal's ``param``)."""
    names = {"prompt_token_ids": "prompt", "prompts": "prompt",
             "json_object": "response_format", "json_schema": "response_format"}
    if chat:
        names["logprobs"] = "top_logprobs" if body.get("top_logprobs") is not None \
            else "logprobs"
        if body.get("max_completion_tokens") is not None:
            names["max_tokens"] = "max_completion_tokens"

    def rename(param: str) -> str:
        head, bracket, rest = param.partition("[")
        return names.get(head, head) + bracket + rest

    return rename


def usage(finished: Finished) -> dict[str, int]:
    """OpenAI's token counts from the terminal event."""
    prompt = int(finished.data.get("prompt_tokens", 0))
    completion = int(finished.data.get("num_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class _Choice:
    """One choice as it streams: text, log-probabilities, finish reason."""

    __slots__ = ("finish", "logprobs", "started", "text", "told")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.logprobs: list[Mapping[str, Any]] = []
        self.finish: str | None = None
        self.started = False  # a stream sent its first chunk (a chat's: the role)
        self.told = False  # a stream sent its finish chunk

    @property
    def offset(self) -> int:
        """Characters of this choice's tokens so far (a completion's ``text_offset``)."""
        return sum(len(str(record["token"])) for record in self.logprobs)


class _Choices(dict[int, _Choice]):
    """The choices of one answer by index, each made when first heard of."""

    def __missing__(self, index: int) -> _Choice:
        made = self[index] = _Choice()
        return made

    def ordered(self) -> list[tuple[int, _Choice]]:
        """Every choice, by index."""
        return sorted(self.items())


class _Shape:
    """How one of the two APIs spells its answers."""

    def __init__(self, chat: bool, model: str, logprobs: bool) -> None:
        self.chat = chat
        self.model = model
        self.logprobs = logprobs
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}

    def _logprobs(self, records: list[Mapping[str, Any]], offset: int) -> Any:
        """OpenAI's log-probabilities of some tokens (None when not asked for)."""
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [_chat_logprob(r) for r in records], "refusal": None}
        offsets, at = [], offset
        for record in records:
            offsets.append(at)
            at += len(str(record["token"]))
        return {"tokens": [r["token"] for r in records],
                "token_logprobs": [r["logprob"] for r in records],
                "top_logprobs": [{str(t): lp for _, t, lp in r["top"]} for r in records],
                "text_offset": offsets}

    def role(self, index: int) -> dict[str, Any]:
        """A chat stream's first chunk of a choice: its role."""
        return self._envelope([{"index": index, "delta": {"role": "assistant",
                                                          "content": ""},
                                "logprobs": None, "finish_reason": None}], chunk=True)

    def chunk(self, index: int, text: str, records: list[Mapping[str, Any]],
              offset: int) -> dict[str, Any]:
        """One streamed chunk of a choice's tokens."""
        choice: dict[str, Any] = {"index": index, "logprobs": self._logprobs(records, offset),
                                  "finish_reason": None}
        if self.chat:
            choice["delta"] = {"content": text} if text else {}
        else:
            choice["text"] = text
        return self._envelope([choice], chunk=True)

    def finish(self, index: int, reason: str | None) -> dict[str, Any]:
        """The chunk that ends a choice: no text, its finish reason."""
        choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": reason}
        if self.chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        return self._envelope([choice], chunk=True)

    def whole(self, choices: _Choices, finished: Finished) -> dict[str, Any]:
        """The non-streamed answer."""
        built = []
        for index, choice in choices.ordered():
            text = "".join(choice.text)
            entry: dict[str, Any] = {"index": index,
                                     "logprobs": self._logprobs(choice.logprobs, 0),
                                     "finish_reason": choice.finish}
            if self.chat:
                entry["message"] = {"role": "assistant", "content": text}
            else:
                entry["text"] = text
            built.append(entry)
        answer = self._envelope(built, chunk=False)
        answer["usage"] = usage(finished)
        edge = {k: v for k, v in finished.data.items() if k not in ("text", "choices")}
        edge["choices"] = [{k: v for k, v in c.items() if k != "text"}
                           for c in finished.data.get("choices", ())]
        edge["placement"] = finished.placement  # the request's placement receipt
        answer["edge"] = edge
        return answer

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        """The last chunk when the client asked for usage: no choices, the counts."""
        chunk = self._envelope([], chunk=True)
        chunk["usage"] = usage(finished)
        return chunk


def _chat_logprob(record: Mapping[str, Any]) -> dict[str, Any]:
    token = str(record["token"])
    return {"token": token, "logprob": record["logprob"], "bytes": list(token.encode()),
            "top_logprobs": [{"token": str(t), "logprob": lp, "bytes": list(str(t).encode())}
                             for _, t, lp in record["top"]]}


def _finishes(finished: Finished, choices: _Choices) -> None:
    """Every choice the terminal event lists, with its finish reason where no token told it."""
    listed: Any = finished.data.get("choices") or (
        {"index": 0, "finish_reason": finished.data.get("finish_reason")},)
    for entry in listed:
        choice = choices[int(entry.get("index", 0))]
        if choice.finish is None:
            choice.finish = entry.get("finish_reason")


async def _turn(request: Request, state: Any, generation: Generation) -> Claim:
    """Wait for the request's turn in the pipeline's admission queue (:mod:`.queueing`).

    A full queue is 429, a deadline passing while waiting 504, a disconnect 499; the
    time waited is taken off the request's deadline.
    """
    signals = Signals()
    release = state.drain.hold(signals.drain)
    watcher = asyncio.ensure_future(watch_disconnect(request, signals.client_gone))
    entered = time.monotonic()
    try:
        claim = await generation.served.queue.enter(generation.deadline_s, signals)
    except HttpRefusal as refusal:
        if refusal.status == 499:
            request.scope[_OUTCOME_KEY] = "cancelled"
        if refusal.status == 503:
            raise server_stopping(state.drain.grace_s) from None
        raise
    finally:
        watcher.cancel()
        release()
    if generation.deadline_s is not None:
        generation.deadline_s = max(generation.deadline_s - (time.monotonic() - entered),
                                    1e-3)
    generation.handle.on_admitted = claim.settle
    return claim


def _sse(data: object) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def _generate(request: Request, generation: Generation, shape: _Shape, *,
                    stream: bool, include_usage: bool,
                    rename: Callable[[str], str]) -> Response:
    state = _state(request)
    served = generation.served
    try:  # what the stage can refuse without running: before the queue or any slot
        # in a thread: a generate stage may ask its worker to count a text prompt's tokens
        await asyncio.to_thread(served.pipeline.check_params, generation.params)
    except Exception as exc:  # mapped: a declared fault is 400, else 500
        raise from_exception(exc, field="params", rename=rename) from None
    served.require_ready()
    claim = await _turn(request, state, generation)  # the admission queue (perfserve)
    deadline = generation.deadline_s
    loop = asyncio.get_running_loop()
    feed = TokenFeed(loop)
    late = {"deadline": False}
    choices = _Choices()

    def cancel() -> None:  # off the loop: the stage may take a moment to answer
        loop.run_in_executor(None, generation.cancel).add_done_callback(retrieve)

    def on_deadline() -> None:
        late["deadline"] = True
        cancel()

    def on_gone() -> None:
        request.scope[_OUTCOME_KEY] = "cancelled"
        cancel()

    def on_drained() -> None:  # the grace period ended: end this request as its route does
        feed.put(_Stopping())
        cancel()

    release = state.drain.hold(on_drained)
    timer = loop.call_later(deadline, on_deadline) if deadline is not None else None
    loop.run_in_executor(served.executor, generation.run, feed).add_done_callback(
        lambda _: claim.finished())
    watcher = asyncio.ensure_future(watch_disconnect(request, on_gone))

    def failure(error: BaseException) -> HttpRefusal:
        if isinstance(error, _Stopping):
            return server_stopping(state.drain.grace_s)
        if late["deadline"]:
            assert deadline is not None
            return deadline_passed(served.name, deadline)
        return from_exception(error, field="params", rename=rename)

    def ended() -> None:
        release()
        if timer is not None:
            timer.cancel()

    def take(item: Mapping[str, Any]) -> tuple[int, _Choice]:
        index = int(item.get("choice", 0))
        choice = choices[index]
        choice.text.append(str(item.get("text", "")))
        choice.logprobs.extend(item.get("logprobs", ()))
        if item.get("finish_reason") is not None:
            choice.finish = str(item["finish_reason"])
        return index, choice

    if not stream:
        try:
            item = await feed.get()
            while not isinstance(item, (Finished, BaseException)):
                take(item)
                item = await feed.get()
        except BaseException:
            on_gone()
            raise
        finally:
            watcher.cancel()
            ended()
        if isinstance(item, BaseException):
            raise failure(item)
        state.metrics.observe_stages(served.name, item.latencies)
        _finishes(item, choices)
        return JSONResponse(shape.whole(choices, item))
    try:
        first = await feed.get()  # a refusal before the first token keeps its status
    except BaseException:
        on_gone()
        ended()
        raise
    finally:
        watcher.cancel()  # the streaming response listens for the disconnect from here on
    if isinstance(first, BaseException):
        ended()
        raise failure(first)

    async def events() -> AsyncIterator[bytes]:
        closed = False
        item = first
        try:
            while True:
                if isinstance(item, Finished):
                    state.metrics.observe_stages(served.name, item.latencies)
                    _finishes(item, choices)
                    untold = [(i, c) for i, c in choices.ordered() if not c.told]
                    for index, choice in untold:
                        for chunk in opening(index, choice):
                            yield chunk
                        closing = shape.finish(index, choice.finish)
                        if index == untold[-1][0]:  # the receipt, as the whole answer's
                            closing["edge"] = {"placement": item.placement}
                        yield _sse(closing)
                    if include_usage:
                        yield _sse(shape.usage_chunk(item))
                    break
                if isinstance(item, BaseException):
                    refusal = failure(item)
                    request.scope[_OUTCOME_KEY] = refusal.outcome
                    yield _sse(describe(refusal))
                    break
                choice = choices[int(item.get("choice", 0))]
                offset = choice.offset
                for chunk in opening(int(item.get("choice", 0)), choice):
                    yield chunk
                index, choice = take(item)
                yield _sse(shape.chunk(index, str(item.get("text", "")),
                                       list(item.get("logprobs", ())), offset))
                if choice.finish is not None and not choice.told and any(
                        other.finish is None for other in choices.values()):
                    # the last choice to finish is told with the terminal event, whose
                    # finish chunk carries the placement receipt
                    choice.told = True
                    yield _sse(shape.finish(index, choice.finish))
                item = await feed.get()
            yield b"data: [DONE]\n\n"
            closed = True
        finally:
            ended()
            if not closed:  # the client went away (the response task was cancelled)
                on_gone()

    def opening(index: int, choice: _Choice) -> list[bytes]:
        """A chat choice's role chunk, before its first chunk of any other kind."""
        if choice.started:
            return []
        choice.started = True
        return [_sse(shape.role(index))] if shape.chat else []

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    body = await json_body(request, _COMPLETION_KEYS)
    served = _model(request, body)
    if served.openai != "prompt":
        raise _refuse("prompt", f"pipelines[{served.name}] starts with graph stages fed by "
                      "its prepare: send the image as an image_url part of a "
                      "/v1/chat/completions message")
    include_usage = _stream_options(body)
    params = {**_sampling(body, chat=False), **_prompt(body.get("prompt"))}
    deadline = deadline_of(request, body.get("deadline_s"))
    return await _generate(request, Generation(served, params, deadline),
                           _Shape(False, served.name, "logprobs" in params),
                           stream=body.get("stream") is True, include_usage=include_usage,
                           rename=_renamer(body, chat=False))


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    body = await json_body(request, _CHAT_KEYS)
    served = _model(request, body)
    include_usage = _stream_options(body)
    params = _sampling(body, chat=True)
    deadline = deadline_of(request, body.get("deadline_s"))
    chat = read_chat(body.get("messages"), images=served.openai == "image")
    if served.openai == "prompt":
        generation = Generation(served, {**params, "messages": chat.messages}, deadline)
    else:
        generation = Generation(served, params, deadline, image=chat.image,
                                chat=chat.messages)
    return await _generate(request, generation,
                           _Shape(True, served.name, "logprobs" in params),
                           stream=body.get("stream") is True, include_usage=include_usage,
                           rename=_renamer(body, chat=True))


async def models(request: Request) -> Response:
    """``GET /v1/models``: the generate pipelines."""
    state = _state(request)
    listed = [{"id": name, "object": "model", "created": int(served.pipeline.opened_at),
               "owned_by": "edge"}
              for name, served in state.pipelines.items()
              if served.openai is not None]
    return JSONResponse({"object": "list", "data": listed})


def routes() -> list[Route]:
    """The OpenAI-compatible routes."""
    return [Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"])]
