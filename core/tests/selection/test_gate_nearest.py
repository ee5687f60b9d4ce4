"""The nearest stored gate: compared on every start without a gate of its own, read once.

A start whose key has no stored gate names the parts that differ from the nearest one of
the same stage and backend (``GateStore.nearest_changes``), which compares the key with
every stored gate. A file read before is not read again while it is the same file (its
inode, mtime, ctime and size); a saved gate (a new file) or one rewritten is read again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from edge_core.identity import identity_digest
from edge_core.selection.gates import GateStore
from edge_core.selection.key import GATE_KEY_PARTS, DecisionKey

_OPENED: list[str] = []
_LISTENING: list[bool] = []
_HOOKED: list[bool] = []  # an audit hook stays for the process: added once


def _record_opens(event: str, args: tuple[Any, ...]) -> None:
    if _LISTENING and event == "open" and isinstance(args[0], str | Path):
        _OPENED.append(os.fspath(args[0]))


def _opened_during(action: Any) -> tuple[Any, list[str]]:
    if not _HOOKED:
        sys.addaudithook(_record_opens)
        _HOOKED.append(True)
    _OPENED.clear()
    _LISTENING.append(True)
    try:
        result = action()
    finally:
        _LISTENING.clear()
    return result, list(_OPENED)


def _key(**changed: str) -> DecisionKey:
    parts = {name: changed.get(name, f"{name}-0") for name in GATE_KEY_PARTS}
    return DecisionKey(digest=identity_digest(parts), parts=parts, runtime={})


POINTS = [{"entry": "e", "point": "min"}]


def test_the_stored_gates_are_read_once_and_again_only_when_they_change(tmp_path: Path):
    store = GateStore(tmp_path / "gates")
    store.save(_key(), "p/s", "ort-cpu", POINTS)
    store.save(_key(runtime="other"), "p/other-stage", "ort-cpu", POINTS)
    wanted = _key(bundles="new")
    first, read = _opened_during(lambda: store.nearest_changes(wanted, "p/s", "ort-cpu"))
    assert first == ("bundles",)
    stored = sorted(str(path) for path in store.directory.glob("*.json"))
    assert sorted(set(read) & set(stored)) == stored  # each read once, the first time

    again, read = _opened_during(lambda: store.nearest_changes(wanted, "p/s", "ort-cpu"))
    assert again == ("bundles",)
    assert not set(read) & set(stored), read  # the same files: not read again

    # a nearer gate saved since (a new file) is read, and is the nearest now
    store.save(_key(bundles="new", environment="e1"), "p/s", "ort-cpu", POINTS)
    newer, read = _opened_during(lambda: store.nearest_changes(wanted, "p/s", "ort-cpu"))
    assert newer == ("environment",)
    assert [path for path in read if path.endswith(".json")] == [
        str(store.path(_key(bundles="new", environment="e1")))]

    # a file that changed in place (another size) is read again
    path = store.path(_key(bundles="new", environment="e1"))
    path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")
    changed, read = _opened_during(lambda: store.nearest_changes(wanted, "p/s", "ort-cpu"))
    assert str(path) in read
    assert changed == ("environment",)  # a trailing space: the same document, still nearest

    # rewritten in place at the same size with its mtime put back (cp -p, rsync -t): its
    # ctime moved, so it is read again
    text = path.read_text(encoding="utf-8")
    status = os.stat(path)
    with open(path, "r+", encoding="utf-8") as handle:
        handle.write(text.replace(" ", "\n", 1) if " " in text else text)
        handle.truncate()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert (os.stat(path).st_mtime_ns, os.stat(path).st_size) == (status.st_mtime_ns,
                                                                  status.st_size)
    _, read = _opened_during(lambda: store.nearest_changes(wanted, "p/s", "ort-cpu"))
    assert str(path) in read

    # a removed file is no longer compared with
    path.unlink()
    gone, _ = _opened_during(lambda: store.nearest_changes(wanted, "p/s", "ort-cpu"))
    assert gone == ("bundles",)
