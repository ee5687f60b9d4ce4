"""Fixtures the whole test suite shares, and the test backends' switch.

The test backends (``echo``, ``echo-preemptible``) register in the ``edge.testing``
entry-point group, which edge-core loads only under ``EDGE_TEST_BACKENDS=1`` (or when
``EDGE_PLUGINS`` names them): it is set here, before any test runs, so in-process plugin
loading and every ``edge`` subprocess a test starts see them, while a user's ``edge
plugins`` in the same virtual environment does not.

``demo_build`` is what ``make demo`` builds, built once per test session: the README's
and the how-tos' commands run against it (tests/docs), and the OCR example's tests read
its bundles (tests/examples).

Stored placement decisions (docs/config.md) go to a temporary directory of the session,
never to the user's cache (``EDGE_PLACEMENT_CACHE``, set for the whole session): a test
that opens a pipeline with candidates measures, stores and reuses decisions there, and
tests of the store point it at their own directories. Stored load gates
(``EDGE_GATE_CACHE``) go to a directory of each test's own, so that no test's gate is
reused by another's open (a test of gate reuse opens twice within itself); cached probe
answers (``EDGE_PROBE_CACHE``) to one of the session.

Parallel runs (pytest-xdist; ``make test`` runs ``-n 2`` or more with ``--dist
loadgroup``): a module whose tests share a module-scoped fixture is one xdist group, so
one worker runs it whole and builds the fixture once; modules whose tests share a session
fixture that holds a live process (:data:`PROCESS_GROUPS`) go to one worker together;
other tests go to whichever worker is free. Session fixtures that build files
(``demo_build``, the wheels, the bundles, the tiny model) build them through
:func:`build_once`: one worker builds under a file lock into a folder of the run's shared
temporary directory, the others wait for it and reuse it.

Compiled bytecode is written during the run (``PYTHONDONTWRITEBYTECODE`` is unset here
and ``sys.dont_write_bytecode`` cleared, whatever the caller's shell set): the suite starts
hundreds of interpreters (``edge`` commands, stage workers, the vLLM environment's engines,
fresh virtual environments installed without byte-compiling), and with the variable set
and nothing compiled each one compiled every module it imported from source again — a
vLLM engine's start took about twice as long.

``EDGE_TEST_CPU=FILE`` appends one JSON line per test module to ``FILE`` at the end of
the run (per xdist worker): the CPU seconds (user and system, this process and its
reaped children) its tests, their fixtures' setup and teardown took, and its wall time.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["EDGE_TEST_BACKENDS"] = "1"
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

#: The demo's derived classifier bucket (the Makefile's ``edge derive qnn-static``).
DEMO_BUCKET = "4x3x48x192"


#: Session fixtures that hold a live process (a server): the modules whose tests use one
#: form one xdist group, so that a parallel run starts the process once, not per worker.
PROCESS_GROUPS = {"generate_server": "generate-server"}

BuildOnce = Callable[[str, Callable[[Path], None]], Path]


def _shared_root(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    """The run's folder that every xdist worker sees (the session's own without xdist)."""
    base = factory.getbasetemp()
    # An xdist worker's base temp is a popen-gwN folder inside the controller's, which is
    # unique to the run (pytest-N); the shared folder sits beside the workers' folders.
    root = (base.parent if hasattr(config, "workerinput") else base) / "shared"
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_once(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """``root/name`` built by ``build(folder)`` once per run, whichever worker asks first.

    The first caller holds ``root/name.lock`` (``fcntl.flock``) while it builds; callers
    on other workers wait on the lock, then find the finished marker and reuse the
    folder. A failed build leaves no marker: the next caller builds again (and fails the
    same way, with its own traceback).
    """
    folder = root / name
    done = root / f"{name}.done"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


@pytest.fixture(scope="session")
def shared_build(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> BuildOnce:
    """:func:`build_once` in the run's shared folder: ``shared_build(name, build)``."""
    root = _shared_root(request.config, tmp_path_factory)
    return lambda name, build: build_once(root, name, build)


def _binds_its_module(item: pytest.Item) -> bool:
    """Whether the test uses a fixture shared within its module.

    That is a fixture of module, class or package scope, or a session fixture its own
    module defines: a parallel run keeps such a module's tests on one worker, so the
    fixture is built once.
    """
    # pytest has no public way to a test's fixture definitions; fixturenames is public.
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::", 1)[0]
    for definitions in getattr(info, "name2fixturedefs", {}).values():
        for definition in definitions:
            if definition.scope in {"module", "class", "package"} or (
                    definition.scope == "session" and definition.baseid == module):
                return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for a parallel run (pytest-xdist, ``--dist loadgroup``).

    A module whose tests share a module-scoped fixture is one group (one worker runs it
    whole, building the fixture once); the modules whose tests use a session fixture
    holding a live process (:data:`PROCESS_GROUPS`) are one group together; an
    ``xdist_group`` mark names a group of its own; any other test goes to whichever
    worker is free. On an xdist worker the work holding a ``slow`` test comes first
    (otherwise in the collected order), so the longest work starts first and the fast
    tests fill in around it; each worker writes the groups to the file the controller
    named (:class:`GroupScheduling` reads it).
    """
    groups: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for fixture, group in PROCESS_GROUPS.items():
            if fixture in getattr(item, "fixturenames", ()):
                groups[module] = group
        if module not in groups and _binds_its_module(item):
            groups[module] = module
    unit: dict[str, str] = {}  # nodeid -> its unit of work (group name, or itself)
    slow: set[str] = set()
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        module = item.nodeid.split("::", 1)[0]
        if mark is not None:
            name = "@" + str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        else:
            name = "@" + groups[module] if module in groups else item.nodeid
        unit[item.nodeid] = name
        if item.get_closest_marker("slow") is not None:
            slow.add(name)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        items.sort(key=lambda item: unit[item.nodeid] not in slow)
        target = Path(workerinput.get(GROUPS_KEY, ""))
        if target.name:  # written whole, then renamed: the controller reads one or other
            partial = target.with_name(f"{target.name}.{workerinput['workerid']}")
            partial.write_text(json.dumps(unit), encoding="utf-8")
            partial.replace(target)


#: The worker input naming the file the workers write the groups to.
GROUPS_KEY = "edge_test_groups"
_GROUPS_DIR = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Name the groups file (in a folder of this run's controller) to every xdist worker."""
    if _GROUPS_DIR not in node.config.stash:
        node.config.stash[_GROUPS_DIR] = tempfile.mkdtemp(prefix="edge-groups-")
    folder = node.config.stash[_GROUPS_DIR]
    node.workerinput[GROUPS_KEY] = str(Path(folder) / "groups.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the controller's groups folder."""
    folder = config.stash.get(_GROUPS_DIR, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` as :class:`GroupScheduling`; other modes as xdist has them.

    pytest-xdist's own loadgroup scheduling reads each group from a suffix it writes
    into the test's node id, which pytest 9 no longer lets a plugin change.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling over this conftest's groups, in collected order.

        A unit of work is a group (all its tests to one worker) or a single test; units
        go out in the order the workers collected them (slow work first), not xdist's
        largest-first, and a worker gets its next unit when it has two tests left.
        """

        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                self.units = json.loads(Path(
                    config.stash[_GROUPS_DIR], "groups.json").read_text(encoding="utf-8"))
            return self.units.get(nodeid, nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


_CPU: dict[str, list[float]] = {}


def _cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Add each test's CPU and wall seconds (setup, call, teardown) to its module's."""
    if not os.environ.get("EDGE_TEST_CPU"):
        yield
        return
    cpu, wall = _cpu_now(), time.perf_counter()
    yield
    row = _CPU.setdefault(item.nodeid.split("::", 1)[0], [0.0, 0.0, 0])
    row[0] += _cpu_now() - cpu
    row[1] += time.perf_counter() - wall
    row[2] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Append the per-module CPU lines to ``$EDGE_TEST_CPU`` (one write per process)."""
    target = os.environ.get("EDGE_TEST_CPU")
    if not target or not _CPU:
        return
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    lines = "".join(
        json.dumps({"module": module, "worker": worker, "cpu_s": round(cpu, 2),
                    "wall_s": round(wall, 2), "tests": int(count)}) + "\n"
        for module, (cpu, wall, count) in sorted(_CPU.items()))
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(lines)


@pytest.fixture(scope="session")
def demo_build(shared_build: BuildOnce) -> Path:
    """A folder holding ``build/ocr`` as ``make demo`` leaves it, built once per session.

    The page pipeline's bundles, ``pipeline.toml``, ``pipeline-auto.toml`` and the demo
    page (``python -m edge_ocr_example.page_bundle``), and the classifier's static copy
    that ``pipeline-auto.toml`` offers to QNN (``edge derive qnn-static``): the same
    steps as the Makefile's, minus its timed runs. Tests read it; none may change it.
    """
    from edge_ocr_example.models import fetch_wheel
    from edge_ocr_example.page_bundle import build_page_bundles

    def build(root: Path) -> None:
        ocr = root / "build" / "ocr"
        build_page_bundles(ocr, wheel=fetch_wheel())
        edge = Path(sys.executable).with_name("edge")
        derive = subprocess.run(
            [str(edge), "derive", "qnn-static", str(ocr / "classify"), "--bucket",
             DEMO_BUCKET, "--out", str(ocr / "classify-qnn"), "--quiet"],
            capture_output=True, text=True, timeout=600, check=False)
        assert derive.returncode == 0, derive.stderr

    return shared_build("demo", build)


@pytest.fixture(autouse=True, scope="session")
def _placement_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGE_PLACEMENT_CACHE", str(tmp_path_factory.mktemp("placement-cache")))
        patch.setenv("EDGE_PROBE_CACHE", str(tmp_path_factory.mktemp("probe-cache")))
        yield


@pytest.fixture(autouse=True)
def _gate_cache(tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_GATE_CACHE", str(tmp_path_factory.mktemp("gates")))


@pytest.fixture
def sigint() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in the main thread, as in a command."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
