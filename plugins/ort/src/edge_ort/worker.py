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

from edge_contracts.tensors import dtype_of
from edge_contracts.worker import BaseHandler, Call
from edge_ort.assignment import (
    ASSIGNMENT_CONFIG_KEY,
    from_assignment_info,
    from_profile,
    supports_assignment,
)
from edge_ort.bucket import Bucket
from edge_ort.npz import load_npz
from edge_ort.numerics import compare_outputs

if TYPE_CHECKING:  # imported where used: hashing and file utilities cost start-up time
    from edge_ort.epcontext import ContextEntry

__all__ = ["OrtHandler", "create"]

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


def _load_npz(path: str) -> dict[str, np.ndarray]:
    return load_npz(path)  # numpy.load's zipfile import costs ~7 ms of the start-up


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


def _spec(array: np.ndarray) -> tuple[str, tuple[int, ...]]:
    return dtype_of(array).value, tuple(int(d) for d in array.shape)


class OrtHandler(BaseHandler):
    """One ONNX Runtime session in a worker process."""

    def __init__(self) -> None:
        import onnxruntime as ort

        self._ort = ort
        self._session: Any = None
        self._output_names: list[str] = []
        self._static_outputs: list[tuple[str, tuple[int, ...], np.dtype[Any], int]] = []
        self._bucket: Bucket | None = None
        self._config: Mapping[str, Any] = {}
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

    def _context_entry(self, config: Mapping[str, Any]) -> ContextEntry | None:
        """The EP-context cache entry for ``config["ep_context"]`` (``{dir, material}``)."""
        context = config.get("ep_context")
        if not context:
            return None
        from edge_ort.epcontext import ContextEntry, artifact_digest, context_key

        versions = {"onnxruntime": str(self._ort.__version__)}
        for lib in config.get("ep_libraries", []):
            if lib.get("module"):
                module = importlib.import_module(str(lib["module"]))
                versions[str(lib["module"])] = str(getattr(module, "__version__", "unknown"))
        key = context_key(artifact_digest(str(config["graph"])),
                          dict(context.get("material", {})), versions)
        return ContextEntry(str(context["dir"]), key)

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create the session; report the providers available and used."""
        ort = self._ort
        self._config = config
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
        options = ort.SessionOptions()
        options.log_severity_level = int(config.get("log_severity_level", 3))
        if config.get("intra_op_threads"):
            options.intra_op_num_threads = int(config["intra_op_threads"])
        for key, value in dict(config.get("session_config", {})).items():
            options.add_session_config_entry(str(key), str(value))
        method = str(config.get("placement_method", "auto"))
        if method == "auto":
            method = "assignment" if supports_assignment(ort.InferenceSession) else "profiling"
        if method == "assignment":
            options.add_session_config_entry(ASSIGNMENT_CONFIG_KEY, "1")
        elif method == "profiling":
            import tempfile

            self._profile_dir = tempfile.mkdtemp(prefix="edge-ort-profile-")
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(self._profile_dir, "warmup")
        self._method = method
        providers = [(str(name), dict(opts)) for name, opts in config.get("providers", [])]
        graph = str(config["graph"])
        context = self._context_entry(config)
        if context is not None and context.present:
            graph = str(context.model)
        elif context is not None:
            for key, value in context.session_entries().items():
                options.add_session_config_entry(key, value)
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if config.get("plugin_ep"):
                    devices = [d for d in ort.get_ep_devices() if d.ep_name == self._target]
                    options.add_provider_for_devices(devices, dict(providers[0][1])
                                                     if providers else {})
                    self._session = ort.InferenceSession(graph, options)
                else:
                    self._session = ort.InferenceSession(
                        graph, options,
                        providers=[n for n, _ in providers] or [CPU],
                        provider_options=[o for _, o in providers] or None,
                    )
            except BaseException:
                if context is not None:
                    context.abandon()
                raise
        if context is not None:
            reused = graph != str(config["graph"])
            report["ep_context"] = {"key": context.key, "reused": reused,
                                    "written": False if reused else context.commit(),
                                    "path": str(context.path)}
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._static_outputs = _static_outputs(self._session.get_outputs())
        report.update({
            # Static output shapes: large outputs are written by ONNX Runtime straight
            # into shared memory (IOBinding), with no copy after the run.
            "outputs_in_place": bool(self._static_outputs),
            "session_providers": list(self._session.get_providers()),
            "placement_method": method,
            "load_ms": (time.perf_counter() - started) * 1e3,
            "warnings": [str(w.message) for w in caught],
            "inputs": [{"name": i.name, "type": i.type, "shape": list(i.shape)}
                       for i in self._session.get_inputs()],
            "outputs": [{"name": o.name, "type": o.type, "shape": list(o.shape)}
                        for o in self._session.get_outputs()],
        })
        return report

    # -- warm-up -----------------------------------------------------------------------

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self._output_names, dict(inputs))
        return dict(zip(self._output_names, values, strict=True))

    def _reference(self, inputs: Mapping[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
        expected = self._config.get("expected_outputs")
        if expected:
            return "expected-outputs", _load_npz(str(expected))
        if self._target == CPU:
            return "none", {}
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        cpu = self._ort.InferenceSession(str(self._config["graph"]), options, providers=[CPU])
        names = [o.name for o in cpu.get_outputs()]
        return "cpu-run", dict(zip(names, cpu.run(names, dict(inputs)), strict=True))

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run the example bucket; report placement, numerics and the frozen bucket."""
        if self._session is None:
            raise RuntimeError("warmup: no session (the target provider was unavailable)")
        example = _load_npz(str(self._config["example_inputs"]))
        session_inputs = [i.name for i in self._session.get_inputs()]
        Bucket({n: _spec(a) for n, a in example.items()}).check(
            {n: _spec(example[n]) if n in example else ("missing", ()) for n in session_inputs}
        )
        self._bucket = Bucket({n: _spec(a) for n, a in example.items()})
        started = time.perf_counter()
        outputs = self._run(example)
        warmup_ms = (time.perf_counter() - started) * 1e3
        if self._method == "assignment":
            providers = from_assignment_info(self._session)
        elif self._method == "profiling":
            providers = from_profile(self._session.end_profiling())
        else:
            providers = {}
        kind, reference = self._reference(example)
        if reference:
            numerics = compare_outputs(outputs, reference,
                                       self._config.get("numerics_bound"), kind)
        else:
            numerics = {"reference": "none", "passed": True,
                        "note": "target is the CPU provider and the bundle has no expected "
                                "outputs: nothing independent to compare with"}
        return {
            "placement": {
                "target": self._target,
                "method": {"assignment": "graph-assignment-info"}.get(self._method,
                                                                      self._method),
                "available_providers": self._available(),
                "session_providers": list(self._session.get_providers()),
                "providers": providers,
            },
            "numerics": numerics,
            "bucket": self._bucket.to_json(),
            "warmup_ms": warmup_ms,
        }

    # -- serving -----------------------------------------------------------------------

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Run one request at the frozen bucket."""
        if self._bucket is None:
            raise RuntimeError("run: the stage was not warmed up")
        self._bucket.check({n: _spec(a) for n, a in call.inputs.items()})
        threshold = call.zero_copy_bytes
        static = self._static_outputs
        if static and threshold is not None and max(n for _, _, _, n in static) >= threshold:
            return self._run_into_shared_memory(call, static)
        return self._run(call.inputs)

    def _run_into_shared_memory(
        self, call: Call, static: list[tuple[str, tuple[int, ...], np.dtype[Any], int]]
    ) -> dict[str, np.ndarray]:
        """Run with ONNX Runtime writing each output straight into this worker's segments.

        Only for graphs whose output shapes are all static: each output gets a buffer
        from :meth:`Call.output_buffer` (shared memory when large) bound as the output,
        so no copy is made after the run.
        """
        binding = self._session.io_binding()
        for name, array in call.inputs.items():
            binding.bind_cpu_input(name, array)
        outputs: dict[str, np.ndarray] = {}
        for name, shape, dtype, _ in static:
            out = call.output_buffer(shape, dtype)
            binding.bind_output(name, "cpu", 0, dtype, list(shape), out.ctypes.data)
            outputs[name] = out
        self._session.run_with_iobinding(binding)
        return outputs

    def close(self) -> None:
        """Drop the session and any profiling directory."""
        self._session = None
        if self._profile_dir:
            import shutil

            shutil.rmtree(self._profile_dir, ignore_errors=True)


def create() -> OrtHandler:
    """The route entry's factory."""
    return OrtHandler()
