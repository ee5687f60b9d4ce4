"""The ONNX Runtime handler for :mod:`edge_contracts.worker`: load, warm up, run.

Route entry: ``edge_ort.worker:create``. Imports only ``edge_contracts``, numpy and
whichever ``onnxruntime`` distribution the route's interpreter has.

The ``load`` configuration (JSON) names the graph, the target execution provider, the
provider list with options (or an EP library to register for plugin EPs such as QNN),
session settings, the example inputs and the reference outputs. If the target provider
is not available in this build, no session is created and the reply says so — ONNX
Runtime itself would only warn and run everything on CPU. With ``ep_context``
(``{dir, material}``) compiled graphs are kept and reused through
:mod:`edge_ort.epcontext`; the reply's ``ep_context`` says whether this load reused one.
"""

from __future__ import annotations

import importlib
import os
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_contracts.errors import InvalidValue
from edge_contracts.heap import apply_heap_policy, on_rest
from edge_contracts.shapesets import ShapeEntry, ShapeSet
from edge_contracts.worker import BaseHandler, Call
from edge_ort.assignment import (
    ASSIGNMENT_CONFIG_KEY,
    from_assignment_info,
    from_profile,
    supports_assignment,
)
from edge_ort.bucket import LoneAccepted, ServedShapes, spec_of
from edge_ort.element_types import check_example, check_graph_types
from edge_ort.npz import load_npz
from edge_ort.numerics import compare_outputs, json_number

if TYPE_CHECKING:  # imported where used: hashing and file utilities cost start-up time
    from edge_ort.epcontext import ArtifactDigests, ContextEntry

__all__ = ["InputValuesRefused", "OrtHandler", "ProviderRunFailed", "create"]

CPU = "CPUExecutionProvider"


_KNOWN = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-qnn",
          "onnxruntime-vitisai", "onnxruntime-openvino", "onnxruntime-training")
_OWN_INIT = "onnxruntime/__init__.py,"


def _distribution_of_onnxruntime() -> str:
    """Which distribution provides the imported ``onnxruntime`` (they overwrite each other).

    Reads the ``RECORD`` of the known distributions' ``.dist-info`` folders next to the
    imported package (one directory listing: this is on the worker's start-up path);
    other layouts fall back to a full ``importlib.metadata`` search.
    """
    import onnxruntime as ort

    return _distribution_in(os.path.dirname(os.path.realpath(ort.__file__)))


def _distribution_in(package_dir: str) -> str:
    """The known distribution whose ``RECORD`` owns ``package_dir``'s ``__init__.py``."""
    site = os.path.dirname(package_dir)
    wanted = {name.replace("-", "_"): name for name in _KNOWN}
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.endswith(".dist-info"):
            continue
        project = entry[: -len(".dist-info")].rsplit("-", 1)[0].lower().replace("-", "_")
        name = wanted.get(project.replace(".", "_"))
        if name is None:
            continue
        try:
            with open(os.path.join(site, entry, "RECORD"), encoding="utf-8") as handle:
                record = "\n" + handle.read().replace("\\", "/")
        except OSError:
            continue
        if "\n" + _OWN_INIT in record:
            return name
    return _search_distributions(package_dir)


def _search_distributions(package_dir: str) -> str:
    """The slow, general search: every known distribution's recorded files."""
    from importlib.metadata import PackageNotFoundError, distribution

    for name in _KNOWN:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        for file in dist.files or ():
            if str(file).replace("\\", "/") != "onnxruntime/__init__.py":
                continue
            located = os.path.realpath(str(dist.locate_file(file)))
            if os.path.dirname(located) == package_dir:
                return name
    return "unknown"


_NDARRAY = np.ndarray  # (one global lookup per request, not two)


def _load_npz(path: str, sha256: str | None = None) -> dict[str, np.ndarray]:
    return load_npz(path, sha256)  # numpy.load's zipfile import costs ~7 ms of the start-up


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32,
    "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def _static_outputs(outputs: list[Any]) -> list[tuple[str, tuple[int, ...], np.dtype[Any], int]]:
    """``(name, shape, dtype, nbytes)`` of every output when all are static, else ``[]``.

    Static means a numpy-representable tensor type and every dimension a fixed integer,
    so that a buffer can be bound before the run.
    """
    found = []
    for output in outputs:
        dtype = _ORT_TYPES.get(str(output.type))
        shape = output.shape
        if dtype is None or not all(type(d) is int and d >= 0 for d in shape):
            return []
        np_dtype = np.dtype(dtype)
        found.append((str(output.name), tuple(shape), np_dtype,
                      int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize))
    return found


def _observed_outputs(
    outputs: Mapping[str, np.ndarray],
) -> list[tuple[str, tuple[int, ...], np.dtype[Any], int]]:
    """``(name, shape, dtype, nbytes)`` of a static bucket's warm-up outputs."""
    return [(name, tuple(int(d) for d in a.shape), a.dtype, int(a.nbytes))
            for name, a in outputs.items()]


def _call_run(session: Any, entries: list[frozenset[str]]) -> Any:
    """What a call runs ``session`` with: its ``run``, or the compiled session's own.

    ``InferenceSession.run`` checks, in Python, on every call, what no call of this
    worker needs checked, then calls the compiled session's ``run`` (the same
    arguments, the same errors: ``InvalidArgument`` for input values the graph
    refuses): that every required input is fed (each of ``entries``, the input names
    of a served shape entry, which a call's inputs equal once matched, holds them
    all), that no input is an ``OrtValue`` of another device (a call's inputs are
    arrays from the channel) and that no WebGPU graph capture is on; on an ``EPFail``
    it would retry on its fallback providers, were that not disabled on every session
    this worker makes (:meth:`OrtHandler._create_session`). So the compiled session's
    ``run`` is taken only for a session on the CPU provider alone (no fallback to give
    up, no graph capture), whose entries all hold every required input, in a build that
    has one; else ``session.run``.
    """
    inner = getattr(getattr(session, "_sess", None), "run", None)
    if inner is None or list(session.get_providers()) != [CPU]:
        return session.run
    required = {i.name for i in session.get_inputs() if not i.type.startswith("optional")}
    if not entries or not all(required <= names for names in entries):
        return session.run
    return inner


def _brief(numerics: Mapping[str, Any]) -> dict[str, Any]:
    """A bucket's numerics with the detail of its failed outputs only (the reply stays small).

    A failed output's record says why (missing, shape, dtype, values beyond the bound with
    the worst element): the gate's refusal names it.
    """
    brief = {k: v for k, v in numerics.items() if k != "outputs"}
    failed = {name: record for name, record in (numerics.get("outputs") or {}).items()
              if not record.get("passed", True)}
    if failed:
        brief["outputs"] = failed
    return brief


def _worst(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One numerics record for all buckets: passed when each passed, the worst errors."""
    compared = [r for r in records if r.get("reference") not in (None, "none")]
    if len(records) == 1 or not compared:
        return dict(records[0])
    kinds = sorted({str(r["reference"]) for r in compared})
    return {
        "reference": kinds[0] if len(kinds) == 1 else "+".join(kinds),
        "bound": compared[0].get("bound"),
        "max_abs_error": json_number(max(float(r.get("max_abs_error", 0.0)) for r in compared)),
        "normalised_error": json_number(max(float(r.get("normalised_error", 0.0))
                                            for r in compared)),
        "passed": all(bool(r.get("passed")) for r in records),
        "buckets_compared": len(compared),
        "buckets": len(records),
    }


class InputValuesRefused(ValueError):
    """ONNX Runtime refused a request's input values while running it (``INVALID_ARGUMENT``).

    The inputs had passed the stage's shape set, on a graph whose warm-up ran at every
    gated shape: what the runtime refuses then is in the values (an index out of range,
    dimensions a reshape cannot take), so it is the request's own fault
    (:mod:`edge_contracts.request_faults`: ``invalid_value``, field ``inputs``; a front end
    answers 400). Its message is the runtime's.
    """

    request_fault = "invalid_value"
    field = "inputs"


class ProviderRunFailed(RuntimeError):
    """The stage's execution provider failed a run (ONNX Runtime's ``EP_FAIL``).

    ONNX Runtime's Python ``InferenceSession`` would rerun the call on the CPU provider
    and serve every later call there, while the stage's placement still named its target;
    this worker disables that fallback on every session it makes, so the request fails
    with this error instead (a server error, not the request's fault) and the session
    stays on the providers it was placed on. Its message names the target provider and
    carries the runtime's own message.
    """


class OrtHandler(BaseHandler):
    """One ONNX Runtime session in a worker process."""

    #: The process ends right after :meth:`close` (which drops every session and the
    #: profiling directory; ONNX Runtime holds no child process and no file to flush):
    #: the interpreter's teardown — collecting the sessions, numpy and onnxruntime's
    #: modules — only delayed the worker's exit, and so every retirement.
    exit_after_close = True

    def __init__(self) -> None:
        self._heap = apply_heap_policy()  # before the sessions allocate (a worker forked
        # from a warm pool's zygote found onnxruntime imported: its import's allocations)
        import onnxruntime as ort

        self._ort = ort
        # the runtime's own refusal of a call's input values (every distribution has it)
        state = getattr(getattr(ort, "capi", None), "onnxruntime_pybind11_state", None)
        self._invalid_argument: type[BaseException] = getattr(
            state, "InvalidArgument", InputValuesRefused)
        # an execution provider's failure in a run (its Python session would retry on CPU)
        self._ep_fail: type[BaseException] = getattr(state, "EPFail", ProviderRunFailed)
        self._run_options: Any = None  # per-call options (arena shrinkage), once loaded
        self._arena_registered = False
        # (session, its smallest warm-up inputs) per session: run with shrinkage at rest
        self._at_rest: list[tuple[Any, dict[str, np.ndarray]]] = []
        self._shrink_options: Any = None
        self._session: Any = None
        # what a call runs the session (and each bucket's) with: see _call_run
        self._session_run: Any = None
        self._bucket_runs: dict[str, Any] = {}
        # The CPU session a warm-up compares a non-CPU target with (no expected outputs):
        # made at load from the graph the target's session loaded, dropped after warm-up.
        self._reference_session: Any = None
        self._output_names: list[str] = []
        self._lone_output: str | None = None  # the graph's only output's name, if one
        self._static_outputs: list[tuple[str, tuple[int, ...], np.dtype[Any], int]] = []
        self._served: ServedShapes | None = None
        # id(session) -> (session, its IOBinding, output name -> (address, shape, dtype)
        # bound last): large static outputs are bound once, not on every call
        self._bindings: dict[int, tuple[Any, Any, dict[str, tuple[int, Any, Any]]]] = {}
        # Static entry name -> its own session (``session_per_bucket``: static-only EPs
        # compile one graph per bucket) and the outputs its warm-up observed.
        self._bucket_sessions: dict[str, Any] = {}
        self._entry_outputs: dict[str, list[tuple[str, tuple[int, ...], np.dtype[Any], int]]] = {}
        self._largest: dict[str, int] = {}  # entry name -> its largest static output's bytes
        self._config: Mapping[str, Any] = {}
        self._digests: ArtifactDigests | None = None  # a load's EP-context artifact digests
        self._profile_dir: str | None = None
        self._method = "none"
        self._target = CPU

    def versions(self) -> Mapping[str, str]:
        """ONNX Runtime version and distribution, and numpy's version."""
        return {
            "onnxruntime": str(self._ort.__version__),
            "onnxruntime_distribution": _distribution_of_onnxruntime(),
            "numpy": np.__version__,
        }

    # -- load --------------------------------------------------------------------------

    def _register_libraries(self, libraries: list[Mapping[str, Any]]) -> list[str]:
        registered = []
        for lib in libraries:
            path = lib.get("path")
            if not path and lib.get("module"):
                module = importlib.import_module(str(lib["module"]))
                path = getattr(module, str(lib.get("function", "get_library_path")))()
            self._ort.register_execution_provider_library(str(lib["name"]), str(path))
            registered.append(str(lib["name"]))
        return registered

    def _available(self) -> list[str]:
        names = list(self._ort.get_available_providers())
        get_devices = getattr(self._ort, "get_ep_devices", None)
        if get_devices is not None:
            for device in get_devices():
                if device.ep_name not in names:
                    names.append(str(device.ep_name))
        return names

    def _register_arena(self) -> None:
        """The process's shared CPU arena, growing by what is requested (once)."""
        if self._arena_registered:
            return
        ort = self._ort
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                 ort.OrtMemType.DEFAULT)
        # (max_mem 0: no limit, strategy 1: kSameAsRequested, -1: defaults)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))
        self._arena_registered = True

    def _context_entry(self, config: Mapping[str, Any],
                       bucket: Mapping[str, Any] | None = None) -> ContextEntry | None:
        """The EP-context cache entry for ``config["ep_context"]`` (``{dir, material}``).

        With ``bucket`` (a static entry's JSON) the entry is that bucket's own: one
        compiled graph per bucket, keyed by its shapes too.
        """
        context = config.get("ep_context")
        if not context:
            return None
        from edge_ort.epcontext import (
            ArtifactDigests,
            ContextEntry,
            context_key,
            verified_sha256s,
        )

        if self._digests is None:  # once per load: the bundle's verified sha256s
            bundle = config.get("bundle_manifest")
            self._digests = ArtifactDigests(
                verified_sha256s(str(bundle["directory"]), str(bundle["sha256"]))
                if bundle else None)

        versions = {"onnxruntime": str(self._ort.__version__)}
        for lib in config.get("ep_libraries", []):
            if lib.get("module"):
                module = importlib.import_module(str(lib["module"]))
                versions[str(lib["module"])] = str(getattr(module, "__version__", "unknown"))
        material = dict(context.get("material", {}))
        if bucket is not None:
            material["bucket"] = dict(bucket)
        key = context_key(self._digests.of(str(config["graph"])), material, versions)
        return ContextEntry(str(context["dir"]), key)

    def _session_options(self, config: Mapping[str, Any]) -> Any:
        """Fresh ``SessionOptions`` with the configured threads, entries and placement method."""
        options = self._ort.SessionOptions()
        options.log_severity_level = int(config.get("log_severity_level", 3))
        if config.get("intra_op_threads"):
            options.intra_op_num_threads = int(config["intra_op_threads"])
        options.enable_cpu_mem_arena = bool(config.get("cpu_mem_arena", True))
        if (options.enable_cpu_mem_arena
                and config.get("arena_extend_strategy") == "same_as_requested"):
            self._register_arena()
            options.add_session_config_entry("session.use_env_allocators", "1")
        for key, value in dict(config.get("session_config", {})).items():
            options.add_session_config_entry(str(key), str(value))
        if self._method == "assignment":
            options.add_session_config_entry(ASSIGNMENT_CONFIG_KEY, "1")
        elif self._method == "profiling":
            import tempfile

            if self._profile_dir is None:
                self._profile_dir = tempfile.mkdtemp(prefix="edge-ort-profile-")
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(self._profile_dir, "warmup")
        return options

    def _create_session(self, config: Mapping[str, Any], options: Any,
                        context: ContextEntry | None,
                        bucket: str | None = None) -> tuple[Any, dict[str, Any] | None]:
        """One session on the configured providers, reusing or writing an EP context.

        For a bucket's own session, the provider options named in ``bucket_keyed_options``
        (a provider's own cache key, say) get ``-<bucket>`` appended, so that buckets never
        share a provider-side cache entry.
        """
        ort = self._ort
        providers = [(str(name), dict(opts)) for name, opts in config.get("providers", [])]
        if bucket is not None:
            for _, opts in providers:
                for key in config.get("bucket_keyed_options", ()):
                    if key in opts:
                        opts[key] = f"{opts[key]}-{bucket}"
        graph = str(config["graph"])
        if context is not None and context.present:
            graph = str(context.model)
        elif context is not None:
            for key, value in context.session_entries().items():
                options.add_session_config_entry(key, value)
        try:
            if config.get("plugin_ep"):
                devices = [d for d in ort.get_ep_devices() if d.ep_name == self._target]
                options.add_provider_for_devices(devices, dict(providers[0][1])
                                                 if providers else {})
                session = ort.InferenceSession(graph, options)
            else:
                session = ort.InferenceSession(
                    graph, options,
                    providers=[n for n, _ in providers] or [CPU],
                    provider_options=[o for _, o in providers] or None,
                )
        except BaseException:
            if context is not None:
                context.abandon()
            raise
        # ONNX Runtime's Python session reruns a call that fails with EP_FAIL on the CPU
        # provider and serves every later call there, while the stage's placement (checked
        # at warm-up) still names the target: no silent fallback, the call fails instead
        # (:class:`ProviderRunFailed`). A session that fell back to the CPU at creation has
        # this off already; the warm-up's placement check refuses it.
        session.disable_fallback()
        if context is None:
            return session, None
        reused = graph != str(config["graph"])
        return session, {"key": context.key, "reused": reused,
                         "written": False if reused else context.commit(),
                         "path": str(context.path)}

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create the session(s); report the providers available and used.

        With ``session_per_bucket`` every static entry of ``shape_set`` gets a session of
        its own whose symbolic dimensions are fixed to the bucket's sizes (what a
        static-only execution provider compiles); dynamic entries use the plain session.

        Raises:
            ElementTypeRefused: an input or output of the graph has a tensor type the
                stage does not carry (``bfloat16``, the ``float8`` types, ``string`` ...:
                :mod:`edge_ort.element_types`), naming it and its type.
        """
        ort = self._ort
        self._config = config
        self._digests = None
        self._target = str(config.get("target", CPU))
        registered = self._register_libraries(list(config.get("ep_libraries", [])))
        available = self._available()
        report: dict[str, Any] = {
            "target": self._target,
            "available_providers": available,
            "registered_libraries": registered,
            "target_available": self._target in available,
        }
        if self._target not in available:
            return report
        method = str(config.get("placement_method", "auto"))
        if method == "auto":
            method = "assignment" if supports_assignment(ort.InferenceSession) else "profiling"
        elif method == "assignment" and not supports_assignment(ort.InferenceSession):
            # refused here, not at warm-up (where the missing method raised AttributeError)
            raise InvalidValue(
                "placement_method", method,
                f"this onnxruntime build ({getattr(ort, '__version__', 'unknown')}) has no "
                "InferenceSession.get_provider_graph_assignment_info (onnxruntime >= 1.24.1 "
                "has it; -qnn, -directml and vendor builds may not); 'auto' or 'profiling' "
                "work here")
        self._method = method
        if config.get("shape_set"):
            self._served = ServedShapes(ShapeSet.from_json(config["shape_set"]))
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            members = {str(n): str(g) for n, g in dict(config.get("bucket_graphs") or {}).items()}
            fixed = ({name: {} for name in members} if members
                     else self._bucket_dimensions(config))
            if fixed:
                report["bucket_sessions"] = self._load_bucket_sessions(config, fixed, members)
            served = self._served
            if not fixed or served is None or any(not e.static for e in served.shapes.entries):
                self._session, cached = self._create_session(
                    config, self._session_options(config), self._context_entry(config))
                if cached is not None:
                    report["ep_context"] = cached
            else:  # every entry has its own session: no session for other shapes
                self._session = next(iter(self._bucket_sessions.values()))
        # a tensor type the stage does not carry (bfloat16, float8, string ...): refused
        # here, by name, not by ONNX Runtime's message at the warm-up or a call (a bucket's
        # own graph, a derived bundle's static copy, is checked too)
        for session in (self._session, *self._bucket_sessions.values()):
            check_graph_types(session.get_inputs(), session.get_outputs())
        self._session_run = self._session.run  # until a warm-up checked the entries
        self._bucket_runs = {name: s.run for name, s in self._bucket_sessions.items()}
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._lone_output = self._output_names[0] if len(self._output_names) == 1 else None
        self._static_outputs = _static_outputs(self._session.get_outputs())
        self._largest.clear()
        load_ms = (time.perf_counter() - started) * 1e3
        reference = self._load_reference(config)
        if reference is not None:
            report["reference"] = reference
        arena = bool(config.get("cpu_mem_arena", True))
        shrinkage = str(config.get("arena_shrinkage", "never")) if arena else "never"
        self._shrink_options = _run_options()
        self._shrink_options.add_run_config_entry("memory.enable_memory_arena_shrinkage",
                                                  "cpu:0")
        # Never None: the compiled run converts its run-options argument with pybind11,
        # which, given None, first looks for a foreign module's converter on NoneType (a
        # failed attribute lookup that formats and clears an AttributeError, every call)
        # before it takes None as ONNX Runtime's defaults; an empty RunOptions is those
        # defaults, matched at once by its exact type.
        self._run_options = (self._shrink_options if shrinkage == "every-call"
                             else _run_options())
        if shrinkage == "at-rest" and (self._heap.get("policy") != "rest"
                                       or self._target != CPU):
            # nothing tells this worker when it rests; or its runs are on another device
            # (the tiny run that shrinks would run there: on a simulator, for seconds)
            shrinkage = "never"
        if shrinkage == "at-rest":
            on_rest(self._shrink_at_rest)
        report.update({
            "memory": {"heap": dict(self._heap), "cpu_mem_arena": arena,
                       "arena_extend_strategy": str(config.get("arena_extend_strategy",
                                                               "next_power_of_two")),
                       "arena_shrinkage": shrinkage},
            # Static output shapes: large outputs are written by ONNX Runtime straight
            # into shared memory (IOBinding), with no copy after the run.
            "outputs_in_place": bool(self._static_outputs),
            "session_providers": list(self._session.get_providers()),
            "placement_method": method,
            "load_ms": load_ms,
            "warnings": [str(w.message) for w in caught],
            "inputs": [{"name": i.name, "type": i.type, "shape": list(i.shape)}
                       for i in self._session.get_inputs()],
            "outputs": [{"name": o.name, "type": o.type, "shape": list(o.shape)}
                        for o in self._session.get_outputs()],
        })
        return report

    def _load_reference(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """Make the CPU session the warm-up compares with, when it needs one; its report.

        Needed for a target other than the CPU provider when a warm-up case has no
        expected outputs. Made here, from the graph file the target's session has just
        loaded, not at the warm-up: the controller checks once the load has ended that
        nothing of a bundle verified in place changed (a ``stat`` per file), which covers
        this session's reads too, so the reference is the graph verified — a bundle
        rewritten before the warm-up is never compared with. It is dropped once the
        warm-up ends (and at :meth:`close`): its memory is held from the load to the end
        of the warm-up rather than during the warm-up alone, and one session serves every
        case (one was made per case before).
        """
        self._reference_session = None
        cases = list(config.get("warmup_cases") or []) or [config]  # as :meth:`_cases`
        if self._target == CPU or all(case.get("expected_outputs") for case in cases):
            return None
        started = time.perf_counter()
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        self._reference_session = self._ort.InferenceSession(
            str(config["graph"]), options, providers=[CPU])
        return {"providers": [CPU], "load_ms": (time.perf_counter() - started) * 1e3}

    def _bucket_dimensions(self, config: Mapping[str, Any]) -> dict[str, dict[str, int]]:
        """Static entry -> the graph's symbolic dimensions fixed to its sizes, by name.

        Empty unless ``session_per_bucket`` is set and the graph has symbolic input
        dimensions (a static graph needs no per-bucket session). The names are read from
        a CPU session without optimisations (cheap; nothing is compiled).
        """
        if not config.get("session_per_bucket") or self._served is None:
            return {}
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        probe = self._ort.InferenceSession(str(config["graph"]), options, providers=[CPU])
        symbolic = {i.name: list(i.shape) for i in probe.get_inputs()}
        del probe
        found: dict[str, dict[str, int]] = {}
        for entry in self._served.shapes.entries:
            if not entry.static:
                continue
            sizes: dict[str, set[int]] = {}
            for name, spec in entry.inputs.items():
                for axis, dim in enumerate(symbolic.get(name, [])):
                    size = spec.dims[axis] if axis < len(spec.dims) else None
                    if isinstance(dim, str) and dim and isinstance(size, int):
                        sizes.setdefault(dim, set()).add(size)
            # A name shared by axes of different sizes (PaddlePaddle exports call every
            # spatial axis "?") cannot be fixed by name: it stays symbolic.
            found[entry.name] = {dim: next(iter(v)) for dim, v in sizes.items() if len(v) == 1}
        return found if any(found.values()) else {}

    def _load_bucket_sessions(self, config: Mapping[str, Any],
                              fixed: Mapping[str, Mapping[str, int]],
                              members: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One session per static entry, its symbolic dimensions fixed by name.

        An entry listed in ``members`` (a derived bundle's ``bucket_graphs``: a static
        copy of the graph per bucket) loads that graph as it is, with nothing overridden.
        """
        assert self._served is not None
        members = members or {}
        found: dict[str, Any] = {}
        for name, dimensions in fixed.items():
            entry = self._served.shapes.entry(name)
            own = {**config, "graph": members[name]} if name in members else config
            options = self._session_options(config)
            for dim_name, size in dimensions.items():
                options.add_free_dimension_override_by_name(dim_name, size)
            session, cached = self._create_session(
                own, options, self._context_entry(own, entry.to_json()), name)
            self._bucket_sessions[name] = session
            found[name] = {"fixed": dict(dimensions), "ep_context": cached,
                           "session_providers": list(session.get_providers())}
            if name in members:
                found[name]["graph"] = os.path.basename(members[name])
        return found

    # -- warm-up -----------------------------------------------------------------------

    def _session_for(self, entry: ShapeEntry | None) -> Any:
        if entry is not None:
            return self._bucket_sessions.get(entry.name, self._session)
        return self._session

    def _run(self, inputs: Mapping[str, np.ndarray],
             session: Any = None) -> dict[str, np.ndarray]:
        values = (session or self._session).run(self._output_names, dict(inputs),
                                                self._run_options)
        return dict(zip(self._output_names, values, strict=True))

    def _reference(self, inputs: Mapping[str, np.ndarray], expected: str | None,
                   sha256: str | None) -> tuple[str, dict[str, np.ndarray]]:
        if expected:
            return "expected-outputs", _load_npz(str(expected), sha256)
        if self._target == CPU:
            return "none", {}
        cpu = self._reference_session
        if cpu is None:  # made at load for every warm-up that needs it, and only one runs
            raise RuntimeError("warmup: no CPU reference session (it is made at load, "
                               "for the load's one warm-up)")
        names = [o.name for o in cpu.get_outputs()]
        return "cpu-run", dict(zip(names, cpu.run(names, dict(inputs)), strict=True))

    def _placement(self, session: Any) -> dict[str, Any]:
        if self._method == "assignment":
            return from_assignment_info(session)
        if self._method == "profiling":
            return from_profile(session.end_profiling())
        return {}

    def _cases(self) -> list[dict[str, Any]]:
        """The warm-up cases: the configured ones, else the single example bucket."""
        cases = list(self._config.get("warmup_cases") or [])
        if cases:
            return cases
        return [{"entry": "example", "point": "static",
                 "example_inputs": self._config["example_inputs"],
                 "example_inputs_sha256": self._config.get("example_inputs_sha256"),
                 "expected_outputs": self._config.get("expected_outputs"),
                 "expected_outputs_sha256": self._config.get("expected_outputs_sha256")}]

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run every warm-up case; report placement and numerics per bucket.

        Every declared entry of the shape set is run at least once (a dynamic one at its
        minimum, its maximum and a shape between); placement is observed per session (one
        per static bucket with ``session_per_bucket``), numerics per case. The top-level
        ``placement`` and ``numerics`` are the first case's and the worst of all.

        A case's example inputs and expected outputs come with the sha256 the verified
        manifest gives them (``example_inputs_sha256``, ``expected_outputs_sha256``): each
        file is read once and only bytes with that sha256 are used, else
        :class:`~edge_ort.npz.ArchiveChanged` stops the warm-up (the controller refuses
        the stage with ``BundleChanged``).

        An example array whose dtype is not its graph input's is refused by name
        (:class:`~edge_ort.element_types.ElementTypeRefused`, field
        ``example_inputs.<name>``, or ``validation.shapes[i].examples[j].example_inputs.<name>``
        for a declared case) before it is run.

        A case without expected outputs on a target other than the CPU provider is
        compared with a run of the CPU session made at load (:meth:`_load_reference`),
        which is dropped when the warm-up ends.
        """
        try:
            return self._warm_up()
        finally:
            self._reference_session = None

    def _warm_up(self) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("warmup: no session (the target provider was unavailable)")
        session_inputs = [i.name for i in self._session.get_inputs()]
        buckets: list[dict[str, Any]] = []
        full: list[Mapping[str, Any]] = []
        placements: dict[int, dict[str, Any]] = {}
        smallest: dict[int, tuple[int, Any, dict[str, np.ndarray]]] = {}
        total_ms = 0.0
        for case in self._cases():
            example = _load_npz(str(case["example_inputs"]), case.get("example_inputs_sha256"))
            # by name, not by ONNX Runtime's message: the manifest's example file, or a
            # declared case's own (validation.shapes[i].examples[j].example_inputs)
            where = str(case.get("field") or "example_inputs")
            check_example(self._session.get_inputs(), example, where,
                          os.path.basename(str(case["example_inputs"])))
            specs = {n: spec_of(a) for n, a in example.items()}
            if self._served is None:
                self._served = ServedShapes(ShapeSet.single(specs))
            missing = sorted(set(session_inputs) - set(example))
            if missing:
                raise ValueError(f"warmup.example_inputs: inputs of the graph missing: {missing}")
            entry = self._served.match(specs)
            session = self._session_for(entry)
            started = time.perf_counter()
            outputs = self._run(example, session)
            elapsed = (time.perf_counter() - started) * 1e3
            total_ms += elapsed
            size = sum(int(a.nbytes) for a in example.values())
            if id(session) not in smallest or size < smallest[id(session)][0]:
                smallest[id(session)] = (size, session, dict(example))
            if entry.static and entry.name not in self._entry_outputs:
                self._entry_outputs[entry.name] = _observed_outputs(outputs)
            if id(session) not in placements and self._method != "profiling":
                placements[id(session)] = self._placement(session)
            kind, reference = self._reference(example, case.get("expected_outputs"),
                                              case.get("expected_outputs_sha256"))
            if reference:
                numerics = compare_outputs(outputs, reference,
                                           self._config.get("numerics_bound"), kind)
            else:
                numerics = {"reference": "none", "passed": True,
                            "note": "target is the CPU provider and the bundle has no "
                                    "expected outputs here: nothing independent to compare"}
            buckets.append({"entry": entry.name, "point": case.get("point", "static"),
                            "shapes": {n: list(sh) for n, (_, sh) in sorted(specs.items())},
                            "session": str(id(session)), "numerics": _brief(numerics),
                            "warmup_ms": elapsed})
            full.append(numerics)
        if self._method == "profiling":  # one profile per session, ended once
            for session in {id(s): s for s in (self._session, *self._bucket_sessions.values())
                            }.values():
                placements[id(session)] = self._placement(session)
        self._at_rest = [(session, example) for _, session, example in smallest.values()]
        entries = ([frozenset(e.inputs) for e in self._served.shapes.entries]
                   if self._served is not None else [])
        self._session_run = _call_run(self._session, entries)
        self._bucket_runs = {name: _call_run(s, entries)
                             for name, s in self._bucket_sessions.items()}
        worst = _worst(full)
        first = placements.get(int(buckets[0]["session"]), {})
        return {
            "placement": {
                "target": self._target,
                "method": {"assignment": "graph-assignment-info"}.get(self._method,
                                                                      self._method),
                "available_providers": self._available(),
                "session_providers": list(self._session.get_providers()),
                "providers": first,
            },
            "numerics": worst,
            # One placement per session (the reply would outgrow a frame header if every
            # bucket repeated its session's node names); buckets name their session.
            "placements": {str(key): value for key, value in placements.items()},
            "buckets": buckets,
            "shape_set": self._served.to_json() if self._served is not None else [],
            "warmup_ms": total_ms,
        }

    # -- serving -----------------------------------------------------------------------

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Run one request on the session of the entry that serves its shapes."""
        served = self._served
        if served is None:
            raise RuntimeError("run: the stage was not warmed up")
        try:  # no cost unless raised (3.11's exception table)
            inputs = call.inputs
            accepted = served.accepted
            if len(inputs) == 1:  # the last lone array accepted, again: no match
                ((name, array),) = inputs.items()
                if (accepted is not None and type(array) is _NDARRAY
                        and accepted.name == name and array.shape == accepted.shape
                        and array.dtype == accepted.dtype):
                    entry = accepted.entry
                else:
                    entry = served.shapes.match({name: spec_of(array)})
                    if type(array) is _NDARRAY:
                        served.accepted = LoneAccepted(served.shapes, name, array, entry)
            else:
                specs = {}
                for name, array in inputs.items():  # a loop, not a comprehension: no call
                    specs[name] = spec_of(array)  # on 3.11
                entry = served.shapes.match(specs)
            bucket_sessions = self._bucket_sessions  # _session_for, inline
            if bucket_sessions:
                session = bucket_sessions.get(entry.name, self._session)
                run = self._bucket_runs.get(entry.name, self._session_run)
            else:
                session, run = self._session, self._session_run
            threshold = call.zero_copy_bytes
            static = self._static_outputs or self._entry_outputs.get(entry.name, [])
            if static and threshold is not None:
                largest = self._largest.get(entry.name)
                if largest is None:  # once per entry, not per call
                    largest = self._largest[entry.name] = max(n for _, _, _, n in static)
                if largest >= threshold:
                    try:
                        return self._run_into_shared_memory(call, static, session)
                    except Exception:
                        if static is self._static_outputs:
                            raise
                        self._entry_outputs.pop(entry.name, None)
                        self._largest.pop(entry.name, None)
            # ONNX Runtime only reads the feed (and checks its names against the graph's
            # itself): the call's own dict is passed, not a copy.
            names = self._output_names
            values = run(names, inputs, self._run_options)
            lone = self._lone_output
            if lone is not None and len(values) == 1:  # a display: no dict and zip calls
                return {lone: values[0]}
            if len(values) != len(names):  # zip's strict=True, without a keyword to parse
                raise ValueError(f"run: {len(values)} outputs for {len(names)} output names")
            return dict(zip(names, values))  # noqa: B905 (lengths compared above)
        except self._invalid_argument as exc:
            raise InputValuesRefused(f"ONNX Runtime refused the inputs' values: {exc}") from exc
        except self._ep_fail as exc:
            raise ProviderRunFailed(
                f"{self._target} failed the run (EP_FAIL); ONNX Runtime's fallback to the "
                f"CPU is disabled, the stage stays on its placement: {exc}") from exc

    def _run_into_shared_memory(
        self, call: Call, static: list[tuple[str, tuple[int, ...], np.dtype[Any], int]],
        session: Any = None,
    ) -> dict[str, np.ndarray]:
        """Run with ONNX Runtime writing each output straight into this worker's segments.

        Only for graphs whose output shapes are all static: each output gets a buffer
        from :meth:`Call.output_buffer` (shared memory when large) bound as the output,
        so no copy is made after the run. Each session keeps one ``IOBinding``: the
        inputs are bound again on every call, an output only when its buffer is not the
        one bound last time (the producer's pool hands the same segment back call after
        call, so usually nothing is bound again). A run that fails drops the binding.

        Inputs are bound by address and cleared after the run: an input is usually a
        view of the controller's segment, which may be unlinked, unmapped or reused once
        this call has ended. ``bind_cpu_input`` would keep a reference to the array in the
        kept binding (which ``clear_binding_inputs`` does not drop), pinning the
        segment's mapping until the next call, and leave the binding pointing at it.
        """
        session = session or self._session
        kept = self._bindings.get(id(session))
        if kept is None or kept[0] is not session:
            kept = self._bindings[id(session)] = (session, session.io_binding(), {})
        _, binding, bound = kept
        held: list[np.ndarray] = []  # the arrays bound by address: alive until the run ends
        outputs: dict[str, np.ndarray] = {}
        try:
            for name, value in call.inputs.items():
                array = value if value.flags.c_contiguous else np.ascontiguousarray(value)
                held.append(array)
                # the dtype's scalar type: a dtype instance is matched by pybind11 only
                # after the overload taking the type failed (about 4 us a call more); the
                # address from the array interface (ctypes.data runs numpy's Python
                # _ctypes class, 32 bytecodes; no faster in wall time on a warm cache)
                binding.bind_input(name, "cpu", 0, array.dtype.type, array.shape,
                                   array.__array_interface__["data"][0])
            for name, shape, dtype, _ in static:
                out = call.output_buffer(shape, dtype)
                where = (out.__array_interface__["data"][0], shape, dtype)
                if bound.get(name) != where:
                    binding.bind_output(name, "cpu", 0, dtype, list(shape), where[0])
                    bound[name] = where
                outputs[name] = out
            session.run_with_iobinding(binding, self._run_options)
        except BaseException:
            self._bindings.pop(id(session), None)
            raise
        finally:
            binding.clear_binding_inputs()  # nothing stays bound to this call's inputs
        return outputs

    def _shrink_at_rest(self) -> None:
        """The worker is at rest: one tiny run per session gives the arena's free chunks back.

        Each session runs its smallest warm-up example with arena shrinkage (ONNX Runtime
        shrinks an arena only at the end of a run); called from the heap policy's watcher
        thread (:func:`edge_contracts.heap.on_rest`).
        """
        for session, inputs in list(self._at_rest):
            session.run(None, inputs, self._shrink_options)

    def close(self) -> None:
        """Drop the session and any profiling directory."""
        self._at_rest.clear()
        self._bindings.clear()
        self._session = None
        self._reference_session = None
        self._bucket_sessions.clear()
        if self._profile_dir:
            import shutil

            shutil.rmtree(self._profile_dir, ignore_errors=True)


def _run_options() -> Any:
    """A ``RunOptions`` of ONNX Runtime's defaults, with the graph id it assumes set explicitly.

    onnxruntime 1.32's Python ``InferenceSession.run_with_iobinding`` (every in-place call,
    :meth:`OrtHandler._run_into_shared_memory`) first reads the run's
    ``gpu_graph_id`` config entry, and where it is not set the compiled lookup throws a
    C++ exception that the wrapper catches as ``RuntimeError`` to take the default, 0: an
    exception thrown, unwound and translated on every call, about 38 µs of a tiny
    in-place call here. Setting the entry to that same default changes no run (the
    CUDA and WebGPU providers read 0 as the default graph annotation; the others ignore
    it) and the lookup then finds it.
    """
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", "0")
    return options


def create() -> OrtHandler:
    """The route entry's factory."""
    return OrtHandler()
