"""What the transport benchmark measures the edge echo against: echo children without edge.

Each anchor is a child interpreter that sends back what it gets: a bare socketpair echo
(blocking or with both ends polling), a loopback TCP echo, the ``multiprocessing.Pipe``
echo a Python user would pick instead, and the least pure-Python framing of the edge
wire (JSON or fixed binary header). Used by ``transport.py`` and ``ort_call.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import select
import socket
import struct
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

ECHO_CHILD = r"""
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
buf = bytearray(65536)
while True:
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""

TCP_CHILD = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(65536)
while True:
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""


def _ping_pong(sock: socket.socket, n: int, size: int = 64) -> list[float]:
    message = b"x" * size
    buf = bytearray(size)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(message)
        got = 0
        while got < size:
            got += sock.recv_into(memoryview(buf)[got:])
        samples.append(time.perf_counter() - t0)
    return samples


SPIN_CHILD = r"""
import select, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
poll = select.poll()
poll.register(s, select.POLLIN)
buf = bytearray(65536)
while True:
    while not poll.poll(0):
        pass
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""


# The least any Python implementation of this wire can do per round trip: a JSON header
# of the same shape as the edge echo's (request ids, epoch, generation, meta, one tensor
# entry), framed with the same 16-byte prefix, decoded with json.loads and np.frombuffer;
# no validation, no request bookkeeping, no threads, both ends polling. Not a transport
# anyone should ship: a measure of what the goal asks of pure Python on this host.
FLOOR_CHILD = r"""
import json, select, socket, struct, sys, time
import numpy as np
prefix = struct.Struct("<4sIQ")
packed = struct.Struct("<16s16sQQI")  # request id, stage id, epoch, generation, count
s = socket.socket(fileno=int(sys.argv[1]))
poll = select.poll()
poll.register(s, select.POLLIN)
buf = bytearray(65536)
view = memoryview(buf)
while True:
    # Polls for up to 200 us (the edge transport's default spin), then sleeps: idle
    # between measured blocks, it leaves the cores to the others.
    spin_until = time.perf_counter() + 200e-6
    while not poll.poll(0):
        if time.perf_counter() > spin_until:
            poll.poll()
            break
    n = s.recv_into(buf)
    if not n:
        break
    _, hlen, plen = prefix.unpack_from(buf)
    if sys.argv[2] == "struct":
        rid, sid, epoch, gen, count = packed.unpack_from(buf, 16)
        x = np.frombuffer(buf, dtype=np.float32, count=count, offset=16 + packed.size)
        reply = packed.pack(rid, sid, epoch, gen, count) + struct.pack("<Q", time.monotonic_ns())
        s.sendmsg([prefix.pack(b"EDGW", len(reply), x.nbytes) + reply, x.data])
        continue
    header = json.loads(bytes(view[16 : 16 + hlen]))
    spec = header["tensors"][0]
    x = np.frombuffer(buf, dtype=spec["dtype"], count=spec["shape"][0], offset=16 + hlen)
    meta = {"seq": 0, "kind": "done", "data": {}, "error": None,
            "created_ns": time.monotonic_ns(), "acks": []}
    reply = json.dumps({"version": 1, "required_features": [], "op": "event",
                        "request_id": header["request_id"], "stage_id": header["stage_id"],
                        "epoch": header["epoch"], "generation": header["generation"],
                        "meta": meta, "tensors": header["tensors"]},
                       separators=(",", ":")).encode()
    s.sendmsg([prefix.pack(b"EDGW", len(reply), x.nbytes) + reply, x.data])
"""


class FloorEcho:
    """The minimal pure-Python framing above (see FLOOR_CHILD), kept for interleaving.

    ``header_kind="struct"`` replaces the JSON header with fixed binary fields, the
    cheapest header Python can decode: what is left is the interpreter itself.
    """

    def __init__(self, header_kind: str = "json") -> None:
        self._kind = header_kind
        self._parent, child = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", FLOOR_CHILD, str(child.fileno()), header_kind],
            pass_fds=(child.fileno(),),
        )
        child.close()
        self._poll = select.poll()
        self._poll.register(self._parent, select.POLLIN)
        self._index = 0
        self.pid = self._proc.pid
        self.rtt(200)

    def rtt(self, n: int) -> list[float]:
        """``n`` round trips of one float32[4] (after 20 unrecorded ones)."""
        return self._rtt(n + 20)[20:]

    def _rtt(self, n: int) -> list[float]:
        parent, poll = self._parent, self._poll
        prefix = struct.Struct("<4sIQ")
        packed = struct.Struct("<16s16sQQI")
        buf = bytearray(65536)
        view = memoryview(buf)
        x = np.arange(4, dtype=np.float32)
        samples = []
        for _ in range(n):
            self._index += 1
            index = self._index
            t0 = time.perf_counter()
            if self._kind == "struct":
                rid = f"r{index}".encode()
                header = packed.pack(rid, b"bench", 0, 1, 4)
                parent.sendmsg([prefix.pack(b"EDGW", len(header), x.nbytes) + header, x.data])
                while not poll.poll(0):
                    pass
                parent.recv_into(buf)
                _, hlen, _ = prefix.unpack_from(buf)
                got, _, _, _, count = packed.unpack_from(buf, 16)
                y = np.frombuffer(buf, dtype=np.float32, count=count, offset=16 + hlen).copy()
                assert got.rstrip(b"\0") == rid and y[3] == 3.0
                samples.append(time.perf_counter() - t0)
                continue
            header = json.dumps(
                {"version": 1, "required_features": [], "op": "run",
                 "request_id": f"r{index}", "stage_id": "bench", "epoch": 0, "generation": 1,
                 "meta": {}, "tensors": [{"name": "x", "dtype": "float32", "shape": [4],
                                          "nbytes": 16, "ref": None}]},
                separators=(",", ":"),
            ).encode()
            parent.sendmsg([prefix.pack(b"EDGW", len(header), x.nbytes) + header, x.data])
            while not poll.poll(0):
                pass
            parent.recv_into(buf)
            _, hlen, _ = prefix.unpack_from(buf)
            reply = json.loads(bytes(view[16 : 16 + hlen]))
            y = np.frombuffer(buf, dtype=np.float32, count=4, offset=16 + hlen).copy()
            assert reply["request_id"] == f"r{index}" and y[3] == 3.0
            samples.append(time.perf_counter() - t0)
        return samples

    def close(self) -> None:
        """End the child."""
        self._parent.close()
        self._proc.wait()


def python_floor_rtt(n: int, header_kind: str = "json") -> list[float]:
    """``n`` round trips of a fresh :class:`FloorEcho` (``json`` or ``struct`` header)."""
    echo = FloorEcho(header_kind)
    try:
        return echo.rtt(n)
    finally:
        echo.close()


# What a Python user would pick instead of edge-core: one end of a multiprocessing.Pipe()
# (a socketpair, pickled messages) in another interpreter that sends back what it gets.
PIPE_CHILD = r"""
import sys
from multiprocessing.connection import Connection
import numpy  # unpickling the arrays needs it; imported before the first message
conn = Connection(int(sys.argv[1]))
while True:
    try:
        message = conn.recv()
    except EOFError:
        break
    conn.send(message)
"""


class PipeEcho:
    """A ``multiprocessing.Pipe`` echo in a child interpreter (numpy arrays, pickled)."""

    def __init__(self) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PIPE_CHILD, str(child.fileno())], pass_fds=(child.fileno(),)
        )
        child.close()
        self.pid = self._proc.pid
        self.rtt(200, {"x": np.arange(4, dtype=np.float32)})

    def rtt(self, n: int, inputs: dict[str, np.ndarray]) -> list[float]:
        """``n`` round trips of ``inputs`` (a dict of arrays, as the edge echo sends)."""
        conn: Connection = self._conn
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.send(inputs)
            back = conn.recv()
            samples.append(time.perf_counter() - t0)
        assert back.keys() == inputs.keys()
        return samples

    def close(self) -> None:
        """End the child."""
        self._conn.close()
        self._proc.wait()


class BareEcho:
    """A blocking echo child on a bare socketpair, kept for interleaved measurements."""

    def __init__(self) -> None:
        self._parent, child = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", ECHO_CHILD, str(child.fileno())], pass_fds=(child.fileno(),)
        )
        child.close()
        _ping_pong(self._parent, 200)

    def rtt(self, n: int) -> list[float]:
        """``n`` round trips of 64 bytes (after 20 unrecorded ones)."""
        _ping_pong(self._parent, 20)
        return _ping_pong(self._parent, n)

    def close(self) -> None:
        """End the child."""
        self._parent.close()
        self._proc.wait()


def bare_socketpair_rtt(n: int) -> list[float]:
    """Round trips through a bare socketpair to a blocking echo child."""
    echo = BareEcho()
    try:
        return echo.rtt(n)
    finally:
        echo.close()


def bare_spinning_rtt(n: int) -> list[float]:
    """The same with both ends polling without sleeping: the floor without wake-ups."""
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", SPIN_CHILD, str(child.fileno())], pass_fds=(child.fileno(),)
    )
    child.close()
    poll = select.poll()
    poll.register(parent, select.POLLIN)
    message = b"x" * 64
    buf = bytearray(64)
    samples = []
    try:
        for index in range(n + 200):
            t0 = time.perf_counter()
            parent.sendall(message)
            got = 0
            while got < 64:
                while not poll.poll(0):
                    pass
                got += parent.recv_into(memoryview(buf)[got:])
            if index >= 200:
                samples.append(time.perf_counter() - t0)
        return samples
    finally:
        parent.close()
        proc.wait()


def bare_tcp_rtt(n: int) -> list[float]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", TCP_CHILD, str(port)])
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        _ping_pong(conn, 200)
        return _ping_pong(conn, n)
    finally:
        conn.close()
        proc.wait()
