"""Ctrl-C at the moments it used to escape: ``edge run`` exits 130 with one line, always.

Each test runs ``python -m edge_core.cli run`` (the command line as a user starts it) on
an echo pipeline with two replicas, and sends SIGINT to it at one moment, deterministically:
a ``sitecustomize`` module put first on the child's path (:data:`HOOKS`) sends the signal
from inside the process when the command reaches that moment. Before, each of these
ended the process by the signal (exit status -2, not 130), or printed a traceback, or
cut the retirement of its workers short. Every worker the command started is gone afterwards, and no
shared-memory segment of it is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from edge_contracts.shm import segment_names, segment_owner

PIPELINE = """
name = "numbers"

[[stages]]
id = "a"
replicas = 2
[stages.backend]
name = "echo"
[stages.backend.options]
scale = 2.0
"""

ONE = """
name = "one"

[[stages]]
id = "a"
[stages.backend]
name = "echo"
"""

REFUSED = """
name = "refused"
selection = "first-passing"

[[stages]]
id = "a"
replicas = 2
[stages.backend]
name = "echo"
[stages.backend.options]
scale = 2.0

[[stages]]
id = "b"
input_transform = "edge_echo.transforms:add_source"
[[stages.candidates]]
backend = { name = "echo", options = { fail_at = "warmup" } }
[[stages.candidates]]
backend = { name = "echo-preemptible", options = { fail_at = "warmup" } }
"""

READY = """
name = "ready"
start = "first-ready"
selection = "measured"

[[stages]]
id = "a"

[[stages.candidates]]
backend = { name = "echo", options = { scale = 2.0 } }

[[stages.candidates]]
backend = { name = "echo-preemptible", options = { scale = 2.0, load_delay_s = 2.0 } }
"""

MEASURED = """
name = "measured"

[[stages]]
id = "a"

[[stages.candidates]]
backend = { name = "echo", options = { scale = 2.0 } }

[[stages.candidates]]
backend = { name = "echo-preemptible", options = { scale = 2.0 } }
"""

HOOKS = '''
"""Sends this process SIGINT at the moment EDGE_TEST_CTRL_C names (test_interrupts)."""
import atexit
import os
import signal
import sys

MOMENT = os.environ.get("EDGE_TEST_CTRL_C", "")
MARKS = os.environ.get("EDGE_TEST_MARKS", "")


def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def mark(text):
    with open(MARKS, "a") as file:
        file.write(text + "\\n")


if MOMENT == "import":  # while the command's module imports
    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name == "edge_core.cli.run_cmd":
                sys.meta_path.remove(self)
                ctrl_c()
            return None

    sys.meta_path.insert(0, Finder())
elif MOMENT == "exec":  # inside code run from a string, as a dataclass is made
    import edge_core.preflight as preflight

    checked = preflight.check_pipeline

    def check_pipeline(*args, **kwargs):
        exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\n"
             "for _ in range(3): pass")
        return checked(*args, **kwargs)

    preflight.check_pipeline = check_pipeline
elif MOMENT == "exit":  # registered first: runs last of the exit hooks
    atexit.register(ctrl_c)
elif MOMENT == "retire":  # Ctrl-C during a request, and again as its workers retire
    from edge_core.testing.leaks import descendants  # the warm pool's zygote left out

    from edge_core.runtime import pipeline as module

    run, close = module.Pipeline.run, module.Pipeline.close

    def interrupted_run(self, *args, **kwargs):
        mark("workers " + " ".join(str(c.pid) for c in descendants()))
        ctrl_c()
        return run(self, *args, **kwargs)

    def interrupted_close(self):
        ctrl_c()
        closed = close(self)
        mark("retired")
        return closed

    module.Pipeline.run = interrupted_run
    module.Pipeline.close = interrupted_close  # what the interrupted command closes
elif MOMENT in ("request", "buffers", "plan", "refused", "closing", "stopping", "joining"):
    import psutil

    from edge_core.testing.leaks import descendants  # the warm pool's zygote left out

    from edge_contracts.shm import segment_names, segment_owner
    from edge_core.cli.run_inputs import BufferedInputs
    from edge_core.runtime import pipeline as module

    workers = []

    def interrupting(function):  # during a request, or as the command has just opened
        def interrupted(self, *args, **kwargs):
            workers.extend(descendants())
            mark("workers " + " ".join(str(c.pid) for c in workers))
            ctrl_c()
            return function(self, *args, **kwargs)
        return interrupted

    class Stderr:  # notes, as the command says it was interrupted, what still runs
        def __init__(self, stream):
            self.stream = stream

        def write(self, text):
            if "interrupted" in text:
                if MOMENT == "stopping":  # and workers started since (in the background)
                    workers.extend(c for c in descendants()
                                   if c not in workers)
                running = [p.pid for p in workers
                           if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
                owners = {os.getpid(), *(p.pid for p in workers)}
                segments = [n for n in segment_names()
                            if (o := segment_owner(n)) is not None and o.pid in owners]
                mark(f"said; running {running}; segments {segments}")
            return self.stream.write(text)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    if MOMENT == "request":
        module.Pipeline.run = interrupting(module.Pipeline.run)
    elif MOMENT == "plan":  # edge plan: the pipeline open, its plan being read
        module.Pipeline.execution_plan = interrupting(module.Pipeline.execution_plan)
    elif MOMENT == "refused":  # edge plan: stage b refused, stage a's replicas retiring
        from edge_core.runtime.stage_runtime import StageRuntime

        plain, first = StageRuntime.close, interrupting(StageRuntime.close)

        def close(self):
            if workers or not self.name.startswith("a"):  # b's refused candidates: plain
                return plain(self)
            return first(self)

        StageRuntime.close = close
    elif MOMENT == "closing":  # the command's own close, once it has its answer
        from edge_core.runtime.stage_runtime import StageRuntime

        StageRuntime.close = interrupting(StageRuntime.close)
    elif MOMENT == "stopping":  # the close, as serving stops: before any stage retires
        from edge_core.runtime.selection_policy import FirstReadyPolicy, SelectionPolicy

        SelectionPolicy.stop = interrupting(SelectionPolicy.stop)
        FirstReadyPolicy.stop = interrupting(FirstReadyPolicy.stop)
    elif MOMENT == "joining":  # the close waits for its replicas to retire: twice
        import threading

        join, wait, sent = threading.Thread.join, threading.Event.wait, []
        close = module.Pipeline.close

        def recorded_close(self, *args, **kwargs):
            # the replicas' trees as the close begins: by its first wait, on a loaded
            # machine, a replica's close thread may have retired its worker already
            if not workers:
                workers.extend(descendants())
            return close(self, *args, **kwargs)

        def interrupted_join(self, *args, **kwargs):
            if self.name.startswith("edge-close-") and len(sent) < 2:
                sent.append("join")  # the first wait, and a second one by a join
                if len(sent) == 1:
                    mark("workers " + " ".join(str(c.pid) for c in workers))
                ctrl_c()
            return join(self, *args, **kwargs)

        def interrupted_wait(self, *args, **kwargs):
            if len(sent) == 1 and threading.current_thread() is threading.main_thread():
                sent.append("wait")  # a second one as the close waits again otherwise
                ctrl_c()
            return wait(self, *args, **kwargs)

        threading.Thread.join, threading.Event.wait = interrupted_join, interrupted_wait
        module.Pipeline.close = recorded_close
    else:
        BufferedInputs.__init__ = interrupting(BufferedInputs.__init__)
    sys.stderr = Stderr(sys.stderr)
elif MOMENT == "swallowed":  # one Ctrl-C taken by code that goes on, then another
    import edge_core.preflight as preflight
    from edge_core.runtime import pipeline as module

    checked, run = preflight.check_pipeline, module.Pipeline.run

    def check_pipeline(*args, **kwargs):
        try:  # as a weak-reference callback's "Exception ignored" takes one
            ctrl_c()
            for _ in range(3):
                pass
        except KeyboardInterrupt:
            mark("swallowed")
        return checked(*args, **kwargs)

    def interrupted_run(self, *args, **kwargs):
        ctrl_c()
        return run(self, *args, **kwargs)

    preflight.check_pipeline, module.Pipeline.run = check_pipeline, interrupted_run
elif MOMENT == "open":  # Ctrl-C as a replica's warm-up is gated, again as the open unwinds
    from edge_core.runtime.opener import StageOpener
    from edge_core.testing.leaks import descendants  # the warm pool's zygote left out

    gate, unwind = StageOpener._gate, StageOpener.unwind
    sent = []

    def interrupted_gate(self, slot, loaded):
        if not sent:
            sent.append(True)
            mark("workers " + " ".join(str(c.pid) for c in descendants()))
            ctrl_c()
        return gate(self, slot, loaded)

    def interrupted_unwind(self, started, slots):
        ctrl_c()
        unwind(self, started, slots)
        mark("unwound")

    StageOpener._gate, StageOpener.unwind = interrupted_gate, interrupted_unwind
'''


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    (tmp_path / "measured.toml").write_text(MEASURED)  # edge plan measures its candidates
    (tmp_path / "refused.toml").write_text(REFUSED)  # edge plan finds no candidate for b
    (tmp_path / "one.toml").write_text(ONE)  # one worker: closed on the command's thread
    (tmp_path / "ready.toml").write_text(READY)  # a first-ready start: choosing as it closes
    # large enough to travel in a shared-memory input buffer
    np.savez(tmp_path / "big.npz", x=np.arange(200_000, dtype=np.float32))
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOKS)
    return tmp_path


RUN = ["run", "pipeline.toml", "--inputs", "big.npz", "--repeat", "3", "--json"]


def ctrl_c_at(moment: str, work: Path, argv: list[str] = RUN,
              ) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """Run ``edge ARGV`` with SIGINT sent at ``moment``; the result and every child seen."""
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    env.update(EDGE_PLUGINS="echo", EDGE_TEST_CTRL_C=moment,
               EDGE_TEST_MARKS=str(work / "marks.txt"),
               PYTHONPATH=os.pathsep.join([str(work / "hooks"),
                                           *filter(None, [env.get("PYTHONPATH")])]))
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_core.cli", *argv], cwd=work, env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    while process.poll() is None:  # every descendant, to find any left running
        try:
            seen |= {c.pid for c in psutil.Process(process.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.005)
    out, err = process.communicate(timeout=120)
    marks = work / "marks.txt"
    if marks.exists():
        for line in marks.read_text().splitlines():
            if line.startswith("workers "):
                seen |= {int(pid) for pid in line.split()[1:]}
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), seen


def assert_nothing_left(seen: set[int], pid: int) -> None:
    """No process the command started runs on; no segment it or they made is left."""
    deadline = time.monotonic() + 10
    alive = seen
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.05)
    assert not alive, f"still running: {sorted(alive)}"
    owners = {pid, *seen}
    left = [name for name in segment_names()
            if (owner := segment_owner(name)) is not None and owner.pid in owners]
    assert not left, left


def assert_interrupted(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 130, (done.returncode, done.stderr)  # not -2: by the signal
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "edge: interrupted", done.stderr
    assert json.loads(done.stdout) == {"ok": False, "error": "interrupted"}


def test_ctrl_c_while_the_command_module_imports_exits_130(work: Path) -> None:
    done, seen = ctrl_c_at("import", work)
    assert_interrupted(done)
    assert done.stderr == "edge: interrupted\n" and not seen


def test_ctrl_c_inside_code_run_from_a_string_exits_130_not_by_the_signal(
        work: Path) -> None:
    # CPython's flag of an unhandled KeyboardInterrupt, left set by exec(): `python -m`
    # then ended the process by SIGINT after it had printed `edge: interrupted`
    done, seen = ctrl_c_at("exec", work)
    assert_interrupted(done)
    assert_nothing_left(seen, 0)


def test_ctrl_c_after_the_command_ended_keeps_its_output_and_exit_code(work: Path) -> None:
    # during the exit hooks: a traceback ("Exception ignored in atexit callback"), or,
    # once Python's teardown had reset the handlers, the process ended by the signal
    done, seen = ctrl_c_at("exit", work)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    body = json.loads(done.stdout)
    assert body["ok"] is True and body["ledger_after_close"]["reservations"] == [], body
    assert all(stage["retire"]["verified"] for stage in body["closed"].values()), body
    assert_nothing_left(seen, 0)


def test_a_second_ctrl_c_while_the_workers_retire_lets_them_retire(work: Path) -> None:
    # the first Ctrl-C during a request unwinds the command, which closes its pipeline
    # (before, its workers were retired by the exit hook, where a second one cut that
    # short with a traceback, "Exception ignored in atexit callback", the workers left
    # to their supervisors): a second one as the workers retire is ignored, with one
    # line, and the retirement finishes
    done, seen = ctrl_c_at("retire", work)
    assert_interrupted(done)
    assert "KeyboardInterrupt" not in done.stderr
    assert "edge: still retiring" in done.stderr
    assert (work / "marks.txt").read_text().splitlines()[-1] == "retired"
    assert seen, "no worker was started"
    assert_nothing_left(seen, 0)


def test_a_second_ctrl_c_while_an_interrupted_open_unwinds_lets_it_finish(work: Path) -> None:
    # a second Ctrl-C cut the open's own unwinding short (what it had started left to the
    # exit hooks): now it is ignored, with one line, and the unwinding finishes
    done, seen = ctrl_c_at("open", work)
    assert_interrupted(done)
    assert ("edge: still retiring what the command started; it ends within the retirement "
            "deadlines") in done.stderr
    assert "KeyboardInterrupt" not in done.stderr
    assert "unwound" in (work / "marks.txt").read_text().splitlines()
    assert seen, "no worker was started"
    assert_nothing_left(seen, 0)


def test_a_ctrl_c_after_one_that_was_swallowed_still_interrupts(work: Path) -> None:
    # one taken where the command goes on (a weak-reference callback prints "Exception
    # ignored" and carries on): the next is not taken for a second one while unwinding
    done, seen = ctrl_c_at("swallowed", work)
    assert (work / "marks.txt").read_text().splitlines()[0] == "swallowed"
    assert_interrupted(done)
    assert "still retiring" not in done.stderr
    assert_nothing_left(seen, 0)


@pytest.mark.parametrize(("moment", "argv"), [
    ("request", RUN), ("buffers", RUN), ("plan", ["plan", "pipeline.toml", "--json"]),
    ("plan", ["plan", "measured.toml", "--json"])])
def test_ctrl_c_once_the_pipeline_is_open_says_so_once_the_workers_are_retired(
        work: Path, moment: str, argv: list[str]) -> None:
    # edge run during a request, or as it has just opened the pipeline; edge plan as it
    # reads the open pipeline's plan: the command said "edge: interrupted" with its
    # workers still running (and their shared memory in place), retired only afterwards
    # by the exit hook: now the pipeline is closed first, and the line is true when said
    done, seen = ctrl_c_at(moment, work, argv)
    assert_interrupted(done)
    assert seen, "no worker was started"
    marks = (work / "marks.txt").read_text().splitlines()
    assert marks[-1] == "said; running []; segments []", marks
    assert_nothing_left(seen, 0)


def test_ctrl_c_as_edge_plan_retires_after_a_refusal_says_so_once_all_are_retired(
        work: Path) -> None:
    # stage a opened (two replicas), every candidate of stage b refused: edge plan retires
    # stage a, and a Ctrl-C there cut that retirement short: the command said "edge:
    # interrupted" with a's workers still running, left to the exit hook. Now every
    # replica is retired and settled first, and the line is true when said
    done, seen = ctrl_c_at("refused", work, ["plan", "refused.toml", "--json"])
    assert_interrupted(done)
    marks = (work / "marks.txt").read_text().splitlines()
    assert marks[0].startswith("workers ") and len(marks[0].split()) > 2, marks  # both a's
    assert marks[-1] == "said; running []; segments []", marks
    assert_nothing_left(seen, 0)


@pytest.mark.parametrize("argv", [
    ["run", "one.toml", "--inputs", "big.npz", "--json"], ["plan", "one.toml", "--json"]],
    ids=["run", "plan"])
def test_ctrl_c_as_the_command_closes_its_pipeline_says_so_once_it_is_closed(
        work: Path, argv: list[str]) -> None:
    # the answer is in, the one worker retiring on the command's own thread: a Ctrl-C
    # there cut its retirement short, and "edge: interrupted" was said with the worker
    # still running, left to the exit hook; now the retirement is finished first
    done, seen = ctrl_c_at("closing", work, argv)
    assert_interrupted(done)
    marks = (work / "marks.txt").read_text().splitlines()
    assert marks[0].startswith("workers ") and len(marks[0].split()) > 1, marks
    assert marks[-1] == "said; running []; segments []", marks
    assert_nothing_left(seen, 0)


@pytest.mark.parametrize("argv", [
    ["run", "one.toml", "--inputs", "big.npz", "--json"],
    ["run", "pipeline.toml", "--inputs", "big.npz", "--json"],
    ["plan", "one.toml", "--json"],
    ["run", "ready.toml", "--inputs", "big.npz", "--json"]],
    ids=["run", "run-replicas", "plan", "run-first-ready"])
def test_ctrl_c_as_the_close_stops_serving_says_so_once_every_stage_is_closed(
        work: Path, argv: list[str]) -> None:
    # the close interrupted before any stage retired, as the selection policy stops (a
    # first-ready start's background work still opening a candidate): Pipeline.close
    # raised at once, and "edge: interrupted" was said with every worker still running,
    # left to the exit hook, the reservations charged, the background opening on; now
    # serving is stopped to its end, every stage retired and settled, then it is said
    done, seen = ctrl_c_at("stopping", work, argv)
    assert_interrupted(done)
    marks = (work / "marks.txt").read_text().splitlines()
    assert marks[0].startswith("workers ") and len(marks[0].split()) > 1, marks
    assert marks[-1] == "said; running []; segments []", marks
    assert_nothing_left(seen, 0)


def test_a_second_ctrl_c_as_the_close_waits_for_its_replicas_lets_them_retire(
        work: Path) -> None:
    # a Ctrl-C as the close waited for its two replicas' retirement, then another as it
    # waited again: the second one escaped (the first no longer in flight), nothing was
    # settled and "edge: interrupted" was said with the replicas still retiring; now it
    # is ignored, with one line, and every replica is retired and settled first
    done, seen = ctrl_c_at("joining", work, ["run", "pipeline.toml", "--inputs", "big.npz",
                                             "--json"])
    assert_interrupted(done)
    assert "edge: still retiring" in done.stderr, done.stderr
    marks = (work / "marks.txt").read_text().splitlines()
    assert marks[0].startswith("workers ") and len(marks[0].split()) > 2, marks
    assert marks[-1] == "said; running []; segments []", marks
    assert_nothing_left(seen, 0)
