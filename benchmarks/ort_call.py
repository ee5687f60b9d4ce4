"""ORT stage call overhead: a plain ``InferenceSession.run`` vs the edge ort-cpu stage call.

Everything is measured side by side in this one run (the machine is shared and noisy):
a tiny graph, 1 MiB and 64 MiB inputs, a bare socketpair round trip, a
``multiprocessing.Pipe`` echo of the same float32[4], a 64 MiB memcpy, and the start-up
of a stage (worker start to ready) against a direct import + session + first run in a
fresh interpreter. The last line is one JSON object. Its goal keys compare the stage,
as shipped (its default session options, spinning as :mod:`edge_core.host.spinning`
decides; the stage channel's decision is printed as ``spin``, with its worker's own
account of its spin for the next request as ``spin.worker``), with what a user writes
instead:

* ``zero_copy_overhead_vs_ort_defaults`` = (64 MiB ``Pipeline.run`` with the input in a
  pipeline input buffer, filled once and sent by reference call after call - a plain
  ``onnxruntime.InferenceSession(path)`` call with ORT's defaults) / 64 MiB memcpy, all
  three taken in alternating blocks (goal ≤ 0.2). Beside it,
  ``zero_copy_overhead_vs_stage_options`` compares with a direct session given the
  options the stage gives its own (``direct_session(like_stage=True)``): that isolates
  the call from the session options, but is not what the goal uses; and
  ``zero_copy_overhead_vs_ort_defaults_<variant>`` is the goal's ratio for the same stage
  with other session entries (:data:`STAGE_VARIANTS`: ORT's intra-op spinning on, on only
  while a run lasts, off), taken in the same blocks: the evidence for the stage's session
  default. ``zero_copy_cpu_ms_per_call`` gives the CPU each of them costs (this process
  plus the stage's worker), since spinning trades CPU for latency.
  ``zero_copy_overhead_vs_ort_defaults_same_input`` subtracts the same plain session run
  on the stage's own input buffer instead of ``x``: the very pages the worker reads, so
  that what is left is the call, not where the kernel put those pages (a buffer whose
  pages lie scattered over many 2 MiB physical frames reads slower on a VM; the count
  of each input and each stage's output is printed as ``zero_copy_2mib_frames``). It is
  the fairer comparison of the call, reported beside the goal's; the goal keeps the
  user's own array.
* ``tiny_call_over_mp_pipe`` = (tiny ``Pipeline.run`` p50 - a plain default session's
  ``run`` p50) / Pipe echo p50 (goal ≤ 1.0), and ``cpu_per_call_over_mp_pipe`` =
  controller plus worker CPU per tiny call / the Pipe's (goal ≤ 1.5); the tiny call,
  the direct run, the Pipe echo and the bare round trip are taken in alternating blocks.
  The anchor is the Pipe: the least a Python user pays to reach another process, and
  steadier than the bare socketpair, which moves 10x between runs on a VM. Both one's
  per-block medians are printed (``edge_tiny_block_p50_us``, ``mp_pipe_block_p50_us``):
  the stage is a fresh one, which spins only once a window of its own traffic decides
  so (:mod:`edge_core.host.spinning`), and its first blocks show when that came. The
  controller's CPU is this process's, so the plain session (whose intra-op threads are
  this process's too, and spin as they start) is made and left to settle before the
  first block; ``anchor_cpu_ms_in_edge_blocks`` is what its threads used during the edge
  blocks all the same (0: none of the edge figure is theirs). Where each block's two
  processes last ran is printed as ``mp_pipe_block_shared_cpu`` and
  ``edge_tiny_block_shared_cpu`` (1: one CPU, 0: two): a blocking Pipe echo whose two
  processes the kernel put on one CPU wakes without an inter-processor interrupt and
  takes about half as long on the 2-vCPU VM, so the anchor has two speeds, and this says
  which a block saw; ``spin.apart`` counts the stage's checks and moves off its worker's
  CPU (``edge_core.host.apart``).

Each goal ratio is also given per block (medians paired within a block) with a
bootstrap 95 % interval over the blocks (``*_ci``), and the baselines' raw figures are
printed beside. Also reported: ``tiny_overhead_rtt_ratio`` = (edge - direct) / bare
round trip (history), ``large_overhead_memcpy_ratio`` = (edge - direct) / memcpy at
64 MiB with the input copied in each call, and ``start_ratio`` = stage start / direct
start (goal ≤ 1.15), timed until the first run is done (the direct one's own in-process
part is printed too). The direct start spawns a fresh interpreter; the stage's starts as
shipped, where a warm pool's zygote serves them (a stage opened before in this process
started it), are forks of it; ``start_ratio_spawned`` is the stage's start with the pool
off (``EDGE_WARM_POOL=0``: a fresh interpreter too), the three taken in turn each round.

With ``--page-pipeline build/ocr/pipeline.toml`` (``make demo`` writes it) the run also
compares the three-stage OCR page pipeline as shipped with the same pipeline under each
of :data:`STAGE_VARIANTS` in every stage, at 1 and 4 clients in alternating blocks
(``page_pipeline_<variant>_over_shipped_c1``/``_c4``: pages/s ratios, above 1 when the
variant serves better; ``page_pipeline_cpu_s_per_page`` beside); with
``--page-default-threads`` once more with ONNX Runtime's default thread count in every
stage instead of the file's (``page_pipeline_default_threads_*``: where the spinning
entries act at all, since a one-thread session has no pool to spin). With the
single-stage figures above, the evidence for the stage's session default.

Run: ``.venv/bin/python benchmarks/ort_call.py [--quick] [--page-pipeline TOML
[--page-default-threads]]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline
from edge_core.host.apart import Apart, last_cpu
from edge_core.identity import host_identity
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import probe_host
from edge_core.runtime import Pipeline
from edge_ort.options import CPU, OrtOptions, base_load_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from precompile import ensure_bytecode
from transport_anchors import BareEcho, PipeEcho
from transport_timing import (
    CpuMeter,
    interleaved_blocks,
    p50,
    paired_ratio,
    process_cpu_s,
    spin_report,
)

MIB = 1024 * 1024
DIRECT_START = r"""
import sys, time
t = time.perf_counter()
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
with np.load(sys.argv[2], allow_pickle=False) as d:
    feeds = {k: d[k] for k in d.files}
s.run(None, feeds)
print(time.perf_counter() - t, flush=True)
sys.stdin.read()
"""


def direct_start(bundle: Path) -> tuple[float, float]:
    """A fresh interpreter importing, creating the session and running once.

    Returns the time from spawning it until its first run is done (what a stage start
    is compared with: a stage also starts a fresh interpreter), and the part of that the
    child measures itself after its interpreter started.
    """
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", DIRECT_START, str(bundle / "model.onnx"),
                              str(bundle / "example.npz")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    line = child.stdout.readline()
    spawned = time.perf_counter() - started
    child.stdin.close()
    child.wait()
    return spawned, float(line)


def make_bundle(root: Path, name: str, shape: list[int]) -> Path:
    bundle = root / name
    bundle.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    node = helper.make_node("Relu", ["x"], ["y"], name="relu0")
    model = helper.make_model(helper.make_graph([node], name, [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(bundle / "model.onnx"))
    np.savez(bundle / "example.npz", x=np.ones(shape, np.float32))
    create_manifest(bundle, example_inputs="example.npz")
    return bundle


def memcpy(rounds: int) -> float:
    src = np.ones(16 * MIB, np.float32)
    dst = np.empty_like(src)
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - t)
    return p50(samples)


def direct_session(graph: Path, *, like_stage: bool = True) -> ort.InferenceSession:
    """A session in this process: with the options the ort-cpu stage gives its own session.

    The stage's options (``edge_ort.options.base_load_config``) turn ONNX Runtime's
    intra-op spinning off; ORT's defaults (``like_stage=False``) leave it on, which on
    this 2-core host changes a 64 MiB ``Relu`` by up to 2 ms either way. The overheads
    compare the stage with a session of the same options, so that they measure the
    call, not the thread setting; ORT's defaults are measured beside them for reference.
    """
    options = ort.SessionOptions()
    if like_stage:
        config = base_load_config(CPU, OrtOptions())
        if config["intra_op_threads"]:
            options.intra_op_num_threads = int(config["intra_op_threads"])
        for key, value in config["session_config"].items():
            options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(graph), options, providers=[CPU])


def direct_call(graph: Path, x: np.ndarray, rounds: int) -> float:
    session = direct_session(graph)
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        session.run(["y"], {"x": x})
        samples.append(time.perf_counter() - t)
    return p50(samples[rounds // 10:])


def edge_samples(pipeline: Pipeline, x: np.ndarray, rounds: int) -> list[float]:
    stage = pipeline.stages[0]
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        result = stage.submit({"x": x}).result()
        samples.append(time.perf_counter() - t)
        result.ack()
    return samples


def edge_call(pipeline: Pipeline, x: np.ndarray, rounds: int) -> float:
    return p50(edge_samples(pipeline, x, rounds)[rounds // 10:])


def copy_samples(nbytes: int) -> Callable[[int], list[float]]:
    """``n`` timed ``np.copyto`` of ``nbytes`` between two warm private arrays."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)

    def copies(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            np.copyto(dst, src)
            samples.append(time.perf_counter() - t)
        return samples
    return copies


def session_runs(session: ort.InferenceSession, x: np.ndarray) -> Callable[[int], list[float]]:
    """``n`` timed ``session.run`` calls on ``x``."""
    def direct(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            session.run(["y"], {"x": x})
            samples.append(time.perf_counter() - t)
        return samples
    return direct


def zero_copy_runs(pipeline: Pipeline, x: np.ndarray,
                   ) -> tuple[Callable[[int], list[float]], np.ndarray]:
    """``n`` timed ``Pipeline.run`` calls with ``x`` in an input buffer, sent by reference.

    The buffer is filled once (the caller producing its input, as into any array: not
    timed) and sent call after call (same segment, new generation). Returns the runs and
    the buffer.
    """
    buffer = pipeline.input_buffer("x", x.shape, x.dtype)
    buffer[...] = x

    def edge(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            result = pipeline.run({"x": buffer})
            samples.append(time.perf_counter() - t)
            result.ack()
        return samples
    return edge, buffer


PAGEMAP = Path("/proc/self/pagemap")


def frames_2mib(array: np.ndarray) -> int | None:
    """How many 2 MiB physical frames hold ``array``'s pages; None where unreadable.

    At least ``nbytes / 2 MiB``; more when its pages are scattered, which on a virtual
    machine makes reading them slower (measured in benchmarks/RESULTS.md, ``ort_call``),
    so the zero-copy figures print it for each input and output. Linux shows physical
    frame numbers to root only (others read zeros: None), and only for pages present in
    this process.
    """
    start = array.ctypes.data // 4096
    pages = (array.ctypes.data + array.nbytes - 1) // 4096 - start + 1
    try:
        with PAGEMAP.open("rb") as pagemap:
            pagemap.seek(start * 8)
            entries = np.frombuffer(pagemap.read(pages * 8), dtype="<u8")
    except OSError:
        return None
    present = entries[(entries >> np.uint64(63)) == 1]
    frames = present & np.uint64((1 << 55) - 1)
    if len(present) < pages or not frames.any():
        return None
    return len(np.unique(frames >> np.uint64(9)))


STAGE_VARIANTS: dict[str, dict[str, str]] = {
    "stage_spinning": {"session.intra_op.allow_spinning": "1"},
    "stage_spinning_stop": {"session.intra_op.allow_spinning": "1",
                            "session.force_spinning_stop": "1"},
    "stage_no_spinning": {"session.intra_op.allow_spinning": "0"},
}
"""The ort-cpu stage's session entries compared with it as shipped, on the 64 MiB call.

``stage_spinning``: ONNX Runtime's own default (intra-op threads spin while they wait for
work, after each run too); ``stage_spinning_stop``: they spin only while a run lasts
(``session.force_spinning_stop``); ``stage_no_spinning``: never. One of them is what the
stage ships (:data:`edge_ort.options.DEFAULT_SESSION_CONFIG`); its figure is the shipped
one measured again in the same blocks."""


#: Seconds each run of the session-option comparisons is left to settle after its calls,
#: before the next run of the block starts. ONNX Runtime's intra-op threads keep spinning
#: for a while after a run when spinning is on (ORT's default, and two of the
#: :data:`STAGE_VARIANTS`): without the pause that spin lands on whichever run comes next
#: in the block (the stage as shipped was slower in exactly the blocks where it followed
#: the spinning variant: the measurements are in benchmarks/RESULTS.md, ``ort_call``).
SETTLE_S = 0.05


def metered(run: Callable[[int], list[float]], pids: list[int],
            cpu: dict[str, float], key: str, settle_s: float = 0.0,
            ) -> Callable[[int], list[float]]:
    """``run`` with the CPU seconds of this process and ``pids`` added to ``cpu[key]``.

    Per call: ``cpu[key] / calls``, with the calls counted in ``cpu[key + "_calls"]``. The
    workers' time is read from /proc in clock ticks (10 ms): blocks of tens of 64 MiB
    calls give a figure within a few percent. With ``settle_s`` the run then waits that
    long (untimed) before its CPU is read: what its threads spin after its last call is
    counted as its own, and the next run starts on idle cores.
    """
    def measured(n: int) -> list[float]:
        before = time.process_time() + sum(process_cpu_s(pid) for pid in pids)
        samples = run(n)
        if settle_s:
            time.sleep(settle_s)
        cpu[key] = cpu.get(key, 0.0) + (time.process_time() + sum(
            process_cpu_s(pid) for pid in pids) - before)
        cpu[key + "_calls"] = cpu.get(key + "_calls", 0.0) + len(samples)
        return samples
    return measured


def worker_pid(pipeline: Pipeline) -> int:
    """The process id of a one-stage pipeline's worker."""
    return int(pipeline.stages[0].loaded.client.identity.pid)  # type: ignore[attr-defined]


def zero_copy_against_direct(
    pipeline: Pipeline, variants: dict[str, Pipeline], graph: Path, x: np.ndarray,
    rounds: int,
) -> tuple[dict[str, list[list[float]]], dict[str, float], dict[str, int | None]]:
    """Per-block samples: ORT-default and stage-option sessions, the zero-copy call, memcpy.

    ``pipeline`` is the stage as shipped; ``variants`` the same stage with other session
    entries (:data:`STAGE_VARIANTS`), so that the run shows which session default serves
    this call better. All are taken in alternating blocks, after one unrecorded call each.
    Returns the samples, the CPU milliseconds per call of each (this process plus the
    stage's worker; the direct sessions run in this process) and the 2 MiB physical
    frames each one's input lies in (:func:`frames_2mib`: ``direct`` for both sessions),
    and each stage's output (``<key>_output``).
    """
    cpu: dict[str, float] = {}
    edges = {"edge": zero_copy_runs(pipeline, x),
             **{f"edge_{name}": zero_copy_runs(stage, x) for name, stage in variants.items()}}
    defaults = direct_session(graph, like_stage=False)
    runs = {
        "defaults": session_runs(defaults, x),
        # the same plain session reading the very pages the stage's worker reads
        "defaults_same_input": session_runs(defaults, edges["edge"][1]),
        "stage_options": session_runs(direct_session(graph), x),
        **{key: run for key, (run, _) in edges.items()},
        "memcpy": copy_samples(x.nbytes),
    }
    inputs = {"direct": x, **{key: buffer for key, (_, buffer) in edges.items()}}
    pids = {"edge": [worker_pid(pipeline)],
            **{f"edge_{name}": [worker_pid(stage)] for name, stage in variants.items()}}
    runs = {key: metered(run, pids.get(key, []), cpu, key, SETTLE_S)
            for key, run in runs.items()}
    for warm in runs.values():
        warm(1)
    cpu.clear()
    blocks = interleaved_blocks(list(runs.values()), rounds, blocks=min(rounds, 10))
    per_call = {key: round(cpu[key] / cpu[key + "_calls"] * 1e3, 2) for key in runs}
    frames = {key: frames_2mib(array) for key, array in inputs.items()}
    stages = {"edge": pipeline, **{f"edge_{name}": stage for name, stage in variants.items()}}
    frames.update({f"{key}_output": output_frames(stage, inputs[key])
                   for key, stage in stages.items()})
    return dict(zip(runs, blocks, strict=True)), per_call, frames


def output_frames(pipeline: Pipeline, buffer: np.ndarray) -> int | None:
    """:func:`frames_2mib` of one more call's output (the worker's segment, as mapped here).

    Each of its pages is read once first, so that this process's page table holds them.
    """
    result = pipeline.run({"x": buffer})
    try:
        output = np.asarray(result.outputs["y"]).reshape(-1)
        float(output[::1024].sum())  # one float per 4 KiB page
        return frames_2mib(output)
    finally:
        result.ack()


def run_samples(pipeline: Pipeline, x: np.ndarray, rounds: int) -> list[float]:
    """``rounds`` timed ``Pipeline.run`` calls, each acknowledged after its timing."""
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        result = pipeline.run({"x": x})
        samples.append(time.perf_counter() - t)
        result.ack()
    return samples


def tiny_against_anchors(
    pipeline: Pipeline, graph: Path, x: np.ndarray, rounds: int
) -> dict[str, Any]:
    """Tiny ``Pipeline.run``, a plain session's run, bare socketpair and Pipe echo.

    Taken in alternating blocks (measuring them at different moments of a noisy host
    would compare moments, not implementations; see transport_timing.interleaved_blocks),
    with the CPU time of both processes counted over the edge and the Pipe blocks.
    """
    echo = BareEcho()
    pipe = PipeEcho()
    edge_cpu, pipe_cpu = CpuMeter(worker_pid(pipeline)), CpuMeter(pipe.pid)
    inputs = {"x": x}
    # The plain session first, and left to settle: its intra-op threads (ORT's defaults:
    # one per core, spinning on) spin as they start, in this process, whose CPU time the
    # edge blocks count as the controller's (tens of milliseconds, on a core the stage's
    # worker needed, in whichever block came next: the first edge block).
    # Its threads' CPU in the edge blocks is printed (``anchor_cpu_ms_in_edge_blocks``):
    # 0 says the edge figure holds none of it.
    threads = set(os.listdir("/proc/self/task"))
    direct = session_runs(direct_session(graph, like_stage=False), x)
    anchor = sorted(set(os.listdir("/proc/self/task")) - threads)
    direct(20)
    time.sleep(SETTLE_S)
    anchor_s = 0.0
    shared: dict[str, list[int]] = {"edge": [], "pipe": []}
    worker = worker_pid(pipeline)
    try:
        run_samples(pipeline, x, 50)  # warm

        def edge_block(n: int) -> list[float]:
            nonlocal anchor_s
            run_samples(pipeline, x, 20)
            before = threads_cpu_s(anchor)
            samples = edge_cpu.measure(lambda m: run_samples(pipeline, x, m), n)
            anchor_s += threads_cpu_s(anchor) - before
            shared["edge"].append(shares_cpu(worker))
            return samples

        def pipe_block(n: int) -> list[float]:
            pipe.rtt(20, inputs)
            samples = pipe_cpu.measure(lambda m: pipe.rtt(m, inputs), n)
            shared["pipe"].append(shares_cpu(pipe.pid))
            return samples

        edge, bare, piped, plain = interleaved_blocks(
            [edge_block, echo.rtt, pipe_block, direct], rounds, 10)
    finally:
        echo.close()
        pipe.close()

    def flat(blocks: list[list[float]]) -> list[float]:
        return [sample for block in blocks for sample in block]

    return {"edge": p50(flat(edge)), "bare": p50(flat(bare)), "pipe": p50(flat(piped)),
            "direct": p50(flat(plain)), "pipe_blocks_us": [p50(b) * 1e6 for b in piped],
            "edge_blocks_us": [p50(b) * 1e6 for b in edge],
            "over_pipe_ci": paired_ratio(edge, piped, minus=plain),
            "edge_cpu_us": edge_cpu.per_call_us, "pipe_cpu_us": pipe_cpu.per_call_us,
            "anchor_cpu_ms": anchor_s * 1e3, "shared_cpu": shared}


def apart_report(keep: Apart | None) -> dict[str, int] | None:
    """How often the stage's waiting thread checked and moved off its worker's CPU."""
    return None if keep is None else {"checks": keep.checks, "moves": keep.moves}


def shares_cpu(pid: int) -> int:
    """1 when this thread and process ``pid`` last ran on one CPU, else 0 (-1: unknown)."""
    mine, theirs = last_cpu("/proc/thread-self/stat"), last_cpu(f"/proc/{pid}/stat")
    return -1 if mine is None or theirs is None else int(mine == theirs)


def threads_cpu_s(tids: list[str]) -> float:
    """User plus system CPU seconds of these threads of this process (gone ones: 0)."""
    total = 0
    for tid in tids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


_PLUGINS: list[PluginSet] = []


def open_stage(bundle: Path, session_config: dict[str, str] | None = None,
               ) -> tuple[Pipeline, float]:
    """Open a one-stage pipeline; return it and the time Pipeline.open took.

    ``session_config``: entries set on the stage (default: none, the stage as shipped).

    Plugins are loaded once per process, as an application does (their probe answer is
    then reused for 30 s); the timed part is the stage start: resolve, verify, reserve,
    start the worker, load, warm up, gate.
    """
    config = load_pipeline({"name": "bench", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu", "options": {
            "stage_bundle": False, "session_config": dict(session_config or {})}},
         "manifest": str(bundle)}]})
    ledger = ResourceLedger.from_topology(probe_host().topology())
    if not _PLUGINS:
        _PLUGINS.append(load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}))
    plugins = _PLUGINS[0]
    t = time.perf_counter()
    pipeline = Pipeline.open(config, plugins, ledger)
    return pipeline, time.perf_counter() - t


def open_page_pipeline(path: Path, name: str, session_config: dict[str, str] | None,
                       default_threads: bool = False) -> Pipeline:
    """The OCR page pipeline of ``path`` (as ``make demo`` writes it) with admission 4.

    ``session_config``: entries added to every ort-cpu stage (none: as shipped);
    ``default_threads``: the stages' own ``intra_op_threads`` dropped (ONNX Runtime's
    default, one per core: what a stage gets that does not set it). Admission 4 lets four
    clients' pages overlap across the stages (the file's own admission is the serving
    default's business, not this comparison's).
    """
    import tomllib

    from edge_core.runtime.pipeline_files import default_ledger

    data = tomllib.loads(path.read_text(encoding="utf-8"))
    data["admission"] = 4
    data["name"] = f"{data['name']}-{name}".replace("_", "-")
    for stage in data["stages"]:
        backend = stage["backend"]
        if backend["name"] != "ort-cpu":
            continue
        options = backend.setdefault("options", {})
        if default_threads:
            options.pop("intra_op_threads", None)
        if session_config:
            options["session_config"] = {**options.get("session_config", {}),
                                         **session_config}
    config = load_pipeline(data, base_dir=path.parent)
    if not _PLUGINS:
        _PLUGINS.append(load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}))
    return Pipeline.open(config, _PLUGINS[0], default_ledger(config, _PLUGINS[0]))


def pages_per_s(pipeline: Pipeline, inputs: dict[str, Any], clients: int,
                pages: int) -> list[float]:
    """``pages`` pages from ``clients`` threads at once; one sample: seconds per page."""
    import threading

    counts = [pages // clients + (i < pages % clients) for i in range(clients)]

    def client(count: int) -> None:
        for _ in range(count):
            pipeline.run(dict(inputs)).ack()

    threads = [threading.Thread(target=client, args=(n,)) for n in counts]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [(time.perf_counter() - started) / pages]


def page_pipeline_variants(path: Path, page: Path, pages: int, blocks: int,
                           default_threads: bool = False) -> dict[str, Any]:
    """The page pipeline as shipped vs each of :data:`STAGE_VARIANTS`, at 1 and 4 clients.

    All are open at once (idle workers wait on their sockets); the (configuration,
    clients) runs are taken in alternating blocks of ``pages`` pages each, with the CPU
    seconds per page of each pipeline's processes (this one's share included). Returns
    pages/s (median over blocks) and the ratios variant / shipped at each client count.
    With ``default_threads`` every configuration runs ONNX Runtime's default thread count
    instead of the file's (keys ``page_pipeline_default_threads_*``).
    """
    from edge_core.config.transforms import resolve_input_transform

    prefix = "page_pipeline_default_threads" if default_threads else "page_pipeline"
    opened: dict[str, Pipeline] = {}
    cpu: dict[str, float] = {}
    try:
        for name, entries in (("shipped", None), *STAGE_VARIANTS.items()):
            opened[name] = open_page_pipeline(path, name, entries, default_threads)
        prepare = resolve_input_transform(opened["shipped"].config.prepare, "prepare")
        inputs = dict(prepare(str(page)))
        runs: dict[str, Callable[[int], list[float]]] = {}
        for name, pipe in opened.items():
            pids = [int(stage.loaded.client.identity.pid)  # type: ignore[attr-defined]
                    for stage in pipe.stages]
            for clients in (1, 4):
                def run(n: int, p: Pipeline = pipe, c: int = clients) -> list[float]:
                    return [x for _ in range(n) for x in pages_per_s(p, inputs, c, pages)]
                runs[f"{name}_c{clients}"] = metered(run, pids, cpu, f"{name}_c{clients}",
                                                     SETTLE_S)
        for run in runs.values():
            run(1)  # warm
        cpu.clear()
        per_block = dict(zip(runs, interleaved_blocks(list(runs.values()), blocks, blocks),
                             strict=True))
    finally:
        for pipe in opened.values():
            pipe.close()
    rate = {k: 1 / p50([x for b in v for x in b]) for k, v in per_block.items()}
    found: dict[str, Any] = {
        f"{prefix}_pages_per_s": {k: round(v, 2) for k, v in rate.items()},
        f"{prefix}_cpu_s_per_page": {
            k: round(cpu[k] / (cpu[k + "_calls"] * pages), 3) for k in runs},
        f"{prefix}_pages_per_block": pages, f"{prefix}_blocks": blocks,
    }
    for variant in STAGE_VARIANTS:
        for clients in (1, 4):
            key = f"{prefix}_{variant}_over_shipped_c{clients}"
            found[key] = round(rate[f"{variant}_c{clients}"] / rate[f"shipped_c{clients}"], 3)
            found[f"{key}_ci"] = rounded(paired_ratio(per_block[f"shipped_c{clients}"],
                                                      per_block[f"{variant}_c{clients}"]))
    return found


def rounded(figures: dict[str, float]) -> dict[str, float]:
    """Two decimals for ratios (block counts stay whole)."""
    return {k: v if isinstance(v, int) else round(v, 2) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--page-pipeline", type=Path, metavar="TOML",
                        help="also compare the OCR page pipeline (build/ocr/pipeline.toml) "
                             "as shipped with ORT intra-op spinning on, at 1 and 4 clients")
    parser.add_argument("--page-default-threads", action="store_true",
                        help="with --page-pipeline: also compare them with ONNX Runtime's "
                             "default intra-op thread count in every stage")
    parser.add_argument("--page", type=Path, metavar="PNG",
                        help="the page it reads (default: page.png beside the pipeline)")
    args = parser.parse_args()
    ensure_bytecode()
    rounds = {"tiny": 2000, "1mib": 100, "64mib": 25, "starts": 7}
    if args.quick:
        rounds = {"tiny": 200, "1mib": 20, "64mib": 5, "starts": 1}
    result: dict[str, float] = {}
    extra: dict[str, Any] = {}
    variant_overheads: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases = {"tiny": [4], "1mib": [256 * 1024], "64mib": [16 * MIB]}
        bundles = {name: make_bundle(root, name, shape) for name, shape in cases.items()}
        result["memcpy_64mib_ms"] = memcpy(rounds["64mib"] * 2) * 1e3
        for name, bundle in bundles.items():
            x = np.random.default_rng(0).standard_normal(cases[name]).astype(np.float32)
            direct = direct_call(bundle / "model.onnx", x, rounds[name])
            pipeline, _ = open_stage(bundle)
            try:
                if name == "tiny":
                    tiny = tiny_against_anchors(pipeline, bundle / "model.onnx", x,
                                                rounds[name])
                    edge = tiny["edge"]
                    result["bare_rtt_us"] = tiny["bare"] * 1e6
                    result["mp_pipe_us"] = tiny["pipe"] * 1e6
                    result["direct_tiny_ort_defaults_us"] = tiny["direct"] * 1e6
                    result["cpu_us_per_call_edge"] = tiny["edge_cpu_us"]
                    result["cpu_us_per_call_mp_pipe"] = tiny["pipe_cpu_us"]
                    # the stage channel's own decision, and its worker's for its next request
                    client = pipeline.stages[0].loaded.client  # type: ignore[attr-defined]
                    extra["spin"] = spin_report(client.spin_decision, client)
                    extra["mp_pipe_block_p50_us"] = [round(v, 1) for v in tiny["pipe_blocks_us"]]
                    # a fresh stage spins only once a window on its traffic decides so
                    extra["edge_tiny_block_p50_us"] = [round(v, 1)
                                                       for v in tiny["edge_blocks_us"]]
                    extra["tiny_call_over_mp_pipe_ci"] = rounded(tiny["over_pipe_ci"])
                    # the plain session's threads, in the blocks whose CPU is edge's
                    extra["anchor_cpu_ms_in_edge_blocks"] = round(tiny["anchor_cpu_ms"], 1)
                    # where each block's two processes ran: one CPU (1) or two (0)
                    extra["mp_pipe_block_shared_cpu"] = tiny["shared_cpu"]["pipe"]
                    extra["edge_tiny_block_shared_cpu"] = tiny["shared_cpu"]["edge"]
                    extra["spin"]["apart"] = apart_report(client.reply_wait.apart)
                else:
                    edge = edge_call(pipeline, x, rounds[name])
                if name == "64mib":
                    variants: dict[str, Pipeline] = {}
                    try:
                        for variant, entries in STAGE_VARIANTS.items():
                            variants[variant] = open_stage(bundle, entries)[0]
                        zc, zc_cpu, zc_frames = zero_copy_against_direct(
                            pipeline, variants, bundle / "model.onnx", x, 2 * rounds[name])
                    finally:
                        for stage in variants.values():
                            stage.close()
                    flat = {k: [v for b in blocks for v in b] for k, blocks in zc.items()}
                    result["direct_64mib_zero_copy_pair_us"] = p50(flat["stage_options"]) * 1e6
                    result["edge_64mib_zero_copy_us"] = p50(flat["edge"]) * 1e6
                    result["direct_64mib_ort_defaults_us"] = p50(flat["defaults"]) * 1e6
                    result["direct_64mib_ort_defaults_same_input_us"] = p50(
                        flat["defaults_same_input"]) * 1e6
                    result["memcpy_64mib_paired_ms"] = p50(flat["memcpy"]) * 1e3
                    extra["zero_copy_block_p50_ms"] = {
                        k: [round(p50(b) * 1e3, 2) for b in blocks] for k, blocks in zc.items()}
                    extra["zero_copy_cpu_ms_per_call"] = zc_cpu
                    extra["zero_copy_2mib_frames"] = zc_frames
                    extra["zero_copy_overhead_vs_ort_defaults_ci"] = rounded(paired_ratio(
                        zc["edge"], zc["memcpy"], minus=zc["defaults"]))
                    extra["zero_copy_overhead_vs_ort_defaults_same_input_ci"] = rounded(
                        paired_ratio(zc["edge"], zc["memcpy"], minus=zc["defaults_same_input"]))
                    extra["zero_copy_overhead_vs_stage_options_ci"] = rounded(paired_ratio(
                        zc["edge"], zc["memcpy"], minus=zc["stage_options"]))
                    for variant in STAGE_VARIANTS:
                        key = f"edge_{variant}"
                        result[f"edge_64mib_zero_copy_{variant}_us"] = p50(flat[key]) * 1e6
                        variant_overheads[variant] = round(
                            (p50(flat[key]) - p50(flat["defaults"])) / p50(flat["memcpy"]), 2)
                        extra[f"zero_copy_overhead_vs_ort_defaults_{variant}_ci"] = rounded(
                            paired_ratio(zc[key], zc["memcpy"], minus=zc["defaults"]))
            finally:
                pipeline.close()
            result[f"direct_{name}_us"] = direct * 1e6
            result[f"edge_{name}_us"] = edge * 1e6
        starts, spawned_starts, directs, inside = [], [], [], []
        for _ in range(rounds["starts"]):
            pipeline, opened = open_stage(bundles["tiny"])
            pipeline.close()
            starts.append(opened)
            pool = os.environ.get("EDGE_WARM_POOL")
            os.environ["EDGE_WARM_POOL"] = "0"  # read at each start
            try:
                pipeline, opened = open_stage(bundles["tiny"])
            finally:
                if pool is None:
                    del os.environ["EDGE_WARM_POOL"]
                else:
                    os.environ["EDGE_WARM_POOL"] = pool
            pipeline.close()
            spawned_starts.append(opened)
            spawned, in_process = direct_start(bundles["tiny"])
            directs.append(spawned)
            inside.append(in_process)
        result["stage_start_ms"] = p50(starts) * 1e3
        result["stage_start_spawned_ms"] = p50(spawned_starts) * 1e3
        result["direct_start_ms"] = p50(directs) * 1e3
        result["direct_start_in_process_ms"] = p50(inside) * 1e3
    if args.page_pipeline is not None:
        page = args.page or args.page_pipeline.parent / "page.png"
        for default_threads in (False, True) if args.page_default_threads else (False,):
            extra.update(page_pipeline_variants(args.page_pipeline, page,
                                                pages=2 if args.quick else 4,
                                                blocks=2 if args.quick else 6,
                                                default_threads=default_threads))
    for key, value in result.items():
        print(f"{key:32s} {value:12.1f}")
    summary = {
        "zero_copy_overhead_vs_ort_defaults": round(
            (result["edge_64mib_zero_copy_us"] - result["direct_64mib_ort_defaults_us"])
            / 1e3 / result["memcpy_64mib_paired_ms"], 2),
        **{f"zero_copy_overhead_vs_ort_defaults_{variant}": value
           for variant, value in variant_overheads.items()},
        "zero_copy_overhead_vs_ort_defaults_same_input": round(
            (result["edge_64mib_zero_copy_us"]
             - result["direct_64mib_ort_defaults_same_input_us"])
            / 1e3 / result["memcpy_64mib_paired_ms"], 2),
        "zero_copy_overhead_vs_stage_options": round(
            (result["edge_64mib_zero_copy_us"] - result["direct_64mib_zero_copy_pair_us"])
            / 1e3 / result["memcpy_64mib_paired_ms"], 2),
        "tiny_call_over_mp_pipe": round(
            (result["edge_tiny_us"] - result["direct_tiny_ort_defaults_us"])
            / result["mp_pipe_us"], 2),
        "cpu_per_call_over_mp_pipe": round(
            result["cpu_us_per_call_edge"] / result["cpu_us_per_call_mp_pipe"], 2),
        "tiny_overhead_rtt_ratio": round(
            (result["edge_tiny_us"] - result["direct_tiny_us"]) / result["bare_rtt_us"], 2),
        "large_overhead_memcpy_ratio": round(
            (result["edge_64mib_us"] - result["direct_64mib_us"]) / 1e3
            / result["memcpy_64mib_ms"], 2),
        "start_ratio": round(result["stage_start_ms"] / result["direct_start_ms"], 2),
        "start_ratio_spawned": round(
            result["stage_start_spawned_ms"] / result["direct_start_ms"], 2),
        "cpu_us_per_call": {"edge": round(result["cpu_us_per_call_edge"], 1),
                            "mp_pipe": round(result["cpu_us_per_call_mp_pipe"], 1)},
        "anchors": {"zero_copy": "plain default InferenceSession + 64 MiB memcpy, "
                                 "alternating blocks",
                    "tiny": "multiprocessing.Pipe echo, alternating blocks"},
        "goals": {"zero_copy_overhead_vs_ort_defaults": 0.2, "tiny_call_over_mp_pipe": 1.0,
                  "cpu_per_call_over_mp_pipe": 1.5, "start_ratio": 1.15},
        **extra,
        **{k: round(v, 1) for k, v in result.items()},
    }
    summary["machine"] = host_identity()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
