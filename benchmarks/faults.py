"""Fault injection on the OCR pipeline (ort-cpu, three real workers) through the public API.

Every trial opens the PP-OCRv4 pipeline, starts a caller that runs the demo page in a
loop, injects one fault mid-call, and then measures:

* ``s_to_typed_error``: from the fault until the waiting caller gets an ``EdgeError``
  (``null`` for ``controller_sigkill``: no caller waits in this process);
* ``s_to_clean``: from the fault until no process, segment, staged directory or
  reservation of the trial remains (for ``controller_sigkill`` including the sweep this
  process runs as "the next edge-core process"); polled up to :data:`CLEAN_LIMIT_S`;
* leaks left after that, counted only among what the trial created: its processes
  (every PID seen under its workers, escaped ones included), segments of the prefixes
  it handed out, staged directories tagged with its owner, ledger reservations;
* ``wrong_outputs``: a result that differs from the reference run (exact equality);
  ``hangs``: a caller not answered by its deadline + 2 s; ``untyped_errors``: any
  exception that is not an ``EdgeError``.

Fault classes: ``worker_sigkill`` (SIGKILL of the detector's worker), ``worker_sigstop``
(SIGSTOP of it), ``escaping_grandchild`` (the worker starts a process that double-forks
and leaves its session, then the worker is SIGKILLed), ``sigterm_ignoring_tree`` (worker
and a child ignore SIGTERM; ``cancel()`` mid-call with a 0.3 s retire deadline),
``controller_sigkill`` (a controller subprocess is SIGKILLed mid-call),
``close_in_flight`` (``close()`` from another thread mid-call), ``concurrent_cancel``
(``cancel()`` from another thread mid-call). The escaping and SIGTERM-ignoring workers
are the real ort-cpu worker with a ``sitecustomize`` module on its ``PYTHONPATH``, given
through each stage's route (``python_path`` and ``env``: fault injection at the
interpreter boundary; the controller never imports it). A trial whose injection did not
reach the workers stops the run with an error.

The last line printed is one JSON object:
``{"faults": {NAME: {"trials", "max_s_to_typed_error", "max_s_to_clean",
"leaked_processes", "leaked_segments", "leaked_files", "ledger_residue", "wrong_outputs",
"hangs", "untyped_errors"}}}``.

Run: ``.venv/bin/python benchmarks/faults.py [--trials 20] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from edge_contracts.sealed import held_sealed_names
from edge_contracts.shm import own_prefixes, segment_names
from edge_core.config import load_pipeline
from edge_core.errors import EdgeError
from edge_core.host.leftovers import TEMP_KINDS, owner_tag, remove_leftovers
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline

FAULTS = (
    "worker_sigkill",
    "worker_sigstop",
    "escaping_grandchild",
    "sigterm_ignoring_tree",
    "controller_sigkill",
    "close_in_flight",
    "concurrent_cancel",
)
CALL_DEADLINE_S = 2.0
"""What a caller is promised: an answer (result or typed error) within this + 2 s."""
CLEAN_LIMIT_S = 15.0
"""How long a trial's clean-up is polled before what is left counts as leaked."""
GiB = 1024**3

# Put on the workers' PYTHONPATH; acts only where EDGE_FAULT is set (the workers).
SITECUSTOMIZE = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    fault = os.environ.get("EDGE_FAULT")
    record = os.environ.get("EDGE_FAULT_PIDS")
    ESCAPE = (
        "import os, signal, sys, time\\n"
        "if os.fork() == 0:\\n"
        "    os.setsid()\\n"
        "    if os.fork() == 0:\\n"
        "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "        open(sys.argv[1], 'a').write(f'{os.getpid()}\\\\n')\\n"
        "        while True:\\n"
        "            time.sleep(1)\\n"
        "    os._exit(0)\\n"
        "os.wait()\\n"
    )
    STUBBORN = (
        "import os, signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "open(sys.argv[1], 'a').write(f'{os.getpid()}\\\\n')\\n"
        "time.sleep(600)\\n"
    )
    if fault and record:  # the helpers below run with -S: no sitecustomize, no recursion
        if fault == "escape":
            subprocess.Popen([sys.executable, "-S", "-c", ESCAPE, record]).wait()
        elif fault == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            subprocess.Popen([sys.executable, "-S", "-c", STUBBORN, record])
    """
)


class Trial:
    """What one trial created and how it went."""

    def __init__(self) -> None:
        self.pids: set[tuple[int, float]] = set()
        self.prefixes: set[str] = set()
        self.files: set[str] = set()
        self.fault_at: float | None = None
        self.typed_at: float | None = None
        self.answered = threading.Event()
        self.wrong = 0
        self.untyped = 0
        self.hang = False
        self.errors: list[str] = []
        self.clean_s: float | None = None
        self.residue = 0
        self.injected = 0  # processes the sitecustomize fault injection started

    def remember(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self.pids.add((pid, psutil.Process(pid).create_time()))

    def remember_tree(self, root: int) -> None:
        self.remember(root)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(root).children(recursive=True):
                self.remember(child.pid)

    def alive(self) -> list[int]:
        found = []
        for pid, created in self.pids:
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 0.05 and proc.status() != "zombie":
                    found.append(pid)
            except psutil.Error:
                continue
        return found

    def segments(self) -> list[str]:
        """Named segments of the trial's prefixes, and sealed (memfd) ones this process
        still maps or holds a descriptor of (any other holder is a leaked process)."""
        named = [n for n in segment_names() if n.split("_")[1] in self.prefixes]
        return named + [n for n in held_sealed_names() if n.split("_")[1] in self.prefixes]

    def leftover_files(self) -> list[str]:
        return [f for f in self.files if os.path.exists(f)]


def _tagged_dirs(tag: str) -> set[str]:
    root = tempfile.gettempdir()
    starts = tuple(f"edge-{kind}-{tag}-" for kind in TEMP_KINDS)
    return {os.path.join(root, n) for n in os.listdir(root) if n.startswith(starts)}


def _copy(value: Any) -> Any:
    """An owned copy of an output: an array, or a list of them (a fan-out's items)."""
    if isinstance(value, list | tuple):
        return [_copy(item) for item in value]
    return np.array(value, copy=True)


def _equal(value: Any, reference: Any) -> bool:
    if isinstance(reference, list):
        return (isinstance(value, list | tuple) and len(value) == len(reference)
                and all(_equal(v, r) for v, r in zip(value, reference, strict=True)))
    return bool(np.array_equal(np.asarray(value), reference))


class Bench:
    """The OCR bundles, the reference outputs and the trial runner."""

    def __init__(self, bundles: Path, workdir: Path) -> None:
        from edge_ocr_example.make_image import render_lines
        from edge_ocr_example.preprocess import preprocess

        self.bundles = bundles
        self.workdir = workdir
        self.config = load_pipeline(bundles / "pipeline.toml")
        self.plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
        self.source = preprocess(np.ascontiguousarray(render_lines()))
        ledger = self._ledger()
        pipeline = Pipeline.open(self.config, self.plugins, ledger)
        try:
            with pipeline.run(self.source) as result:
                self.reference = {k: _copy(v) for k, v in result.outputs.items()}
        finally:
            pipeline.close()

    def _ledger(self) -> ResourceLedger:
        return ResourceLedger([Pool(name="machine:ram", total=64 * GiB)])

    def _same(self, outputs: Any) -> bool:
        if sorted(outputs) != sorted(self.reference):
            return False
        return all(_equal(outputs[k], v) for k, v in self.reference.items())

    # -- one in-process trial -----------------------------------------------------------

    def _caller(self, pipeline: Pipeline, trial: Trial, started: threading.Event) -> None:
        """Run the page until an error; every result must equal the reference."""
        try:
            while True:
                started.set()
                with pipeline.run(self.source) as result:
                    if not self._same(result.outputs):
                        trial.wrong += 1
                fault_at = trial.fault_at  # answered after the fault: keep going a while
                if fault_at is not None and time.monotonic() - fault_at > CALL_DEADLINE_S + 2:
                    return
        except EdgeError as exc:
            trial.typed_at = time.monotonic()
            trial.errors.append(type(exc).__name__)
        except BaseException as exc:  # counted: an untyped error
            trial.typed_at = time.monotonic()
            trial.untyped += 1
            trial.errors.append(f"untyped {type(exc).__name__}: {exc}")
        finally:
            trial.answered.set()

    def _injecting(self, fault: str, pid_file: Path) -> Any:
        """The pipeline with a route per stage that puts the fault on the workers: their
        ``PYTHONPATH`` gets the ``sitecustomize`` directory, their environment the fault
        (a worker's environment is an allowlist plus its route's ``env``)."""
        with open(self.bundles / "pipeline.toml", "rb") as handle:
            data = tomllib.load(handle)
        for stage in data["stages"]:
            stage["backend"]["route"] = {
                "name": "faults",
                "interpreter": sys.executable,
                "python_path": [str(self.workdir / "site")],
                "env": {
                    "EDGE_FAULT": "escape" if fault == "escaping_grandchild" else "stubborn",
                    "EDGE_FAULT_PIDS": str(pid_file),
                },
            }
        return load_pipeline(data, base_dir=self.bundles)

    def run_trial(self, fault: str) -> Trial:
        trial = Trial()
        pid_file = self.workdir / f"pids-{time.monotonic_ns()}"
        injects = fault in ("escaping_grandchild", "sigterm_ignoring_tree")
        config = self._injecting(fault, pid_file) if injects else self.config
        prefixes_before = own_prefixes()
        files_before = _tagged_dirs(owner_tag())
        ledger = self._ledger()
        deadline = 0.3 if fault == "sigterm_ignoring_tree" else 5.0
        pipeline = Pipeline.open(config, self.plugins, ledger, retire_deadline_s=deadline)
        trial.prefixes = set(own_prefixes() - prefixes_before)
        trial.files = _tagged_dirs(owner_tag()) - files_before
        clients = [stage.loaded.client for stage in pipeline.stages]  # type: ignore[attr-defined]
        for client in clients:
            trial.remember_tree(client._tree.root.pid)
        started = threading.Event()
        caller = threading.Thread(target=self._caller, args=(pipeline, trial, started),
                                  daemon=True)
        caller.start()
        started.wait(10)
        time.sleep(0.05 + 0.05 * np.random.default_rng().random())  # mid-call
        target = clients[0]
        if pid_file.exists():
            for line in pid_file.read_text().split():
                trial.remember(int(line))
                trial.injected += 1
        if injects and not trial.injected:
            pipeline.close()
            raise RuntimeError(f"{fault}: the fault injection did not reach the workers")
        trial.remember_tree(target._tree.root.pid)
        trial.fault_at = time.monotonic()
        closer: threading.Thread | None = None
        if fault in ("worker_sigkill", "escaping_grandchild"):
            os.kill(target.identity.pid, signal.SIGKILL)
        elif fault == "worker_sigstop":
            os.kill(target.identity.pid, signal.SIGSTOP)
        elif fault in ("sigterm_ignoring_tree", "concurrent_cancel"):
            closer = threading.Thread(target=pipeline.cancel, daemon=True)
            closer.start()
        elif fault == "close_in_flight":
            closer = threading.Thread(target=pipeline.close, daemon=True)
            closer.start()
        if not trial.answered.wait(CALL_DEADLINE_S + 2):
            trial.hang = True
        if closer is not None:
            closer.join(30)
        pipeline.close()  # what a user does after a fault (a SIGSTOPped worker is killed)
        trial.answered.wait(30)
        caller.join(30)
        self._await_clean(trial, ledger)
        return trial

    def _await_clean(self, trial: Trial, ledger: ResourceLedger | None,
                     sweep: Callable[[], object] | None = None) -> None:
        assert trial.fault_at is not None
        end = trial.fault_at + CLEAN_LIMIT_S
        swept = False
        while True:
            dirty = (trial.alive() or trial.segments() or trial.leftover_files()
                     or (ledger is not None and not ledger.is_empty()))
            if not dirty:
                trial.clean_s = time.monotonic() - trial.fault_at
                break
            if sweep is not None and not swept and not trial.alive():
                sweep()  # the next edge-core process's sweep
                swept = True
                continue
            if time.monotonic() >= end:
                break
            time.sleep(0.01)
        if ledger is not None:
            trial.residue = len(ledger.snapshot()["reservations"])

    # -- controller_sigkill: the controller is a subprocess -------------------------------

    def run_controller_trial(self) -> Trial:
        trial = Trial()
        script = textwrap.dedent(
            """
            import json, sys, threading, time
            import numpy as np
            from edge_core.config import load_pipeline
            from edge_core.host.leftovers import owner_tag
            from edge_core.ledger import ResourceLedger
            from edge_core.plugins import load_plugins
            from edge_core.pools import Pool
            from edge_core.runtime import Pipeline
            from edge_ocr_example.make_image import render_lines
            from edge_ocr_example.preprocess import preprocess
            pipeline = Pipeline.open(load_pipeline(sys.argv[1]),
                                     load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}),
                                     ResourceLedger([Pool(name="machine:ram", total=64 << 30)]))
            source = preprocess(np.ascontiguousarray(render_lines()))
            clients = [s.loaded.client for s in pipeline.stages]
            print(json.dumps({
                "roots": [c._tree.root.pid for c in clients],
                "prefixes": [p for c in clients
                             for p in (c.hello["shm_prefix"], c._producer.prefix)],
                "tag": owner_tag(),
            }), flush=True)
            while True:
                with pipeline.run(source):
                    pass
            """
        )
        proc = subprocess.Popen([sys.executable, "-c", script, str(self.bundles / "pipeline.toml")],
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None
        made = json.loads(proc.stdout.readline())
        proc.stdout.close()
        trial.prefixes = set(made["prefixes"])
        trial.files = _tagged_dirs(made["tag"])
        trial.remember_tree(proc.pid)
        time.sleep(0.2 + 0.1 * np.random.default_rng().random())
        trial.remember_tree(proc.pid)
        trial.fault_at = time.monotonic()
        proc.kill()
        proc.wait()
        trial.answered.set()
        self._await_clean(trial, None, sweep=remove_leftovers)
        return trial


def _summary(trials: list[Trial], typed: bool) -> dict[str, Any]:
    def worst(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        if not present:
            return None
        return round(max(present), 3) if len(present) == len(values) else None

    typed_s = [None if t.typed_at is None or t.fault_at is None else t.typed_at - t.fault_at
               for t in trials]
    clean_s = [t.clean_s for t in trials]
    return {
        "trials": len(trials),
        # null when no caller waits, or when some trial's caller got no typed error
        "max_s_to_typed_error": worst(typed_s) if typed else None,
        "max_s_to_clean": worst(clean_s),
        "leaked_processes": sum(len(t.alive()) for t in trials),
        "leaked_segments": sum(len(t.segments()) for t in trials),
        "leaked_files": sum(len(t.leftover_files()) for t in trials),
        "ledger_residue": sum(t.residue for t in trials),
        "wrong_outputs": sum(t.wrong for t in trials),
        "hangs": sum(t.hang for t in trials),
        "untyped_errors": sum(t.untyped for t in trials),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--only", nargs="*", choices=FAULTS, default=list(FAULTS))
    args = parser.parse_args()
    from edge_ocr_example.bundle import build_bundles

    with tempfile.TemporaryDirectory(prefix="edge-faults-") as tmp:
        workdir = Path(tmp)
        (workdir / "site").mkdir()
        (workdir / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        build_bundles(workdir / "bundles")
        bench = Bench(workdir / "bundles", workdir)
        results: dict[str, Any] = {}
        for fault in args.only:
            trials = []
            for _ in range(args.trials):
                if fault == "controller_sigkill":
                    trial = bench.run_controller_trial()
                else:
                    trial = bench.run_trial(fault)
                trials.append(trial)
                typed = (None if trial.typed_at is None or trial.fault_at is None
                         else round(trial.typed_at - trial.fault_at, 3))
                clean = None if trial.clean_s is None else round(trial.clean_s, 3)
                print(f"{fault}: typed after {typed} s ({', '.join(trial.errors) or 'no error'})"
                      f", clean after {clean} s, hang={trial.hang}, injected processes "
                      f"{trial.injected}", flush=True)
            results[fault] = _summary(trials, typed=fault != "controller_sigkill")
            print(f"{fault}: {json.dumps(results[fault])}", flush=True)
    print(json.dumps({"faults": results}))


if __name__ == "__main__":
    main()
