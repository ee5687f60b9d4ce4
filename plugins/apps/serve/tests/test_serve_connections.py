"""The connection cap and the open-file limit, through real ``edge serve`` processes.

Each connection is one of the server's file descriptors. More connections than its
open-file limit, opened within one header timeout, used to fill the server until the
header timeout cut them: ``accept()`` failed with ``EMFILE``, asyncio logged it, and
``/health`` and real requests timed out meanwhile. Here servers run with their open-file
limit lowered (``resource.setrlimit`` before ``edge`` starts), or a small
``--max-connections``, and raw sockets open idle connections past them, or hold requests
open: a real request is still served within a bound, idle connections are closed for it
longest-waiting first, a connection that finds every one busy is closed at once, the
counts show on ``/metrics``, and the server's descriptors return to their baseline. A
cap filled by clients trickling their bodies frees itself by the body's rate bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import EDGE, Served, echo_pipeline, running

from edge_core.testing.leaks import leaks_since, snapshot

pytestmark = pytest.mark.slow

LIMIT = 256
"""The open-file limit (soft and hard) of the server that is flooded."""

CAP = 4
"""``--max-connections`` of the ``capped`` server."""

X = {"inputs": {"x": {"dtype": "float32", "shape": [2], "data": "AACAPwAAgD8="}}}
"""A request of the echo pipeline: [1, 1]."""


def _files(soft: int, hard: int) -> Callable[[], None]:
    """A preexec function: the child's open-file limit set to ``(soft, hard)``."""
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return lower


def _hard_at_least(files: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < files:
        pytest.skip(f"this process's hard open-file limit is {hard}")


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``plain`` (echo) with the server's open-file limit at ``LIMIT`` (soft and hard)."""
    folder = tmp_path_factory.mktemp("flooded")
    with running([echo_pipeline(folder, "plain")], preexec=_files(LIMIT, LIMIT)) as served:
        yield served


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``plain`` (echo) under ``--max-connections CAP``."""
    folder = tmp_path_factory.mktemp("capped")
    with running([echo_pipeline(folder, "plain")], "--max-connections", str(CAP)) as served:
        yield served


BODY_TIMEOUT_S = 1.0
"""``--body-timeout`` of the ``trickled`` server."""

BODY_MIN_RATE = 1000
"""``--body-min-rate`` of the ``trickled`` server (bytes a second)."""


@pytest.fixture(scope="module")
def trickled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``plain`` (echo) under ``--max-connections CAP``, a short ``--body-timeout`` and
    ``--body-min-rate``."""
    folder = tmp_path_factory.mktemp("trickled")
    with running([echo_pipeline(folder, "plain")], "--max-connections", str(CAP),
                 "--body-timeout", str(BODY_TIMEOUT_S), "--body-min-rate",
                 str(BODY_MIN_RATE)) as served:
        yield served


def _address(served: Served) -> tuple[str, int]:
    parts = urlsplit(served.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _unpooled(served: Served) -> httpx.Client:
    """A client that opens a connection for each request and closes it after."""
    return httpx.Client(base_url=served.url, timeout=10,
                        limits=httpx.Limits(max_keepalive_connections=0))


def _connections(client: httpx.Client) -> dict[str, float]:
    """The ``edge_connections_*`` samples by name."""
    return {sample.name: sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples if sample.name.startswith("edge_connections_")}


def _fds(served: Served) -> int:
    return psutil.Process(served.process.pid).num_fds()


def _settled(read: Callable[[], float], target: float, within_s: float = 10.0) -> float:
    """``read()`` once it is at most ``target``, or its last value after ``within_s``."""
    deadline = time.monotonic() + within_s
    value = read()
    while value > target and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def _health_within(served: Served, within_s: float) -> float:
    """How long until ``GET /health`` on a new connection is answered 200 (a connection
    closed at once is tried again), at most ``within_s``."""
    started = time.monotonic()
    while True:
        try:
            with _unpooled(served) as client:
                if client.get("/health").status_code == 200:
                    return time.monotonic() - started
        except httpx.TransportError:
            pass
        assert time.monotonic() - started < within_s
        time.sleep(0.05)


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closed ``sock`` (an end of stream or a reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _still_open(sock: socket.socket) -> bool:
    """Whether ``sock`` is open on the server's side too (nothing to read, no end)."""
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)
    return False


def _no_accept_errors(served: Served) -> None:
    text = "".join(served.stderr)
    for sign in ("out of system resource", "Too many open files", "Traceback",
                 "edge serve: error"):
        assert sign not in text, text[-3000:]


def test_more_idle_connections_than_the_open_file_limit_leave_real_requests_served(
        flooded: Served) -> None:
    """Twice the server's open-file limit in idle connections, opened at once, filled it:
    accept() failed with EMFILE and /health timed out until the header timeout (10 s)
    cut them. Now the connection cap (what the limit holds) closes the idle connection
    that waited longest for each new one: every real request is answered at once, no
    accept error is logged, the server never holds more than the cap allows, and once
    the connections are gone its descriptors are back to what they were."""
    _hard_at_least(LIMIT)
    assert psutil.Process(flooded.process.pid).rlimit(psutil.RLIMIT_NOFILE) == (LIMIT, LIMIT)
    with _unpooled(flooded) as client:
        assert client.post("/v1/pipelines/plain/run", json=X).status_code == 200
        before = _connections(client)
        time.sleep(0.5)
        baseline = min(_fds(flooded) for _ in range(5))  # the clients' closes seen
        socks = [socket.create_connection(_address(flooded), timeout=10)
                 for _ in range(2 * LIMIT)]
        try:
            for _ in range(5):
                started = time.monotonic()
                reply = client.post("/v1/pipelines/plain/run", json=X)
                assert reply.status_code == 200, reply.text
                assert client.get("/health").status_code == 200
                assert time.monotonic() - started < 3.0
            assert f"open-file limit {LIMIT} (hard {LIMIT}); at most " in "".join(
                flooded.stderr)
            cap = before["edge_connections_limit"]
            assert 1 <= cap < LIMIT / 2
            from edge_serve.connections import EVICTING_AT_ONCE

            held = _fds(flooded)
            assert held <= baseline + cap + EVICTING_AT_ONCE, (held, baseline, cap)
            during = _connections(client)
            assert during["edge_connections_evicted_total"] \
                - before["edge_connections_evicted_total"] >= 2 * LIMIT - cap
            assert during["edge_connections_refused_total"] \
                == before["edge_connections_refused_total"]
            assert during["edge_connections_open"] <= cap
            open_now = sum(_still_open(sock) for sock in socks)
            assert 0 < open_now < cap, open_now  # the newest idle ones, less the requests'
        finally:
            for sock in socks:
                sock.close()
        assert _settled(lambda: _fds(flooded), baseline) <= baseline
        assert _settled(lambda: _connections(client)["edge_connections_open"], 1.0) == 1.0
    _no_accept_errors(flooded)


def test_at_the_cap_the_connection_idle_longest_is_closed_for_a_new_one(
        capped: Served) -> None:
    """At ``--max-connections`` a new connection closes the one that has waited longest
    for a request head — here the first opened (silent), then the second (part of a head
    sent: a slow head) — and is served; the others stay open."""
    request = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
    with _unpooled(capped) as client:
        evicted = _connections(client)["edge_connections_evicted_total"]
        _settled(lambda: _connections(client)["edge_connections_open"], 1.0)
        idle = []
        for index in range(CAP):
            idle.append(socket.create_connection(_address(capped), timeout=10))
            if index == 1:
                idle[-1].sendall(request[:20])
            time.sleep(0.05)
        time.sleep(1.5)  # the sweep (every second) has seen them all waiting
        fresh = []
        try:
            for first in range(2):
                sock = socket.create_connection(_address(capped), timeout=10)
                fresh.append(sock)
                sock.sendall(request)
                answer = sock.recv(65536)
                assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
                assert _closed_by_server(idle[first], 2.0), first
                assert all(_still_open(other) for other in idle[first + 1:]), first
        finally:
            for sock in idle + fresh:
                sock.close()
        assert _connections(client)["edge_connections_evicted_total"] - evicted == 2
    _no_accept_errors(capped)


def test_at_the_cap_with_every_connection_busy_a_new_one_is_closed_at_once(
        capped: Served) -> None:
    """When every connection has a request running (here bodies that have not all
    arrived, each within ``BEHIND_S`` of its head: not behind yet), none is closed for a
    new one: the new one is accepted and closed at once
    (not left to wait, not answered 503, which would mean holding it until its request
    is read), counted in ``edge_connections_refused_total``; once a connection is free,
    a new one is served."""
    head = (b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"in")
    with _unpooled(capped) as client:
        counts = _connections(client)
        _settled(lambda: _connections(client)["edge_connections_open"], 1.0)
    busy = [socket.create_connection(_address(capped), timeout=10) for _ in range(CAP)]
    try:
        for sock in busy:
            sock.sendall(head)
        time.sleep(0.3)
        for _ in range(3):
            with socket.create_connection(_address(capped), timeout=10) as late:
                started = time.monotonic()
                assert _closed_by_server(late, 2.0)
                assert time.monotonic() - started < 1.0
        assert all(_still_open(sock) for sock in busy)
    finally:
        busy[0].close()
    try:
        assert _health_within(capped, 3.0) < 3.0
        with _unpooled(capped) as client:
            now = _connections(client)
    finally:
        for sock in busy[1:]:
            sock.close()
    assert now["edge_connections_refused_total"] - counts["edge_connections_refused_total"] \
        >= 3
    assert now["edge_connections_evicted_total"] == counts["edge_connections_evicted_total"]
    _no_accept_errors(capped)


def test_a_cap_filled_by_bodies_trickled_within_the_body_timeout_frees_itself(
        trickled: Served) -> None:
    """A slow-body attack ("R-U-Dead-Yet"): clients that send a body a byte at a time,
    each within ``--body-timeout``, have requests running, so none is closed for a new
    connection; enough of them filled the cap, and every new connection was refused for
    as long as they went on. Now each is answered 408 once its body is slower than
    ``--body-min-rate`` allows, and closed (after lingering, though its client keeps it
    open): the cap frees itself within the bound, and a new client is served."""
    from edge_serve.lingering import LINGER_S

    head = (b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
    with _unpooled(trickled) as client:
        counts = _connections(client)
        cut = {sample.labels["reason"]: sample.value
               for family in text_string_to_metric_families(client.get("/metrics").text)
               for sample in family.samples if sample.name == "edge_body_timeouts_total"}
        _settled(lambda: _connections(client)["edge_connections_open"], 1.0)
    busy = [socket.create_connection(_address(trickled), timeout=10) for _ in range(CAP)]
    try:
        for sock in busy:
            sock.sendall(head)
        started = time.monotonic()
        refused = 0
        answers = [b""] * CAP
        while time.monotonic() - started < 3 * BODY_TIMEOUT_S and not all(answers):
            for index, sock in enumerate(busy):
                if not answers[index]:
                    sock.sendall(b" ")  # a byte each 50 ms: twenty within the body timeout
                    sock.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        answers[index] = sock.recv(65536)
                    sock.setblocking(True)
            if 0.3 <= time.monotonic() - started < 0.8 * BODY_TIMEOUT_S:  # all running
                with socket.create_connection(_address(trickled), timeout=10) as late:
                    assert _closed_by_server(late, 1.0)  # the cap full of running requests
                refused += 1
            time.sleep(0.05)
        took = time.monotonic() - started
        assert refused >= 3
        assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers
        assert BODY_TIMEOUT_S <= took < 2 * BODY_TIMEOUT_S + 1.0, took
        # the trickling clients keep their sockets open: the server closes them itself
        assert all(_closed_by_server(sock, LINGER_S + 2.0) for sock in busy)
        assert _health_within(trickled, 3.0) < 3.0
        with _unpooled(trickled) as client:
            assert client.post("/v1/pipelines/plain/run", json=X).status_code == 200
            now = _connections(client)
            metrics = client.get("/metrics").text
    finally:
        for sock in busy:
            sock.close()
    slow = [sample.value for family in text_string_to_metric_families(metrics)
            for sample in family.samples if sample.name == "edge_body_timeouts_total"
            and sample.labels["reason"] == "slow"]
    assert slow == [cut["slow"] + CAP]
    assert now["edge_connections_refused_total"] - counts["edge_connections_refused_total"] \
        >= refused
    assert now["edge_connections_evicted_total"] == counts["edge_connections_evicted_total"]
    _no_accept_errors(trickled)


def _body_cuts(client: httpx.Client) -> dict[str, float]:
    """``edge_body_timeouts_total`` by reason."""
    return {sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples if sample.name == "edge_body_timeouts_total"}


def _held(client: httpx.Client) -> dict[str, object]:
    """What requests hold: each pipeline's in-flight calls and waiting requests, and the
    ledger's reserved bytes."""
    held = {p["name"]: ([s["in_flight"] for s in p["stages"]], p["queue"]["waiting"])
            for p in client.get("/v1/pipelines").json()["pipelines"]}
    reserved = {sample.labels["pool"]: sample.value
                for family in text_string_to_metric_families(client.get("/metrics").text)
                for sample in family.samples if sample.name == "edge_ledger_reserved_bytes"}
    return {"held": held, "reserved": reserved}


def _answer(sock: socket.socket, within_s: float) -> tuple[int, dict[str, str], bytes]:
    """One whole HTTP answer read from ``sock``: its status, headers and body."""
    sock.settimeout(within_s)
    raw = b""
    while b"\r\n\r\n" not in raw:
        part = sock.recv(65536)
        assert part, f"closed after {raw!r}"
        raw += part
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        part = sock.recv(65536)
        assert part, f"closed after {raw + body!r}"
        body += part
    return int(status_line.split()[1]), headers, body


STALLED_HEAD = (b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
"""A request head declaring a large body, and the body's first byte: all a sender of the
slow-body attack sends."""


def test_at_the_cap_the_body_behind_longest_is_cut_408_for_a_new_client(
        capped: Served) -> None:
    """A head and a byte of body held a place in the cap for ``--body-timeout`` (30 s
    here) before the minimum rate cut it, and the cap closes only connections waiting for
    a head: a sender reopening a whole cap's worth of them every 30 s kept every new
    client out. Now, at the cap with no connection waiting for a head, the request whose
    body has been ``BEHIND_S`` behind ``--body-min-rate`` (counted from its head) longest
    is cut, or the one that has received nothing for as long (the first here: a burst
    worth 20 s of the rate, then nothing): answered 408 whole (``BodyTooSlow``,
    ``Connection: close``) and its connection ends, the new client is served at once,
    and the others stay. Within
    ``BEHIND_S`` of their heads no body is behind, and a new connection is refused.
    Counted in ``edge_connections_evicted_total`` and
    ``edge_body_timeouts_total{reason="evicted"}``; nothing was charged."""
    from edge_serve.guards import BEHIND_S, DEFAULT_BODY_MIN_RATE

    burst = 20 * DEFAULT_BODY_MIN_RATE
    with _unpooled(capped) as client:
        counts = _connections(client)
        cut = _body_cuts(client)
        before = _held(client)
        _settled(lambda: _connections(client)["edge_connections_open"], 1.0)
    held: list[socket.socket] = []
    try:
        first = time.monotonic()
        for index in range(CAP):  # the first sent is the longest behind
            held.append(socket.create_connection(_address(capped), timeout=10))
            # the first sends 20 s of the rate's worth at once, then nothing: behind too
            held[-1].sendall(STALLED_HEAD + (b" " * burst if index == 0 else b""))
            time.sleep(0.1)
        time.sleep(0.3)  # every head read: their requests wait for their bodies
        with socket.create_connection(_address(capped), timeout=10) as late:
            assert _closed_by_server(late, 1.0)  # none behind yet: refused
        assert time.monotonic() - first < BEHIND_S - 0.2  # (the check above was in time)
        time.sleep(max(0.0, first + BEHIND_S + 0.3 - time.monotonic()))
        # served within a listing's interval, not after the 30 s body timeout
        assert _health_within(capped, 5.0) < 3.0
        status, headers, body = _answer(held[0], 5.0)
        assert status == 408, body[:300]
        assert headers["connection"] == "close"
        error = json.loads(body)["error"]
        assert (error["code"], error["edge"]["kind"], error["edge"]["field"]) == (
            "body_timeout", "BodyTooSlow", "body")
        assert error["message"].startswith(
            f"body: more than {BEHIND_S:g} s behind {DEFAULT_BODY_MIN_RATE} bytes a second "
            f"counted from the head, or nothing received for {BEHIND_S:g} s, while the "
            "server held its most connections (--body-min-rate, --max-connections): closed "
            f"to make room for another: {burst + 1} bytes received of the 100000 its "
            "Content-Length declares in "), error["message"]
        assert _closed_by_server(held[0], 1.0)  # its side ended after the answer
        assert all(_still_open(sock) for sock in held[1:])
        # the cap filled again with a body not yet behind: the next new client cuts the
        # one behind longest of the others, never the newest
        fresh = socket.create_connection(_address(capped), timeout=10)
        held.append(fresh)
        fresh.sendall(STALLED_HEAD)
        time.sleep(0.3)
        assert _health_within(capped, 5.0) < 3.0
        assert _answer(held[1], 5.0)[0] == 408
        assert all(_still_open(sock) for sock in held[2:])
    finally:
        for sock in held:
            sock.close()
    with _unpooled(capped) as client:  # (a new connection at the cap would cut another)
        assert _settled(lambda: _connections(client)["edge_connections_open"], 1.0) == 1.0
        now = _connections(client)
        now_cut = _body_cuts(client)
        assert _held(client) == before
    assert now["edge_connections_evicted_total"] - counts["edge_connections_evicted_total"] \
        == 2
    assert now_cut["evicted"] - cut["evicted"] == 2
    assert (now_cut["slow"], now_cut["stalled"]) == (cut["slow"], cut["stalled"])
    _no_accept_errors(capped)


def test_at_the_cap_bodies_arriving_at_a_good_rate_are_never_cut_for_a_new_client(
        capped: Served) -> None:
    """A cap filled by requests whose bodies keep coming at twice ``--body-min-rate``,
    for longer than ``BEHIND_S`` past their heads, is not a cap to make room in: new
    connections are refused at once, no body is cut, and each request is answered 200
    once its body is whole."""
    from edge_serve.guards import BEHIND_S, DEFAULT_BODY_MIN_RATE

    every_s = 0.05
    piece = int(2 * DEFAULT_BODY_MIN_RATE * every_s)  # twice the rate
    body = json.dumps(X).encode()
    body += b" " * (int(2 * DEFAULT_BODY_MIN_RATE * (BEHIND_S + 2.0)) - len(body))
    head = (b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    with _unpooled(capped) as client:
        counts = _connections(client)
        cut = _body_cuts(client)
        _settled(lambda: _connections(client)["edge_connections_open"], 1.0)
    senders = [socket.create_connection(_address(capped), timeout=10) for _ in range(CAP)]
    refused = 0
    try:
        for sock in senders:
            sock.sendall(head)
        started = time.monotonic()
        at = 0
        while at < len(body):
            for sock in senders:
                sock.sendall(body[at:at + piece])
            at += piece
            if time.monotonic() - started > BEHIND_S + 0.5 and at % (10 * piece) == 0:
                with socket.create_connection(_address(capped), timeout=10) as late:
                    assert _closed_by_server(late, 1.0)  # refused: none to cut
                refused += 1
            time.sleep(every_s)
        assert time.monotonic() - started > BEHIND_S + 1.0
        assert refused >= 2
        for sock in senders:
            status, _, answer = _answer(sock, 10.0)
            assert status == 200, answer[:300]
            assert json.loads(answer)["outputs"]["x"]["shape"] == [2]
    finally:
        for sock in senders:
            sock.close()
    with _unpooled(capped) as client:
        _settled(lambda: _connections(client)["edge_connections_open"], 1.0)
        now = _connections(client)
        now_cut = _body_cuts(client)
    assert now["edge_connections_evicted_total"] == counts["edge_connections_evicted_total"]
    assert now["edge_connections_refused_total"] - counts["edge_connections_refused_total"] \
        >= refused
    assert now_cut == cut
    _no_accept_errors(capped)


def test_the_soft_open_file_limit_is_raised_to_the_hard_one_and_said(tmp_path: Path) -> None:
    """A server started with a soft open-file limit under its hard one raises it (its
    workers inherit it), says so on start and in the closing summary, and sizes its
    connection cap from it."""
    soft, hard = 256, 4096
    _hard_at_least(hard)
    with running([echo_pipeline(tmp_path, "plain")], preexec=_files(soft, hard)) as served:
        server = psutil.Process(served.process.pid)
        assert server.rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)
        assert all(child.rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)
                   for child in server.children(recursive=True))
        with _unpooled(served) as client:
            cap = int(_connections(client)["edge_connections_limit"])
        assert cap > soft
    shown = "".join(served.stderr)
    assert (f"edge serve: open-file limit raised from {soft} to {hard} (hard {hard}); at "
            f"most {cap} connections (--max-connections)") in shown, shown
    assert served.summary["open_files"] == {"soft_before": soft, "soft": hard, "hard": hard}
    assert served.summary["connections"] == {"max": cap, "refused": 0, "evicted": 0}


def _serve(path: Path, *args: str,
           preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGE, "serve", str(path), "--port", "0", "--json", "--verbose",
                           *args],  # the workers' output on stderr: no log folder left
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, preexec_fn=preexec)


def test_more_connections_than_the_open_file_limit_holds_are_refused_naming_the_figures(
        tmp_path: Path) -> None:
    """``--max-connections`` past what the open-file limit holds (two files a connection,
    after the server's own and those kept spare), or a limit too low for any connection,
    is a usage error (exit 2) naming the figures, with every worker retired; a cap below
    1 is refused before anything opens."""
    _hard_at_least(LIMIT)
    path = echo_pipeline(tmp_path, "plain")
    before = snapshot()
    done = _serve(path, "--max-connections", "1000", preexec=_files(LIMIT, LIMIT))
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error.startswith("--max-connections: at most "), error
    assert (f"fit: the open-file limit is {LIMIT} (hard {LIMIT}), " in error
            and "kept spare, 2 a connection; raise the limit (ulimit -n) or ask for fewer: "
            "1000" in error), error
    done = _serve(path, preexec=_files(72, 72))
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error.startswith("--max-connections: no connection fits: the open-file limit is "
                            "72 (hard 72), "), error
    assert not leaks_since(before).children
    for bad in ("0", "-3", "many"):
        done = _serve(path, "--max-connections", bad)
        assert done.returncode == 2, done.stderr
        assert "--max-connections" in done.stderr and repr(bad) in done.stderr, done.stderr
        assert "opening" not in done.stderr
    assert "Traceback" not in done.stderr


def test_raising_the_limit_keeps_to_the_ceiling_and_never_lowers_it() -> None:
    """The soft limit goes up to the hard one, not past the ceiling; one above the
    ceiling is kept."""
    from edge_serve.open_files import OpenFileLimit, raise_open_file_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 600:
        pytest.skip(f"this process's hard open-file limit is {hard}")
    shown_hard = None if hard == resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        assert raise_open_file_limit(ceiling=500) == OpenFileLimit(300, 500, shown_hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (500, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (550, hard))
        assert raise_open_file_limit(ceiling=500) == OpenFileLimit(550, 550, shown_hard)
        assert not raise_open_file_limit(ceiling=500).raised
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (550, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_descriptor_count_is_read(tmp_path: Path) -> None:
    """``files_in_use`` counts the process's descriptors (one more for a file opened)."""
    from edge_serve.open_files import files_in_use

    before = files_in_use()
    assert before is not None and before >= 3
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        assert files_in_use() == before + 1
    finally:
        os.close(fd)
