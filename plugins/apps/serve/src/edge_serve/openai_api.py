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

``stream: true`` answers with server-sent events, one chunk per token event, then a chunk
with the finish reason, then ``data: [DONE]``.

A client that goes away cancels its request alone, never retiring a worker: the stage
fences it and a preemptible backend aborts it inside the engine (vLLM's ``abort``);
counted as outcome ``cancelled``. A
deadline (``deadline_s`` in the body, or ``X-Edge-Deadline``) does the same when it
passes: 504 before the first token, an error event after it.

Accepted besides the OpenAI fields: ``top_k``, ``min_tokens``, ``ignore_eos`` (passed to
the stage) and ``deadline_s``. Fields that would change the answer and are not served
(``n`` above 1, ``logprobs``, ``echo``, penalties, ``tools``, ...) are refused with 400.
Non-streamed answers carry an ``edge`` object: the stage's terminal event data (finish
reason, token counts, how many requests the engine still held when it finished).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_serve.bodies import deadline_of, json_body
from edge_serve.chat import read_chat
from edge_serve.generation import Finished, Generation, TokenFeed
from edge_serve.outcomes import HttpRefusal, deadline_passed, describe, from_exception
from edge_serve.served import ServedPipeline, retrieve
from edge_serve.submitted import watch_disconnect

__all__ = ["routes"]

_SAMPLING = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop", "top_k",
                       "min_tokens", "ignore_eos"})
_COMMON = frozenset({"model", "stream", "stream_options", "n", "user", "deadline_s"})
_COMPLETION_KEYS = _SAMPLING | _COMMON | {"prompt"}
_CHAT_KEYS = _SAMPLING | _COMMON | {"messages", "max_completion_tokens"}
_OUTCOME_KEY = "edge.outcome"
_PIPELINE_KEY = "edge.pipeline"


def _state(request: Request) -> Any:
    return request.app.state.edge


def _model(request: Request, body: Mapping[str, Any]) -> ServedPipeline:
    """The generate pipeline named by ``model``: 400 when absent, 404 when unknown."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise HttpRefusal(400, "model", "must name a served generate pipeline", name,
                          kind="InvalidValue")
    served: ServedPipeline | None = _state(request).pipelines.get(name)
    if served is None or served.openai is None:
        raise HttpRefusal(404, "model", "no generate pipeline of that name is served", name,
                          kind="NotFound")
    request.scope[_PIPELINE_KEY] = name
    return served


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The stage's sampling parameters (checked by the stage itself before sending)."""
    params = {key: body[key] for key in _SAMPLING if body.get(key) is not None}
    if body.get("max_completion_tokens") is not None:
        params["max_tokens"] = body["max_completion_tokens"]
    n = body.get("n")
    if n is not None and n != 1:
        raise HttpRefusal(400, "n", "only one choice per request is served", n,
                          kind="InvalidValue")
    return params


def _prompt(value: object) -> dict[str, Any]:
    """A completion's prompt: a string, a list of one string, or a list of token ids."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        return {"prompt": value}
    if isinstance(value, list) and value and all(isinstance(i, int) for i in value):
        return {"prompt_token_ids": value}
    raise HttpRefusal(400, "prompt", "must be a string, a list of one string or a list of "
                      "token ids", value, kind="InvalidValue")


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class _Shape:
    """How one of the two APIs spells its answers."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        self.created = int(time.time())

    def _envelope(self, choice: dict[str, Any], *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [choice]}

    def chunk(self, text: str, finish: str | None = None,
              role: bool = False) -> dict[str, Any]:
        """One streamed chunk."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role \
                else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return self._envelope(choice, chunk=True)

    def whole(self, text: str, finished: Finished) -> dict[str, Any]:
        """The non-streamed answer."""
        finish = finished.data.get("finish_reason")
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        answer = self._envelope(choice, chunk=False)
        answer["usage"] = usage(finished)
        answer["edge"] = {k: v for k, v in finished.data.items() if k != "text"}
        answer["edge"]["placement"] = finished.placement
        return answer

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        """The last chunk when the client asked for usage: no choices, the counts."""
        chunk = self._envelope({}, chunk=True)
        chunk["choices"] = []
        chunk["usage"] = usage(finished)
        return chunk


def usage(finished: Finished) -> dict[str, int]:
    """OpenAI's token counts from the terminal event."""
    prompt = int(finished.data.get("prompt_tokens", 0))
    completion = int(finished.data.get("num_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _sse(data: object) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def _generate(request: Request, generation: Generation, shape: _Shape, *,
                    stream: bool, include_usage: bool) -> Response:
    state = _state(request)
    served = generation.served
    deadline = generation.deadline_s
    served.require_ready()
    loop = asyncio.get_running_loop()
    feed = TokenFeed(loop)
    late = {"deadline": False}

    def cancel() -> None:  # off the loop: the stage may take a moment to answer
        loop.run_in_executor(None, generation.cancel).add_done_callback(retrieve)

    def on_deadline() -> None:
        late["deadline"] = True
        cancel()

    def on_gone() -> None:
        request.scope[_OUTCOME_KEY] = "cancelled"
        cancel()

    timer = loop.call_later(deadline, on_deadline) if deadline is not None else None
    loop.run_in_executor(served.executor, generation.run, feed)
    watcher = asyncio.ensure_future(watch_disconnect(request, on_gone))

    def failure(error: BaseException) -> HttpRefusal:
        if late["deadline"]:
            assert deadline is not None
            return deadline_passed(served.name, deadline)
        return from_exception(error, field="params")

    if not stream:
        texts: list[str] = []
        try:
            item = await feed.get()
            while not isinstance(item, (Finished, BaseException)):
                texts.append(str(item.get("text", "")))
                item = await feed.get()
        except BaseException:
            on_gone()
            raise
        finally:
            watcher.cancel()
            if timer is not None:
                timer.cancel()
        if isinstance(item, BaseException):
            raise failure(item)
        state.metrics.observe_stages(served.name, item.latencies)
        return JSONResponse(shape.whole("".join(texts), item))
    try:
        first = await feed.get()  # a refusal before the first token keeps its status
    except BaseException:
        on_gone()
        raise
    finally:
        watcher.cancel()  # the streaming response listens for the disconnect from here on
    if isinstance(first, BaseException):
        if timer is not None:
            timer.cancel()
        raise failure(first)

    async def events() -> AsyncIterator[bytes]:
        ended = False
        item = first
        try:
            if shape.chat:
                yield _sse(shape.chunk("", role=True))
            while True:
                if isinstance(item, Finished):
                    state.metrics.observe_stages(served.name, item.latencies)
                    last = shape.chunk("", finish=item.data.get("finish_reason"))
                    last["edge"] = {"placement": item.placement}  # as the whole answer's
                    yield _sse(last)
                    if include_usage:
                        yield _sse(shape.usage_chunk(item))
                    break
                if isinstance(item, BaseException):
                    refusal = failure(item)
                    request.scope[_OUTCOME_KEY] = refusal.outcome
                    yield _sse({"error": describe(refusal)})
                    break
                yield _sse(shape.chunk(str(item.get("text", ""))))
                item = await feed.get()
            yield b"data: [DONE]\n\n"
            ended = True
        finally:
            if timer is not None:
                timer.cancel()
            if not ended:  # the client went away (the response task was cancelled)
                on_gone()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    body = await json_body(request, _COMPLETION_KEYS)
    served = _model(request, body)
    if served.openai != "prompt":
        raise HttpRefusal(400, "prompt", f"pipelines[{served.name}] starts with graph stages "
                          "fed by its prepare: send the image as an image_url part of a "
                          "/v1/chat/completions message", kind="InvalidValue")
    params = {**_sampling(body), **_prompt(body.get("prompt"))}
    deadline = deadline_of(request, body.get("deadline_s"))
    return await _generate(request, Generation(served, params, deadline),
                           _Shape(False, served.name), stream=body.get("stream") is True,
                           include_usage=_include_usage(body))


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    body = await json_body(request, _CHAT_KEYS)
    served = _model(request, body)
    params = _sampling(body)
    deadline = deadline_of(request, body.get("deadline_s"))
    chat = read_chat(body.get("messages"), images=served.openai == "image")
    if served.openai == "prompt":
        generation = Generation(served, {**params, "messages": chat.messages}, deadline)
    else:
        generation = Generation(served, params, deadline, image=chat.image,
                                chat=chat.messages)
    return await _generate(request, generation, _Shape(True, served.name),
                           stream=body.get("stream") is True,
                           include_usage=_include_usage(body))


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
