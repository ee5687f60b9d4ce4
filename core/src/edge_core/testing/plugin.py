"""The conformance kit as a pytest plugin (registered through edge-core's ``pytest11``).

Inert unless asked for: without ``--edge-backend``, ``--edge-conformance`` or
``--edge-report`` it only adds those options, so unrelated test runs are untouched. When
asked, it adds one test item per backend x check (``conformance[<backend>-<check>]``),
each marked ``edge_conformance``, ``edge_backend(<name>)`` and ``edge_<name>`` (dashes as
underscores, so ``-m edge_ort_cpu`` selects a backend), runs the same check functions as
``edge conformance``, and with ``--edge-report PATH`` writes the same JSON report.

A skipped check is reported as a pytest skip with its reason; it never passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ConformanceItem", "ConformanceSession", "backend_marker"]

_PLUGIN_NAME = "edge-conformance"


def backend_marker(backend: str) -> str:
    """The per-backend marker name: ``edge_`` + the backend name with ``-`` as ``_``."""
    return "edge_" + backend.replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the kit's options (and nothing else)."""
    group = parser.getgroup("edge", "edge-core conformance kit")
    group.addoption("--edge-backend", action="append", default=[], metavar="NAME",
                    help="run the conformance checks on this backend (repeatable)")
    group.addoption("--edge-conformance", action="store_true", default=False,
                    help="run the conformance checks on every installed backend")
    group.addoption("--edge-report", default=None, metavar="PATH",
                    help="write the conformance results as JSON to PATH")


def pytest_configure(config: pytest.Config) -> None:
    """Activate the kit only when one of its options was given."""
    names = list(config.getoption("edge_backend") or [])
    every = bool(config.getoption("edge_conformance"))
    report = config.getoption("edge_report")
    if not (names or every or report):
        return
    config.addinivalue_line("markers", "edge_conformance: a check of the edge conformance kit")
    config.addinivalue_line("markers", "edge_backend(name): the backend a check runs on")
    config.pluginmanager.register(ConformanceSession(config, names, report), _PLUGIN_NAME)


class ConformanceFailure(Exception):
    """A check found the backend non-conforming (the message is the check's reason)."""


class ConformanceItem(pytest.Item):
    """One check on one backend."""

    def __init__(self, *, backend: str, check: str, kit: ConformanceSession,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backend = backend
        self.check = check
        self.kit = kit
        #: The next item to run is a check of this backend that shares the pipeline
        #: (set once the selection is final): this one may leave it open for it.
        self.keep_open = False

    def runtest(self) -> None:
        """Run the check; a skip or a failure carries the check's reason."""
        from edge_core.testing.results import Status
        from edge_core.testing.runner import run_check

        result = run_check(self.kit.subject(self.backend), self.check,
                           keep_open=self.keep_open)
        self.kit.results.setdefault(self.backend, []).append(result)
        if result.status is Status.SKIPPED:
            pytest.skip(result.detail)
        if result.status is Status.FAILED:
            raise ConformanceFailure(result.detail)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        """The check's reason, without a traceback into the kit."""
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.backend}: {self.check}: {excinfo.value}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the item comes from, for pytest's reports."""
        return self.path, None, f"edge conformance {self.backend} --check {self.check}"


class ConformanceSession:
    """The kit's state for one pytest session: plugins, prepared backends, results."""

    def __init__(self, config: pytest.Config, names: list[str], report: str | None) -> None:
        self.config = config
        self.names = names
        self.report = report
        self.plugins: Any = None
        self.subjects: dict[str, Any] = {}
        self.results: dict[str, list[Any]] = {}

    def subject(self, backend: str) -> Any:
        """The backend prepared once per session (probe, conformance stage)."""
        from edge_core.testing.subject import prepare

        if backend not in self.subjects:
            self.subjects[backend] = prepare(self.plugins, backend)
        return self.subjects[backend]

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Add backend x check items before marker and keyword selection runs."""
        from edge_core.plugins import load_plugins
        from edge_core.testing.checks import CHECKS
        from edge_core.testing.runner import installed_backends

        self.plugins = load_plugins()
        installed = installed_backends(self.plugins)
        unknown = [name for name in self.names if name not in installed]
        if unknown:
            raise pytest.UsageError(f"--edge-backend: no installed plugin provides it "
                                    f"(installed: {installed}): {unknown}")
        for backend in dict.fromkeys(self.names or installed):
            config.addinivalue_line("markers", f"{backend_marker(backend)}: checks of the "
                                    f"{backend} backend")
            for check in CHECKS:
                item = ConformanceItem.from_parent(
                    session, name=f"conformance[{backend}-{check}]", backend=backend,
                    check=check, kit=self)
                item.add_marker("edge_conformance")
                item.add_marker(pytest.mark.edge_backend(backend))
                item.add_marker(backend_marker(backend))
                items.append(item)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Once the items to run are known: which may leave a shared pipeline open."""
        from edge_core.testing.checks import SHARED_CHECKS

        items = list(session.items)
        for index, item in enumerate(items):
            after = items[index + 1] if index + 1 < len(items) else None
            if isinstance(item, ConformanceItem):
                item.keep_open = (isinstance(after, ConformanceItem) and after.kit is self
                                  and after.backend == item.backend
                                  and after.check in SHARED_CHECKS)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Close shared pipelines, remove the stages' folders; write the report when asked."""
        from edge_core.testing.results import BackendReport, report_document

        for subject in self.subjects.values():
            subject.cleanup()
        if not self.report:
            return
        reports = [BackendReport(backend=name, plugin=subject.plugin,
                                 available=subject.unavailable is None,
                                 reason=subject.unavailable,
                                 results=tuple(self.results.get(name, ())))
                   for name, subject in self.subjects.items()]
        Path(self.report).write_text(json.dumps(report_document(reports), indent=2) + "\n",
                                     encoding="utf-8")
