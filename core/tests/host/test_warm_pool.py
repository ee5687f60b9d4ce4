"""The warm pool: workers forked by a zygote per environment, supervised and verified as ever.

Real processes throughout: the zygote, the supervisors it forks, their workers; a
controller of its own (a subprocess) where the controller is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import attrs
import numpy as np
import psutil
import pytest

from edge_contracts.shm import segment_names
from edge_core.host import Route, bootstrap, environment, warm_pool
from edge_core.host import zygote as zygote_module
from edge_core.host.errors import BootstrapRefused, WorkerGone, WorkerLost
from edge_core.host.identity import ProcessIdentity
from edge_core.host.start_path import FORKED, SPAWNED, StartPath
from edge_core.testing.leaks import descendants

from .conftest import WORKERS, request, test_route

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(os, "pidfd_open")),
    reason="the warm pool needs Linux with pidfd_open",
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(_alive(pid) for pid in pids):
        time.sleep(0.02)
    return [pid for pid in pids if _alive(pid)]


def _echoes(client, rid: str = "r1") -> None:
    out = client.submit(request(rid), {"x": np.arange(4.0)}).result(timeout=10)
    assert np.array_equal(out["x"], np.arange(4.0))


def _killed_mid_call(client) -> None:
    # the worker killed inside a call: the call fails at once, as the death is seen
    call = client.submit(request("r1", sleep_s=30))
    time.sleep(0.1)
    killed_at = time.monotonic()
    os.kill(client.identity.pid, signal.SIGKILL)
    with pytest.raises(WorkerLost):
        call.result(timeout=5.0)
    assert time.monotonic() - killed_at < 5.0


def test_a_pooled_worker_is_the_supervisors_child_and_the_supervisor_the_zygotes(start):
    client = start()
    assert client.start_path.kind == FORKED, client.start_path
    worker = psutil.Process(client.identity.pid)
    supervisor = worker.parent()
    assert supervisor is not None and supervisor.pid == client._tree.root.pid
    assert os.getsid(supervisor.pid) == supervisor.pid  # a session leader, as spawned
    zygote = supervisor.parent()
    assert zygote is not None and zygote.pid == client.start_path.zygote
    assert zygote.ppid() == os.getpid()
    assert zygote.pid in warm_pool.pool_processes()
    # the identity is verified as a spawned worker's: the hello's PID is the supervisor's child
    assert client.hello["pid"] == worker.pid
    assert client.identity == ProcessIdentity.of(worker.pid)
    _echoes(client)


def test_the_second_start_is_a_fork_of_the_same_zygote_not_a_new_interpreter(start):
    first = start()
    second = start()
    assert (first.start_path.kind, second.start_path.kind) == (FORKED, FORKED)
    assert second.start_path.zygote == first.start_path.zygote
    assert second.start_path.forks == (first.start_path.forks or 0) + 1
    zygote = psutil.Process(second.start_path.zygote)
    for client in (first, second):
        worker = psutil.Process(client.identity.pid)
        # no exec since the fork: the worker still runs the zygote's command line
        assert worker.cmdline() == zygote.cmdline()
        assert worker.exe() == zygote.exe()
    _echoes(second)


def test_a_killed_pooled_worker_is_seen_at_once_with_its_signal(start):
    client = start()
    assert client.start_path.kind == FORKED
    _killed_mid_call(client)
    health = client.health()
    assert health.state == "lost"
    assert health.exit_status == -signal.SIGKILL  # reported by the zygote, which reaped it
    with pytest.raises(WorkerGone):
        client.submit(request("late"))


def test_workers_outlive_a_killed_zygote_and_the_next_start_gets_a_new_one(start):
    client = start()
    zygote = client.start_path.zygote
    assert client.start_path.kind == FORKED and zygote is not None
    os.kill(zygote, signal.SIGKILL)
    assert not _wait_dead([zygote], 5.0)
    _echoes(client, "after")  # the worker does not depend on its zygote
    after = start()
    assert after.start_path.kind == FORKED
    assert after.start_path.zygote not in (None, zygote)
    _echoes(after)
    outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert client.health().exit_status is None  # its zygote is gone: the status is unknown


def test_a_worker_whose_zygote_died_is_still_seen_dying_at_once(start):
    client = start()
    zygote = client.start_path.zygote
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)
    assert not _wait_dead([zygote], 5.0)
    _killed_mid_call(client)
    assert client.health().state == "lost"


def test_the_pool_is_off_with_edge_warm_pool_0_and_says_so(start, monkeypatch):
    monkeypatch.setenv(warm_pool.POOL_ENV, "0")
    client = start()
    assert client.start_path.kind == SPAWNED
    assert client.start_path.reason == f"{warm_pool.POOL_ENV}=0"
    supervisor = psutil.Process(client.identity.pid).parent()
    assert supervisor is not None and supervisor.ppid() == os.getpid()  # no zygote between
    _echoes(client)


def test_another_environment_gets_its_own_zygote(start):
    plain = start()
    other = start(set_env={"EDGE_TEST_POOL_KEY": "other"})
    assert (plain.start_path.kind, other.start_path.kind) == (FORKED, FORKED)
    assert other.start_path.zygote != plain.start_path.zygote
    assert psutil.Process(other.identity.pid).environ().get("EDGE_TEST_POOL_KEY") == "other"
    assert "EDGE_TEST_POOL_KEY" not in psutil.Process(plain.identity.pid).environ()


def test_another_interpreter_is_spawned_and_says_why():
    zygote, reason = warm_pool.zygote_for("/usr/bin/python3-not-ours", dict(os.environ),
                                          foreign=False, supervised=True,
                                          outputs=(None, None))
    assert zygote is None
    assert reason == "the route's interpreter is not the controller's own"
    zygote, reason = warm_pool.zygote_for(sys.executable, dict(os.environ),
                                          foreign=True,
                                          supervised=True, outputs=(None, None))
    assert zygote is None and reason is not None


def test_a_pipe_for_the_output_is_spawned_and_says_why(start):
    client = start(stdout=subprocess.DEVNULL)
    assert client.start_path.kind == SPAWNED
    assert "cannot be passed to a forked worker" in (client.start_path.reason or "")


def test_an_entry_is_imported_by_the_forked_worker_never_by_the_zygote(start, capfd):
    # The entry's import starts a thread and prints: both happen in the worker, as in a
    # spawned one; the zygote stays one thread and silent, and keeps serving.
    threaded = attrs.evolve(test_route("echo"), entry="edge_test_threaded:echo")
    client = start(route=threaded)
    assert client.start_path.kind == FORKED, client.start_path
    zygote = client.start_path.zygote
    assert len(os.listdir(f"/proc/{zygote}/task")) == 1
    _echoes(client)
    again = start(route=threaded)
    assert again.start_path.kind == FORKED and again.start_path.zygote == zygote
    assert capfd.readouterr().err.count("edge_test_threaded imported") == 2  # once each


def test_a_start_interrupted_while_the_zygote_forks_leaves_no_process(start, monkeypatch):
    first = start()  # the zygote runs
    real = warm_pool.Zygote._answer
    calls = []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 1:  # the request is sent: the zygote forks; Ctrl-C before the answer
            raise KeyboardInterrupt
        return real(self)

    before = {p.pid for p in descendants()}
    monkeypatch.setattr(warm_pool.Zygote, "_answer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bootstrap.start_worker(test_route("echo"), generation=1)
    monkeypatch.setattr(warm_pool.Zygote, "_answer", real)
    assert len(calls) == 1  # its answer is never read: that zygote serves no more
    new = [p.pid for p in descendants() if p.pid not in before]
    assert not _wait_dead(new, 5.0)  # the fork it made ends (its answer undelivered)
    after = start()  # a new zygote serves
    assert after.start_path.kind == FORKED
    assert after.start_path.zygote != first.start_path.zygote
    _echoes(after)


_CONTROLLER = """
import json, os, sys, time
import attrs
import numpy as np
sys.path.insert(0, {workers!r})
from edge_contracts.shm import own_prefixes
from edge_contracts.requests import StageRequest, Operation
from edge_core.host import Route, start_worker
route = Route.default("echo", "edge_test_workers:echo", python_path=({workers!r},))
clients = [start_worker(route, generation=1, sealed_segments=False, shm_threshold=64)
           for _ in range(2)]
for client in clients:
    client.submit(StageRequest("r", "s0", 0, 1, Operation.RUN, params={{}}),
                  {{"x": np.ones(1024)}}).result(timeout=10)
print(json.dumps({{
    "paths": [c.start_path.kind for c in clients],
    "zygote": clients[0].start_path.zygote,
    "supervisors": [c._tree.root.pid for c in clients],
    "workers": [c.identity.pid for c in clients],
    "prefixes": sorted(own_prefixes()),
}}), flush=True)
time.sleep(120)
"""


def test_a_killed_controller_takes_its_zygote_supervisors_workers_and_segments_along():
    code = _CONTROLLER.format(workers=str(WORKERS))
    controller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert controller.stdout is not None
        line = controller.stdout.readline()
        assert line, "the controller said nothing"
        seen = json.loads(line)
        assert seen["paths"] == [FORKED, FORKED]
        segments = [name for prefix in seen["prefixes"] for name in segment_names(prefix)]
        assert segments  # there is something to clean up
        pids = [seen["zygote"], *seen["supervisors"], *seen["workers"]]
        assert all(_alive(pid) for pid in pids)
    finally:
        controller.kill()
        controller.wait()
        if controller.stdout is not None:
            controller.stdout.close()
    assert not _wait_dead(pids, 10.0)
    end = time.monotonic() + 5.0
    while time.monotonic() < end and any(segment_names(p) for p in seen["prefixes"]):
        time.sleep(0.05)
    assert not [name for prefix in seen["prefixes"] for name in segment_names(prefix)]


def _pooled(pid: int) -> warm_pool.Zygote:
    # the controller's handle on the zygote of this PID
    return next(z for z in warm_pool._zygotes.values() if z.pid == pid)


def test_a_ctrl_c_as_the_fork_request_goes_ends_that_fork_and_the_next_start_works(
        start, monkeypatch):
    # Interrupted as send_fds returned, the request sent and its answer unread: that
    # zygote's later answers could no longer be matched to their starts (every later
    # start of the key read the one before's answer and was refused at its hello)
    first = start()
    sent: list[int] = []
    send_fds = socket.send_fds

    def interrupted(sock, buffers, fds, *args):
        result = send_fds(sock, buffers, fds, *args)
        sent.append(result)
        raise KeyboardInterrupt

    before = {p.pid for p in descendants()}
    monkeypatch.setattr(socket, "send_fds", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bootstrap.start_worker(test_route("echo"), generation=1)
    monkeypatch.undo()
    assert len(sent) == 1
    new = [p.pid for p in descendants() if p.pid not in before]
    assert not _wait_dead(new, 5.0)  # the fork it made anyway ends (its channel closed)
    after = [start() for _ in range(3)]
    assert {c.start_path.kind for c in after} == {FORKED}
    assert after[0].start_path.zygote != first.start_path.zygote  # that one serves no more
    assert len({c.start_path.zygote for c in after}) == 1
    for number, client in enumerate(after):
        _echoes(client, f"r{number}")


def test_a_fork_left_unanswered_is_spawned_on_a_channel_of_its_own_and_the_fork_ends(start):
    # The zygote stopped as it should fork: the start gives it up after its timeout and
    # spawns; the fork the zygote makes once it runs again must not share that channel
    # (it read a request as its boot frame and tore the stream) and must end
    first = start()
    zygote = first.start_path.zygote
    assert zygote is not None
    _pooled(zygote)._timeout_s = 0.5
    before = {p.pid for p in descendants()}
    os.kill(zygote, signal.SIGSTOP)
    try:
        second = start()
    finally:
        os.kill(zygote, signal.SIGCONT)
    assert second.start_path.kind == SPAWNED
    assert "no answer within 0.5 s" in (second.start_path.reason or ""), second.start_path
    for number in range(20):
        _echoes(second, f"r{number}")
    own = {second._tree.root.pid, second.identity.pid}
    new = [p.pid for p in descendants() if p.pid not in before | own]
    assert not _wait_dead(new, 5.0)
    _echoes(second, "last")
    assert second.health().state == "ready"


def _umask_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))


def test_a_forked_worker_takes_the_controllers_directory_and_umask_of_its_start(
        start, tmp_path, monkeypatch):
    first = start()  # the zygote starts in the directory of this moment
    monkeypatch.chdir(tmp_path)
    old = os.umask(0o027)
    try:
        second = start()
    finally:
        os.umask(old)
    assert second.start_path.kind == FORKED
    assert second.start_path.zygote == first.start_path.zygote
    assert psutil.Process(second.identity.pid).cwd() == str(tmp_path)
    assert _umask_of(second.identity.pid) == 0o027
    assert _umask_of(first.identity.pid) == old


def test_a_forked_worker_holds_what_a_spawned_one_does_and_catches_the_same_signals(
        start, monkeypatch):
    # The supervisor's own descriptors (its wake pipe, the controller's pidfd) and its
    # SIGTERM handler are not the worker's: the worker forgets them after the fork
    forked = start()
    monkeypatch.setenv(warm_pool.POOL_ENV, "0")
    spawned = start()
    assert (forked.start_path.kind, spawned.start_path.kind) == (FORKED, SPAWNED)
    _echoes(forked)
    _echoes(spawned)

    def held(client) -> tuple[int, str]:
        pid = client.identity.pid
        with open(f"/proc/{pid}/status") as status:
            caught = next(line.split()[1] for line in status if line.startswith("SigCgt:"))
        return len(os.listdir(f"/proc/{pid}/fd")), caught

    assert held(forked) == held(spawned)


def test_a_ctrl_c_as_the_answer_is_read_keeps_none_of_its_descriptors(start, monkeypatch):
    # The status pipe's end and the supervisor's pidfd came with the answer: interrupted
    # as it is parsed, they were held by no one. (One interrupted as the receive itself
    # returns, before its result is bound, stays a window: the worker still ends.)
    start()
    fds_before = set(os.listdir("/proc/self/fd"))
    procs_before = {p.pid for p in descendants()}
    loads = json.loads

    def interrupted(data, *args, **kwargs):
        if isinstance(data, bytes) and b'"serial"' in data:  # the zygote's answer
            raise KeyboardInterrupt
        return loads(data, *args, **kwargs)

    monkeypatch.setattr(json, "loads", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bootstrap.start_worker(test_route("echo"), generation=1)
    monkeypatch.undo()
    new = [p.pid for p in descendants() if p.pid not in procs_before]
    assert not _wait_dead(new, 5.0)  # its worker reads its channel's end
    assert set(os.listdir("/proc/self/fd")) <= fds_before


def test_a_relative_pythonpath_entry_is_resolved_where_each_start_is_made(
        start, tmp_path, monkeypatch):
    # An interpreter resolves a relative PYTHONPATH entry against its directory at its
    # start: a zygote started elsewhere must not serve a start made here
    monkeypatch.chdir(WORKERS.parent)
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*inherited, WORKERS.name]))
    route = Route.default("echo", "edge_test_workers:echo")  # found through "workers"
    first = start(route=route)
    assert first.start_path.kind == FORKED
    _echoes(first)
    monkeypatch.chdir(tmp_path)  # no workers/ here: a spawned worker cannot import its entry
    with pytest.raises(BootstrapRefused, match="edge_test_workers"):
        start(route=route)


@pytest.fixture
def room() -> None:
    """No zygote of this process serves: a zygote started ahead never closes one."""
    warm_pool.close_pool()


def test_a_zygote_started_ahead_forks_the_first_start_after_its_imports(
        room, start, monkeypatch):
    monkeypatch.setenv("LANGUAGE", f"ahead-{time.monotonic_ns()}")  # a key of this test's own
    route = test_route("echo")
    env = environment.worker_environment(os.environ, python_path=route.python_path)
    early = warm_pool.start_early(route.interpreter, env, foreign=False, supervised=True)
    assert early is not None and early.handed == 0
    assert warm_pool.start_early(route.interpreter, env, foreign=False,
                                 supervised=True) is None  # one per key
    client = start(route=route)
    assert client.start_path == StartPath(FORKED, zygote=early.pid, forks=1)
    _echoes(client)
    warm_pool.end_unused([early])  # it was given a start: it stays
    assert early.alive()


def test_a_zygote_started_ahead_left_with_threads_spawns_that_key_from_then_on(
        room, start, tmp_path, monkeypatch):
    # what the zygote's interpreter start runs (a sitecustomize) leaves a thread running:
    # it never says ready; its first start is spawned and says why, and so is the next
    (tmp_path / "sitecustomize.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *inherited]))
    route = test_route("echo")
    env = environment.worker_environment(os.environ, python_path=route.python_path)
    early = warm_pool.start_early(route.interpreter, env, foreign=False, supervised=True)
    assert early is not None
    first = start(route=route)
    assert first.start_path.kind == SPAWNED
    assert "threads: 2 running" in (first.start_path.reason or ""), first.start_path
    _echoes(first)
    assert not _wait_dead([early.pid], 5.0)
    second = start(route=route)
    assert second.start_path.kind == SPAWNED and "threads" in (second.start_path.reason or "")
    assert early.pid not in warm_pool.pool_processes()


def test_a_zygote_started_ahead_that_refused_before_any_start_is_not_started_again(
        room, tmp_path, monkeypatch):
    # it refused (a thread left by its interpreter's start) and exited before any start
    # read its answer: the next start of its key is spawned with that reason at once,
    # and no second zygote of the key is started, there or ahead
    (tmp_path / "sitecustomize.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *inherited]))
    env = environment.worker_environment(os.environ)
    made = []

    class Counted(warm_pool.Zygote):
        def __init__(self, *args, **kwargs):
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(warm_pool, "Zygote", Counted)
    early = warm_pool.start_early(sys.executable, env, foreign=False, supervised=True)
    assert early is not None
    deadline = time.monotonic() + 30
    while not early.ended() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert early.ended() and early.unready is None  # its refusal not read yet
    zygote, reason = warm_pool.zygote_for(sys.executable, env, foreign=False, supervised=True,
                                          outputs=(None, None))
    assert zygote is None and "threads: 2 running" in (reason or ""), reason
    assert warm_pool.start_early(sys.executable, env, foreign=False, supervised=True) is None
    assert made == [early]


def test_a_zygote_imports_onnxruntime_only_where_asked_and_its_telemetry_is_off():
    # pre_imports: the backend's preload (ORT's is onnxruntime), but onnxruntime only
    # where ORT_DISABLE_TELEMETRY=1 (its import would start the uploader's thread)
    base = zygote_module.PRE_IMPORTS
    assert zygote_module.pre_imports({"ORT_DISABLE_TELEMETRY": "1"}) == base
    assert zygote_module.pre_imports({"ORT_DISABLE_TELEMETRY": "1"},
                                     ["onnxruntime"]) == (*base, "onnxruntime")
    assert zygote_module.pre_imports({"ORT_DISABLE_TELEMETRY": "0"}, ["onnxruntime"]) == base
    assert zygote_module.pre_imports({}, ["json", "numpy"]) == (*base, "json")
    # a zygote of a key that preloads nothing holds no onnxruntime
    zygote = warm_pool.Zygote(sys.executable, environment.worker_environment(os.environ))
    try:
        with open(f"/proc/{zygote.pid}/maps") as maps:
            assert "onnxruntime" not in maps.read()
    finally:
        zygote.end()


SPEAKS = "import sys\nprint('SITE-OUT')\nprint('SITE-ERR', file=sys.stderr)\n"


def test_what_a_zygote_started_ahead_printed_reaches_its_first_start_once(
        room, start, tmp_path, monkeypatch):
    # a sitecustomize speaks on both streams as the zygote's interpreter starts; its
    # stdout is a file, block-buffered (no PYTHONUNBUFFERED): written once, to the first
    # start's output; a later start's output has none of it
    (tmp_path / "sitecustomize.py").write_text(SPEAKS)
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *inherited]))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    route = test_route("echo")
    env = environment.worker_environment(os.environ, python_path=route.python_path)
    early = warm_pool.start_early(route.interpreter, env, foreign=False, supervised=True)
    assert early is not None
    logs = []
    for number in range(2):
        out, err = tmp_path / f"out{number}", tmp_path / f"err{number}"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            client = start(route=route, stdout=stdout, stderr=stderr)
        assert client.start_path == StartPath(FORKED, zygote=early.pid, forks=number + 1)
        _echoes(client)
        logs.append((out, err))
    client.retire(deadline_s=5.0)
    (first_out, first_err), (second_out, second_err) = logs
    assert first_out.read_text().count("SITE-OUT") == 1, first_out.read_text()
    assert first_err.read_text().count("SITE-ERR") == 1, first_err.read_text()
    assert "SITE" not in second_out.read_text() + second_err.read_text()


def test_a_zygote_started_ahead_and_killed_is_started_anew(room, monkeypatch):
    # killed (by someone else) before any start read its ready: no refusal was read,
    # so its key is not refused; the next start of the key gets a new zygote
    monkeypatch.setenv("LANGUAGE", f"killed-{time.monotonic_ns()}")
    env = environment.worker_environment(os.environ)
    early = warm_pool.start_early(sys.executable, env, foreign=False, supervised=True)
    assert early is not None
    os.kill(early.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not early.ended() and time.monotonic() < deadline:
        time.sleep(0.01)
    zygote, reason = warm_pool.zygote_for(sys.executable, env, foreign=False, supervised=True,
                                          outputs=(None, None))
    assert reason is None and zygote is not None and zygote is not early
    assert zygote.alive()


def test_a_zygote_started_ahead_and_never_used_is_ended(room, monkeypatch):
    monkeypatch.setenv("LANGUAGE", f"unused-{time.monotonic_ns()}")
    env = environment.worker_environment(os.environ)
    before = descendants()
    early = warm_pool.start_early(sys.executable, env, foreign=False, supervised=True)
    assert early is not None and early.pid in warm_pool.pool_processes()
    warm_pool.end_unused([early])
    assert early.ended() and early.pid not in warm_pool.pool_processes()
    assert descendants() == before


def test_a_fork_whose_start_was_given_up_says_what_it_is(tmp_path):
    # the controller closes the channel's end unsent (it gave the start up and spawned):
    # the forked worker says so on the start's stderr, not a boot error beside the
    # spawned worker's output
    zygote = warm_pool.Zygote(sys.executable, environment.worker_environment(os.environ))
    log = tmp_path / "start.log"
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with open(log, "wb") as output:
            process, _ = zygote.fork(prefixes=[], remove=[], channel=child.fileno(),
                                     segments=None, stdout=output.fileno(),
                                     stderr=output.fileno())
        child.close()
        parent.close()
        assert process.wait(timeout=10.0) == 0
    finally:
        zygote.end()
    said = log.read_text()
    assert zygote_module.GAVE_UP in said and "boot" not in said.replace(
        zygote_module.GAVE_UP, ""), said
