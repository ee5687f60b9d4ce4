"""The ``edge serve`` command itself: usage errors, signals while opening and serving."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from serving import EDGE, echo_pipeline, running

from edge_core.testing.leaks import leaks_since, snapshot


def _serve(*args: str, env: dict[str, str] | None = None,
           verbose: bool = True) -> subprocess.CompletedProcess[str]:
    """``edge serve ARGS``; ``verbose``: the workers' output on its stderr (no log folder
    left in the temporary folder by a pipeline that opened)."""
    return subprocess.run([EDGE, "serve", *args, *(["--verbose"] if verbose else [])],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


#: ``EDGE_PLUGINS`` naming the plugins a served echo pipeline needs, and one that no
#: installed distribution has.
NOT_INSTALLED = "edge-nope-not-installed"
ALLOWLIST = {"EDGE_PLUGINS": f"serve,echo,{NOT_INSTALLED}"}
NOT_INSTALLED_ERROR = {
    "plugin": NOT_INSTALLED, "named_by": "EDGE_PLUGINS",
    "error": f"not installed: no installed distribution has an entry point {NOT_INSTALLED!r} "
             "in group 'edge'"}


def test_the_timeouts_help_says_the_defaults_and_the_ceiling_the_server_uses() -> None:
    from edge_serve.guards import (
        DEFAULT_BODY_MIN_RATE,
        DEFAULT_BODY_TIMEOUT_S,
        MAX_BODY_MIN_RATE,
        MAX_TIMEOUT_S,
    )
    from edge_serve.heads import DEFAULT_HEADER_TIMEOUT_S

    done = subprocess.run([EDGE, "serve", "--help"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=True)
    shown = " ".join(done.stdout.split())
    assert f"default {DEFAULT_BODY_TIMEOUT_S:g}, above 0, at most {MAX_TIMEOUT_S:g} " \
        "--body-min-rate BYTES" in shown
    assert (f"default {DEFAULT_BODY_MIN_RATE} ({DEFAULT_BODY_MIN_RATE * 8 / 1000:g} kbit/s, "
            f"as Apache's mod_reqtimeout), 1 to {MAX_BODY_MIN_RATE} ") in shown
    assert f"default {DEFAULT_HEADER_TIMEOUT_S:g}, above 0, at most {MAX_TIMEOUT_S:g} " \
        in shown


def test_usage_errors_exit_2_before_anything_is_opened(tmp_path: Path) -> None:
    one = echo_pipeline(tmp_path, "same")
    two = echo_pipeline(tmp_path, "same", file="other.toml")
    done = _serve(str(one), str(two), "--port", "0")
    assert done.returncode == 2 and "pipelines[1].name: served twice: 'same'" in done.stderr
    bad = echo_pipeline(tmp_path, "a b")
    done = _serve(str(bad), "--port", "0")
    assert done.returncode == 2 and "name: expected letters" in done.stderr  # a URL segment
    done = _serve(str(one), "--port", "0", "--max-body-bytes", "0")
    assert done.returncode == 2 and "--max-body-bytes: must be at least 1" in done.stderr
    for option in ("--body-timeout", "--header-timeout"):
        for timeout in ("0", "-1", "inf", "nan", "3600.5"):
            done = _serve(str(one), "--port", "0", option, timeout)
            assert done.returncode == 2, (option, timeout, done.stderr)
            assert (f"{option}: must be a number of seconds > 0 and <= 3600: "
                    f"{float(timeout)}") in done.stderr, done.stderr
            assert "opening" not in done.stderr
    for rate in ("0", "-1", "1073741825"):
        done = _serve(str(one), "--port", "0", "--body-min-rate", rate)
        assert done.returncode == 2, (rate, done.stderr)
        assert ("--body-min-rate: must be a whole number of bytes a second from 1 to "
                f"1073741824: {rate}") in done.stderr, done.stderr
        assert "opening" not in done.stderr
    done = _serve(str(one), "--port", "0", "--body-min-rate", "1.5")
    assert done.returncode == 2 and "--body-min-rate: invalid int value: '1.5'" in done.stderr
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        done = _serve(str(one), "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "--host/--port: cannot bind" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([EDGE, "serve", str(one), "--port", "0"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "EDGE_HEAP": "eagre"})  # a typo: refused
    assert done.returncode == 2, done.stderr
    assert "EDGE_HEAP: names no heap policy (one of rest, eager, off" in done.stderr
    assert "'eagre'" in done.stderr and "opening" not in done.stderr


@pytest.mark.slow
def test_sigterm_while_opening_unwinds_and_leaves_nothing(tmp_path: Path) -> None:
    before = snapshot()
    slow = echo_pipeline(tmp_path, "slow", head='plugins = ["slow_open"]')
    pipelines = [echo_pipeline(tmp_path, "quick"), slow]
    env = {**os.environ, "EDGE_TEST_SLOW_LOAD_S": "3",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([EDGE, "serve", *map(str, pipelines), "--port", "0", "--json"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    lines = []
    for line in process.stderr:  # "quick" is open, "slow" is loading (for 3 s)
        lines.append(line)
        if "loading stage echo" in line and any("opening pipeline slow" in x for x in lines):
            break
    time.sleep(0.5)
    children = psutil.Process(process.pid).children(recursive=True)
    assert children  # the first pipeline's worker
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1, "".join(lines) + err
    assert "stopped by a signal before serving" in err and "Traceback" not in err
    closing = json.loads(out)  # says what the exit code says
    assert closing["ok"] is False and closing["stopped_before_serving"] is True
    assert closing["ledger_after_close"]["reservations"] == []
    report = leaks_since(before)
    assert not report.children, report.describe()  # (an echo stage uses no segment)


@pytest.mark.slow
def test_sigint_stops_a_server_keyed_by_edge_api_key(tmp_path: Path) -> None:
    with running([echo_pipeline(tmp_path, "echo")], stop_signal=signal.SIGINT,
                 env={"EDGE_API_KEY": "from-env"}) as served:
        assert httpx.get(f"{served.url}/health", timeout=30).status_code == 200
        assert httpx.get(f"{served.url}/v1/pipelines", timeout=30).status_code == 401
        assert httpx.get(f"{served.url}/v1/pipelines", timeout=30,
                         headers={"Authorization": "Bearer from-env"}).status_code == 200
    assert served.returncode == 0


@pytest.mark.slow
def test_a_pipeline_that_fails_to_open_closes_those_already_open(tmp_path: Path) -> None:
    before = snapshot()
    good = echo_pipeline(tmp_path, "good")
    broken = echo_pipeline(tmp_path, "broken", options='fail_at = "warmup"')
    done = _serve(str(good), str(broken), "--port", "0", "--json")
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and "InjectedFailure" in answer["error"]
    assert "Traceback" not in done.stderr
    assert "listening on" not in done.stderr
    report = leaks_since(before)
    assert not report.children, report.describe()


@pytest.mark.slow
def test_a_demand_on_a_pool_no_backend_reports_is_the_files_problem_as_in_edge_run(
        tmp_path: Path) -> None:
    # Found from the pools the host and the probes report, before either pipeline opens
    # (the stage has no candidates to fall back to): exit 2 naming the stage's demand at
    # the file's path, as `edge run` says of the same file (it was 1, as for a pipeline
    # that failed to load).
    before = snapshot()
    good = echo_pipeline(tmp_path, "good")
    broken = echo_pipeline(tmp_path, "unpooled",
                           stage='[stages.resources]\ndemands = { "npu:sram" = "1 MiB" }')
    done = _serve(str(good), str(broken), "--port", "0", "--json")
    assert done.returncode == 2, done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is False
    assert answer["error"].startswith(
        f'{broken}: stages[0].resources.demands["npu:sram"] (stage \'echo\'): unknown pool'
    ), answer["error"]  # the file's path of it, not the ledger's
    assert [p.split(": unknown pool")[0] for p in answer["problems"]] == [
        'stages[0].resources.demands["npu:sram"] (stage \'echo\')']
    assert "Traceback" not in done.stderr and "listening on" not in done.stderr
    assert "opening pipeline" not in done.stderr  # refused before either opened
    ran = subprocess.run([EDGE, "run", str(broken), "--json"], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert ran.returncode == 2, ran.stderr
    report = leaks_since(before)
    assert not report.children, report.describe()


@pytest.mark.slow
def test_a_request_still_running_when_the_grace_period_ends_is_answered_503(
        tmp_path: Path) -> None:
    # A 6 s echo call, SIGTERM after it started, a grace period of 0.5 s: the request is
    # answered by its route (503, not retried), uvicorn cuts nothing, the log shows no
    # traceback, and the closing summary lists the stage's retire time.
    import base64

    import numpy as np

    x = np.ones((2, 2), np.float32)
    body = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                             "data": base64.b64encode(x.tobytes()).decode()}}}
    with running([echo_pipeline(tmp_path, "slow", delay_s=6.0,
                                backend="echo-preemptible")], "--grace", "0.5") as served:
        answer: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answer.append(httpx.post(
            f"{served.url}/v1/pipelines/slow/run", json=body, timeout=60)))
        sender.start()
        time.sleep(1.0)  # the call is running in the worker
        started = time.monotonic()
        served.send_signal(signal.SIGTERM)
        sender.join(60)
        ended = time.monotonic() - started
    (reply,) = answer
    error = reply.json()["error"]
    assert reply.status_code == 503 and error["code"] == "server_shutting_down", reply.text
    assert reply.headers["x-should-retry"] == "false"
    assert 0.4 < ended < 5.0  # at the end of the grace period, not of the 6 s call
    log = "".join(served.stderr)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert set(served.summary["retire_s"]["slow"]) == {"echo"}
    assert served.summary["closing_s"] >= 0


@pytest.mark.slow
def test_a_second_sigint_answers_every_open_request_503_at_once_without_a_traceback(
        tmp_path: Path) -> None:
    # One request runs (a 30 s call), two wait in the queue (admission 1); SIGINT starts
    # an 8 s grace period and a second SIGINT ends it now: every client gets the JSON
    # 503 of a grace period's end, long before it would have ended, and uvicorn cancels
    # no task into a 500 (no "Exception in ASGI application" in the log).
    import base64

    import numpy as np

    x = np.ones((2, 2), np.float32)
    body = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                             "data": base64.b64encode(x.tobytes()).decode()}}}
    with running([echo_pipeline(tmp_path, "slow", delay_s=30.0,
                                backend="echo-preemptible")], "--grace", "8") as served:
        answers: list[httpx.Response] = []
        senders = [threading.Thread(target=lambda: answers.append(httpx.post(
            f"{served.url}/v1/pipelines/slow/run", json=body, timeout=60)))
            for _ in range(3)]
        for sender in senders:
            sender.start()
        waiting = time.monotonic() + 30.0
        while httpx.get(f"{served.url}/v1/pipelines/slow").json()["queue"]["waiting"] < 2:
            assert time.monotonic() < waiting, "the requests never queued"
            time.sleep(0.05)
        started = time.monotonic()
        served.send_signal(signal.SIGINT)
        time.sleep(0.3)
        served.send_signal(signal.SIGINT)
        for sender in senders:
            sender.join(60)
        ended = time.monotonic() - started
        served.process.wait(60)
    assert len(answers) == 3
    for reply in answers:
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "server_shutting_down", reply.text
        assert reply.headers["x-should-retry"] == "false"
    assert ended < 6.0  # the second SIGINT, not the end of the 8 s grace period
    log = "".join(served.stderr)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


@pytest.mark.slow
def test_plugins_that_did_not_load_are_listed_by_health_the_start_line_and_the_summary(
        tmp_path: Path) -> None:
    # one plugin EDGE_PLUGINS names that is not installed, one module a pipeline's plugins
    # lists that does not import: the pipelines open and serve without them, and the
    # server says so where an operator looks
    pipelines = [echo_pipeline(tmp_path, "plain"),
                 echo_pipeline(tmp_path, "extra", head='plugins = ["edge_no_such_module"]')]
    expected = [NOT_INSTALLED_ERROR,
                {"plugin": "edge_no_such_module", "named_by": "configuration",
                 "error": "import failed: ModuleNotFoundError: No module named "
                          "'edge_no_such_module'"}]
    with running(pipelines, env=ALLOWLIST) as served:
        deadline = time.monotonic() + 90.0
        while (reply := httpx.get(f"{served.url}/health", timeout=30)).status_code != 200:
            assert time.monotonic() < deadline, reply.text
            time.sleep(0.1)
        health = reply.json()
    # /health needs no key: it names them, their errors stay with the operator
    assert health["status"] == "ok" and health["plugin_errors"] == [
        {"plugin": failure["plugin"], "named_by": failure["named_by"]} for failure in expected]
    assert "No module named" not in reply.text
    (line,) = [line for line in served.stderr if "listening on" in line]
    assert line.rstrip().endswith(
        f"(plain, extra); plugins that did not load: {NOT_INSTALLED}, edge_no_such_module "
        "(GET /health lists them as plugin_errors)"), line
    assert served.summary["plugin_errors"] == expected


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "code", "error"), [
    pytest.param({"backend": "echo-typo"}, 2, "echo-typo", id="a file refused"),
    pytest.param({"options": 'fail_at = "warmup"'}, 1, "InjectedFailure",
                 id="a pipeline that fails to open"),
])
def test_a_refusal_lists_the_plugins_that_did_not_load_in_its_json(
        tmp_path: Path, stage: dict[str, str], code: int, error: str) -> None:
    broken = echo_pipeline(tmp_path, "broken", **stage)
    done = _serve(str(broken), "--port", "0", "--json", env=ALLOWLIST)
    assert done.returncode == code, done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and error in answer["error"]
    assert answer["plugin_errors"] == [NOT_INSTALLED_ERROR]
    assert f"warning: plugin {NOT_INSTALLED!r} (named by EDGE_PLUGINS) did not load" \
        in done.stderr


NOISY_WORKER = """
import sys
import warnings


def create():
    print("NOISY-LOAD out", flush=True)
    print("NOISY-LOAD err", file=sys.stderr, flush=True)
    warnings.warn("NOISY-LOAD warning")
    from edge_echo.worker import create as echo
    return echo()
"""


def _noisy_pipeline(folder: Path, name: str, options: str = "") -> Path:
    """An echo pipeline whose worker speaks on both streams as it loads, as a runtime may."""
    noisy = folder / "noisy"
    noisy.mkdir(exist_ok=True)
    (noisy / "noisy_worker.py").write_text(NOISY_WORKER)
    route = (f'\n[stages.backend.route]\nname = "noisy"\ninterpreter = "{sys.executable}"\n'
             f'entry = "noisy_worker:create"\npython_path = ["{noisy}"]\n')
    return echo_pipeline(folder, name, options=options + route)


def _named_folder(stderr: str) -> Path:
    (line,) = {x for x in stderr.splitlines() if x.startswith("edge: worker logs: ")}
    return Path(line.removeprefix("edge: worker logs: "))


def _logged(folder: Path) -> str:
    return "".join(log.read_text() for log in sorted(folder.iterdir()))


@pytest.mark.slow
def test_the_workers_output_goes_to_the_log_folder_the_server_names(tmp_path: Path) -> None:
    # it reached the server's stderr between its own lines ("listening on" among them),
    # unlike edge run's and edge plan's; --verbose still shows it there
    pipeline = _noisy_pipeline(tmp_path, "noisy")
    (tmp_path / "tmp").mkdir()
    with running([pipeline], verbose=False, env={"TMPDIR": str(tmp_path / "tmp")}) as served:
        pass
    said = "".join(served.stderr) + "".join(served.stdout)
    assert "NOISY" not in said, said
    folder = _named_folder("".join(served.stderr))
    assert folder.parent == tmp_path / "tmp"
    assert served.summary["worker_logs"] == str(folder)
    text = _logged(folder)
    for line in ("NOISY-LOAD out", "NOISY-LOAD err", "UserWarning: NOISY-LOAD warning"):
        assert line in text, (line, text)
    with running([pipeline]) as shown:  # --verbose
        pass
    assert shown.summary["worker_logs"] is None
    assert "NOISY-LOAD err" in "".join(shown.stderr)
    assert "worker logs" not in "".join(shown.stderr)
    quiet = echo_pipeline(tmp_path, "quiet")  # its worker says nothing
    with running([quiet], verbose=False, env={"TMPDIR": str(tmp_path / "tmp")}) as silent:
        pass
    assert Path(silent.summary["worker_logs"]).parent == tmp_path / "tmp"
    # its log stayed empty: removed at exit with its folder; the noisy one is kept
    assert list((tmp_path / "tmp").iterdir()) == [folder]


@pytest.mark.slow
def test_a_pipeline_that_fails_to_open_names_its_workers_log_folder_in_its_json(
        tmp_path: Path) -> None:
    before = snapshot()
    broken = _noisy_pipeline(tmp_path, "broken", options='fail_at = "warmup"')
    (tmp_path / "tmp").mkdir()
    done = _serve(str(broken), "--port", "0", "--json", verbose=False,
                  env={"TMPDIR": str(tmp_path / "tmp")})
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and "InjectedFailure" in answer["error"]
    assert "NOISY" not in done.stderr
    assert answer["worker_logs"] == str(_named_folder(done.stderr))
    assert "NOISY-LOAD err" in _logged(Path(answer["worker_logs"]))
    report = leaks_since(before)
    assert not report.children, report.describe()
