"""A loaded vLLM stage: the worker on the stage's route, the device check, streaming calls.

Built by the plugin's ``edge_load``. The controller never imports torch or vLLM: the worker
reports the platform and the devices the engine runs on, and this class refuses a stage
whose engine is not on the requested device type or GPUs (no silent CPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from edge_contracts.requests import EventKind, StageEvent, StageRequest
from edge_core.errors import DeadlineExceeded, ResourceUnavailable, StageClosed, WorkerError
from edge_core.placement import PlacementRefusal, PlacementReport, ProviderShare, WarmupReport
from edge_core.runtime.errors import RequestFailed
from edge_core.stage import RetainedOutputs, StageContext
from edge_core.workerstage import RETIRE_OUTCOME_ATTR, WorkerStage
from edge_vllm_cuda.gpus import Gpu, GpuProbe
from edge_vllm_cuda.options import DEFAULT_ENGINE_STOP_S, WORKER_ENV_NAMES, VllmOptions
from edge_vllm_cuda.sampling import (
    ContextLengthExceeded,
    GenerateParams,
    GenerateParamsInvalid,
    check_context,
    parse_generate_params,
)
from edge_vllm_cuda.texts import TEXT_BYTES, TEXT_LENGTHS, TextsMalformed, decode_texts, with_texts

__all__ = ["COUNT_MEMO_SIZE", "COUNT_TIMEOUT_S", "RETIRE_MARGIN_S", "WORKER_ENTRY",
           "WORKER_ENV_NAMES", "GenerateRefused", "VllmStage", "restore_texts", "worker_env"]

WORKER_ENTRY = "edge_vllm_cuda.worker:create"
_GIB = 1024**3
#: The parameters a prompt comes in: what a token count is asked about.
_PROMPT_KEYS = ("prompt", "prompt_token_ids", "prompts", "messages")
#: Most seconds :meth:`VllmStage.count_tokens` waits for the worker's answer; past it the
#: request goes on and the worker counts it after admission.
COUNT_TIMEOUT_S = 10.0
#: How many prompts' token counts a stage remembers (least recently used out first).
COUNT_MEMO_SIZE = 256


class GenerateRefused(GenerateParamsInvalid):
    """A generate request's parameters were refused before anything was sent.

    The request's own fault, with the code of the problem found (``invalid_value``,
    ``unsupported_parameter``, ``context_length_exceeded``).
    """



#: What the worker's shutdown may take beyond the EngineCore's ``engine_stop_s``: vLLM's
#: kill and clean-up, the engine's loop stopping, the worker's exit (seconds).
RETIRE_MARGIN_S = 3.0

_DEFAULTS = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1",
             "VLLM_DO_NOT_TRACK": "1"}


def worker_env(options: VllmOptions, gpus: tuple[Gpu, ...],
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables this backend sets for its worker: loopback queues, KV-cache size, GPUs.

    ``base`` (default: the controller's environment) only decides whether a default
    (``VLLM_LOGGING_LEVEL`` ...) was already chosen by the user. ``CUDA_VISIBLE_DEVICES``
    lists the physical indices in PCI bus order, so rank ``r`` runs on ``gpus[r]``; the
    worker's report of each rank's UUID is checked against them.
    """
    source = os.environ if base is None else base
    env = {name: source.get(name, default) for name, default in _DEFAULTS.items()}
    env["VLLM_HOST_IP"] = "127.0.0.1"
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if options.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(options.kv_cache_space_gib)
    else:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in gpus)
    return env


def _load_config(options: VllmOptions) -> dict[str, Any]:
    config: dict[str, Any] = {
        "device": options.device, "model": options.model, "dtype": options.dtype,
        "tensor_parallel_size": options.tensor_parallel_size,
        "enforce_eager": options.enforce_eager, "max_num_seqs": options.max_num_seqs,
        "seed": options.seed, "engine_stop_s": options.engine_stop_s,
    }
    if options.max_model_len is not None:
        config["max_model_len"] = options.max_model_len
    if options.device == "cuda":
        config["gpu_memory_utilization"] = options.gpu_memory_utilization
    return config


class VllmStage(WorkerStage):
    """A vLLM generate stage in its worker. Satisfies :class:`edge_core.stage.LoadedStage`."""

    options: VllmOptions
    gpus: tuple[Gpu, ...] = ()
    admission: threading.Lock
    #: Prompts' token counts as the worker answered them, by the prompt's sha256
    #: (:meth:`count_tokens`), most recently used last; guarded by ``counts_lock``.
    token_counts: OrderedDict[bytes, tuple[int, ...]]
    counts_lock: threading.Lock
    max_in_flight: int
    #: How long the worker's own shutdown may take before it is signalled: the options'
    #: ``engine_stop_s`` plus :data:`RETIRE_MARGIN_S` (set at open; this is the default's).
    #: Where the time goes (measured on a loaded 2-core host, benchmarks/serve_shutdown.py):
    #: vLLM SIGTERMs its EngineCore process, whose own teardown — the model runner's KV
    #: cache, the scheduler, torch.distributed's groups, then its interpreter's exit —
    #: took 3.6-5.8 s; vLLM waits ``engine_stop_s`` (default 10 s) for it, then kills the
    #: core (the worker's log says which). Then the worker ends at once
    #: (``exit_after_close``: without it the worker's own interpreter teardown took
    #: another 2.7-4.7 s), then the supervisor and vLLM's resource tracker leave (under
    #: 0.2 s). The whole retirement is bounded by this window plus the retire deadline
    #: (:attr:`edge_core.workerstage.WorkerStage.retire_graceful_s`): 10 + 3 + 5 = 18 s.
    retire_graceful_s = DEFAULT_ENGINE_STOP_S + RETIRE_MARGIN_S
    worker_env_names = WORKER_ENV_NAMES

    @classmethod
    def open(cls, stage: StageContext, probe: GpuProbe) -> VllmStage:
        """Start the worker, build the engine, refuse a device other than the requested one.

        Raises:
            PlacementRefusal: the engine's platform is not ``options.device``, or a rank
                runs on a GPU other than the requested one (the worker is retired first).
        """
        options: VllmOptions = stage.options
        gpus = tuple(g for g in (probe.by_index(i) for i in options.gpu_indices())
                     if g is not None)
        loaded = cls.start(
            stage, default_entry=WORKER_ENTRY, load_config=_load_config(options),
            stage_packages=("edge_vllm_cuda",), env=worker_env(options, gpus),
            device_id=gpus[0].uuid if gpus else None, load_timeout_s=options.load_timeout_s,
        )
        loaded.options = options
        loaded.retire_graceful_s = options.engine_stop_s + RETIRE_MARGIN_S
        loaded.gpus = gpus
        loaded.admission = threading.Lock()
        loaded.token_counts = OrderedDict()
        loaded.counts_lock = threading.Lock()
        loaded.max_in_flight = options.max_concurrency  # the runtime's slots follow it
        problem = _device_problem(loaded)
        if problem is not None:
            placement = _placement(loaded, loaded.load_report.get("devices", []))
            outcome = loaded.retire()
            refusal = PlacementRefusal(stage.stage_id, problem, placement)
            refusal.add_note(f"worker retired: verified={outcome.verified}")
            setattr(refusal, RETIRE_OUTCOME_ATTR, outcome)
            raise refusal
        return loaded

    def warm_up(self) -> WarmupReport:
        """Generate a few tokens; report the platform and each rank's device."""
        answer = self.warmup({"tokens": self.options.warmup_tokens},
                             timeout_s=self.options.load_timeout_s)
        placement = _placement(self, list(answer.get("devices", [])))
        extra = {"platform": answer.get("platform"), "engine_device": answer.get("engine_device"),
                 "warmup_tokens": answer.get("tokens"), "warmup_ms": answer.get("warmup_ms"),
                 "engine": self.load_report.get("engine"),
                 "gpus": [g.to_json() for g in self.gpus]}
        return WarmupReport(placement=placement, numerics=None, extra=extra)

    def in_flight(self) -> int:
        """Requests sent to the worker whose terminal event has not been read."""
        return self.client.calls_in_flight()

    def generate(self, request: StageRequest,
                 inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        """Check the request, enforce ``max_concurrency``, then send it.

        What can be counted without the model's tokenizer is checked against the context
        here, before anything is sent to the worker (the runtime gives the stage's slot
        back at once): token-id prompts, and a ``max_tokens`` that no prompt could fit
        beside. Text prompts and chats were counted before admission when the runtime
        called :meth:`check_params`; the worker counts them again, before the engine sees
        them (the last word: behind graph stages the prompt is built by a transform).

        The worker's DONE carries the choices' texts as output tensors (its data must fit
        the channel's header limit); the DONE yielded here has them back in its data as
        ``text`` and ``choices[i].text``, and not among its outputs
        (:func:`restore_texts`).

        Raises:
            GenerateRefused: malformed prompt or sampling parameters, tensor inputs, or a
                prompt and ``max_tokens`` that do not fit the context.
            ResourceUnavailable: ``max_concurrency`` requests are already in flight.
        """
        if inputs:
            raise GenerateRefused("inputs", "a generate request carries its prompt in params, "
                                  "not tensors", sorted(inputs))
        self._check_local(request.params)
        with self.admission:
            active = self.in_flight()
            if active >= self.options.max_concurrency:
                raise ResourceUnavailable(
                    f"stages[{self.context.stage_id}].backend.options.max_concurrency: every "
                    f"slot is in flight ({self.options.max_concurrency}): {active}")
            return restore_texts(self.call(request, inputs))

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Refuse what is wrong with a request's parameters before it is admitted.

        Malformed prompt or sampling parameters, token ids outside the vocabulary, and
        every prompt, ``max_tokens`` and their sum against the context: token-id prompts
        are counted here; text prompts and chats are counted by the worker with the
        model's own tokenizer and chat template (:meth:`count_tokens`: a ``query`` that
        takes no admission slot, no stage slot, and is answered while other requests
        stream). The runtime calls it before admission where the caller's parameters
        reach this stage as they are (:meth:`edge_core.runtime.pipeline.Pipeline.check_params`);
        it may wait for that one round trip to the worker, so an event loop calls it from
        a thread. When the count cannot be had (the worker is down, restarting, or does
        not answer in time) the request goes on and the worker's own check, after
        admission, answers it.

        Raises:
            GenerateRefused: as :meth:`generate` (each declares its ``request_fault``).
        """
        parsed = self._check_local(params)
        if parsed.messages is None and all(not isinstance(p, str)
                                           for p in parsed.engine_prompts()):
            return  # every prompt counted already
        counts = self.count_tokens(params)
        prompts = (None,) if parsed.messages is not None else parsed.engine_prompts()
        if counts is None or len(counts) != len(prompts):
            return  # no count: the worker's own check, after admission, answers
        several = parsed.prompts is not None
        try:
            for index, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
                if not isinstance(prompt, tuple):  # token ids were checked above
                    check_context(count, parsed, self.max_model_len,
                                  f"prompts[{index}]" if several else None)
        except GenerateParamsInvalid as exc:
            raise _refused(exc) from None

    def count_tokens(self, params: Mapping[str, Any]) -> tuple[int, ...] | None:
        """Each prompt's length in the model's tokens, as the worker counts it; None if unknown.

        Asks the worker (``query`` ``{"count_tokens": prompt}``, see
        :meth:`edge_vllm_cuda.worker.VllmHandler.query`): a chat is rendered with the
        model's chat template and generation prompt, texts tokenised with its tokenizer,
        as the worker does for the request itself. The answer for the same prompt is
        remembered (:data:`COUNT_MEMO_SIZE` prompts, by the sha256 of the prompt): a count
        is a function of the prompt and of this worker's tokenizer, fixed for the
        worker's life, so it is never stale, and the second check of one request (the
        serve routes check before their queue, the pipeline again before admission)
        costs no round trip. None when the worker cannot answer (down, restarting, no
        answer within :data:`COUNT_TIMEOUT_S`).

        Raises:
            GenerateRefused: the worker refused the prompt itself (a chat its template
                refuses, a token id outside the vocabulary).
        """
        prompt = {key: params[key] for key in _PROMPT_KEYS if key in params}
        key = hashlib.sha256(json.dumps(prompt, sort_keys=True, ensure_ascii=False)
                             .encode("utf-8", "surrogatepass")).digest()
        with self.counts_lock:
            counts = self.token_counts.get(key)
            if counts is not None:
                self.token_counts.move_to_end(key)
                return counts
        try:
            answer = self.query({"count_tokens": prompt}, timeout_s=COUNT_TIMEOUT_S)
        except (WorkerError, DeadlineExceeded, StageClosed):
            return None  # the worker's own count, after admission, answers the request
        refused = answer.get("refused")
        if isinstance(refused, Mapping):
            field = refused.get("param")
            error = GenerateRefused(field if isinstance(field, str) else "prompt",
                                    str(refused.get("reason")), refused.get("value"))
            error.request_fault = str(refused.get("code") or "invalid_value")
            raise error
        found = answer.get("prompt_tokens")
        if (not isinstance(found, list) or not found
                or not all(type(n) is int and n >= 0 for n in found)):
            return None  # not an answer this stage understands: the worker checks later
        counts = tuple(found)
        with self.counts_lock:
            self.token_counts[key] = counts
            while len(self.token_counts) > COUNT_MEMO_SIZE:
                self.token_counts.popitem(last=False)
        return counts

    def _check_local(self, params: Mapping[str, Any]) -> GenerateParams:
        """What needs no tokenizer: the values, token-id prompts, a ``max_tokens`` too big.

        Raises:
            GenerateRefused: as :meth:`generate`.
        """
        try:
            parsed = parse_generate_params(params)
            self._check_context(parsed)
        except GenerateParamsInvalid as exc:
            raise _refused(exc) from None
        return parsed

    @property
    def max_model_len(self) -> int:
        """The engine's context length in tokens (prompt plus generation)."""
        return int(self.load_report["engine"]["max_model_len"])

    def _check_context(self, params: GenerateParams) -> None:
        """Refuse what does not fit the context and needs no tokenizer to tell."""
        limit = self.max_model_len
        if params.max_tokens is not None and params.max_tokens >= limit:
            raise ContextLengthExceeded(
                "max_tokens", f"asks for {params.max_tokens} tokens; the stage's context "
                f"holds {limit} tokens, prompt and generation together: at most {limit - 1} "
                f"can be generated after the shortest prompt ({params.max_tokens - limit + 1} "
                "too many)", params.max_tokens)
        if params.messages is not None:
            return
        several = params.prompts is not None
        vocab = int(self.load_report["engine"].get("vocab_size") or 0)
        for index, prompt in enumerate(params.engine_prompts()):
            if not isinstance(prompt, str):
                field = f"prompts[{index}]" if several else params.prompt_field
                outside = next((i for i in prompt if i >= vocab), None) if vocab else None
                if outside is not None:
                    raise GenerateParamsInvalid(
                        field, f"token id outside the model's vocabulary of {vocab}",
                        outside)
                check_context(len(prompt), params, limit,
                              f"prompts[{index}]" if several else None)

    def describe(self) -> Mapping[str, object]:
        """The worker facts plus the engine's platform and devices."""
        described = dict(super().describe())
        described["devices"] = self.load_report.get("devices", [])
        described["platform"] = self.load_report.get("platform")
        return described


_TEXT_OUTPUTS = frozenset({TEXT_BYTES, TEXT_LENGTHS})


def restore_texts(events: Iterator[tuple[StageEvent, Mapping[str, Any]]],
                  ) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
    """The worker's events, its DONE with the choices' texts back in its data.

    The worker sends every choice's text as the outputs ``text_utf8`` and ``text_lengths``
    (:mod:`edge_vllm_cuda.texts`); the DONE yielded here has ``data.text`` (the first
    choice's) and each ``data.choices[i].text`` as they always were, and only the other
    outputs (``token_ids``, ``choice_lengths``), so results look as they did when the
    texts travelled in the data. Other events pass as they are. Like
    :meth:`~edge_core.workerstage.WorkerStage.call`'s iterator, this one keeps no
    reference to what it yielded (a view of worker memory still referenced when the
    result is acknowledged is kept from reuse); closing it closes the worker's.

    Raises:
        RequestFailed: the DONE's text outputs do not describe its choices
            (``TextsMalformed``: a worker of another version); their memory goes back.
    """
    try:
        while True:
            try:
                event, tensors = next(events)
            except StopIteration:
                return
            if event.kind is EventKind.DONE and TEXT_BYTES in tensors:
                event, tensors = _done_with_texts(event, tensors)
            box = [(event, tensors)]
            del event, tensors
            yield box.pop()
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def _done_with_texts(event: StageEvent, tensors: Mapping[str, Any],
                     ) -> tuple[StageEvent, Mapping[str, Any]]:
    """``event`` with its texts decoded into its data and their outputs left out."""
    try:
        texts = decode_texts(tensors, len(event.data.get("choices") or ()))
        data = with_texts(event.data, texts)
    except TextsMalformed as exc:
        release = tensors.release if isinstance(tensors, RetainedOutputs) else None
        del tensors
        if release is not None:
            release()
        raise RequestFailed(event.request_id, type(exc).__name__, str(exc)) from None
    names = list(tensors)  # in the order of the event's descriptors
    outputs = tuple(descriptor for name, descriptor in zip(names, event.outputs, strict=True)
                    if name not in _TEXT_OUTPUTS)
    kept = {name: tensors[name] for name in names if name not in _TEXT_OUTPUTS}
    restored: Mapping[str, Any] = (RetainedOutputs(kept, tensors.release)
                                   if isinstance(tensors, RetainedOutputs) else kept)
    return dataclasses.replace(event, data=data, outputs=outputs), restored


def _refused(error: GenerateParamsInvalid) -> GenerateRefused:
    """``error`` (and every problem it lists) as a :class:`GenerateRefused`, same code."""
    refused = GenerateRefused(error.field, error.reason, error.value, error.problems[1:])
    refused.request_fault = error.request_fault
    return refused


def _device_problem(stage: VllmStage) -> str | None:
    """Why the engine's devices are not the requested ones, or None."""
    report = stage.load_report
    platform = report.get("platform")
    if platform != stage.options.device or report.get("engine") is None:
        return (f"requested device {stage.options.device!r} but vLLM runs on the "
                f"{platform!r} platform in this environment; refusing rather than "
                "running elsewhere")
    engine_device = str(report["engine"].get("device", ""))
    if engine_device.split(":")[0] != stage.options.device:
        return (f"requested device {stage.options.device!r} but the engine was built on "
                f"{engine_device!r}")
    if stage.options.device == "cuda":
        seen = [d.get("uuid") for d in report.get("devices", [])]
        wanted = [g.uuid for g in stage.gpus]
        if seen != wanted:
            return f"ranks run on GPUs {seen}, not the requested {wanted}"
    return None


def _placement(stage: VllmStage, devices: list[Mapping[str, Any]]) -> PlacementReport:
    """The engine's ranks as a placement report: one provider, the platform."""
    platform = str(stage.load_report.get("platform"))
    names = [f"{d.get('device')} {d.get('name')}" + (f" {d['uuid']}" if d.get("uuid") else "")
             for d in devices]
    shares = {platform: ProviderShare(nodes=len(devices), op_types={"rank": len(devices)},
                                      node_names=names)} if devices else {}
    return PlacementReport(target=stage.options.device, available_providers=[platform],
                           providers=shares, method="engine-devices")
