"""A lock is taken with ``with``, never by ``acquire()`` and a ``try`` that releases it.

On CPython a signal waiting to be handled (Ctrl-C, the command line's ``SIGTERM``) is
acted on as a call returns to Python code, so right after ``lock.acquire()`` returns,
before the ``try`` that would release the lock: the ``KeyboardInterrupt`` comes out with
the lock held, and the next thread that takes it (a ``close``, a reader, the same thread
unwinding) waits for good. ``with lock:`` takes the lock and sets up its release with no
such point between them. (The acquire form was once used at 14 per-call sites for its
speed; a review found that 6 of 400 random Ctrl-Cs in a loop of tiny calls left one of
those locks held, and a ``Pipeline.close()`` that then hung.)
"""

from __future__ import annotations

import ast
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "contracts" / "src", ROOT / "core" / "src", *sorted(
    (ROOT / "plugins").glob("*/*/src")), ROOT / "tests" / "edge_echo" / "src",
    *sorted((ROOT / "examples").glob("*/src"))]


def _acquire_then_try(tree: ast.AST) -> Iterator[ast.stmt]:
    """Each ``X.acquire()`` statement followed by a ``try`` whose ``finally`` releases X."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for first, second in itertools.pairwise(block):
                if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                        and isinstance(first.value.func, ast.Attribute)
                        and first.value.func.attr == "acquire"
                        and not first.value.args and not first.value.keywords
                        and isinstance(second, ast.Try)):
                    continue
                target = ast.dump(first.value.func.value)
                releases = [call for stmt in second.finalbody for call in ast.walk(stmt)
                            if isinstance(call, ast.Call)
                            and isinstance(call.func, ast.Attribute)
                            and call.func.attr == "release"
                            and ast.dump(call.func.value) == target]
                if releases:
                    yield first


def _sites(text: str) -> list[int]:
    return [stmt.lineno for stmt in _acquire_then_try(ast.parse(text))]


def test_no_source_takes_a_lock_with_acquire_and_a_try() -> None:
    found = []
    for root in SOURCES:
        assert root.is_dir(), root
        for path in sorted(root.rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}"
                      for line in _sites(path.read_text(encoding="utf-8"))]
    assert found == [], "take these locks with `with`: " + ", ".join(found)


def test_the_check_finds_the_form_it_refuses() -> None:
    # What the walk must find, and what it must leave: `with`, a released other lock, a
    # non-blocking try (a semaphore-like acquire with arguments).
    refused = (
        "def f(self):\n"
        "    self._lock.acquire()\n"
        "    try:\n"
        "        pass\n"
        "    finally:\n"
        "        self._lock.release()\n")
    assert _sites(refused) == [2]
    assert _sites("def f(self):\n    with self._lock:\n        pass\n") == []
    assert _sites(refused.replace("self._lock.release()", "self._other.release()")) == []
    assert _sites(refused.replace("acquire()", "acquire(None)")) == []


def _contended(lock: threading.Lock, take: Callable[[threading.Lock], None]) -> bool:
    """Take ``lock`` the way ``take`` does while another thread holds it and, just
    before it lets go, has a SIGINT delivered; True when the lock is left held."""
    ready = threading.Event()

    def holder() -> None:
        lock.acquire()  # (the form under test is the main thread's)
        ready.set()
        time.sleep(0.3)  # the main thread waits for the lock by now
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # handled in the main
        time.sleep(0.05)                                           # thread, once it runs
        lock.release()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    ready.wait()
    try:
        with pytest.raises(KeyboardInterrupt):
            take(lock)
    finally:
        thread.join()
    return lock.locked()


def test_ctrl_c_as_the_lock_is_taken_leaves_it_held_only_in_the_acquire_form(
        sigint: None) -> None:
    # Why the rule: the CPython behaviour it guards against, shown on a plain lock.
    assert threading.current_thread() is threading.main_thread()

    def with_form(lock: threading.Lock) -> None:
        with lock:
            pass

    def acquire_form(lock: threading.Lock) -> None:
        lock.acquire()
        try:
            pass
        finally:
            lock.release()

    assert not _contended(threading.Lock(), with_form)
    left = threading.Lock()
    assert _contended(left, acquire_form)  # held, by nobody
    left.release()
