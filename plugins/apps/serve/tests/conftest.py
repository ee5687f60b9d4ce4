"""Fixtures of the edge-serve tests: pipeline files for real ``edge serve`` processes.

Leaks are checked around each server's whole life (:func:`serving.running`): a server
keeps shared-memory segments for reuse while it runs, so a per-test check would flag them.
A failed test whose ``server`` fixture is a running ``edge serve`` carries the end of
that server's log in its report (a stage that failed says why there, and only there).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from generate_server import SharedServer, write_pipelines
from serving import Served

#: How many of the server's last log lines a failed test's report shows.
LOG_TAIL_LINES = 60

BuildOnce = Callable[[str, Callable[[Path], None]], Path]


@pytest.fixture(scope="session")
def ocr_dir(shared_build: BuildOnce) -> Path:
    """The PP-OCRv4 bundles built once per run, plus ``served.toml``: the same pipeline at
    admission 2 with automatic restarts, and ``page.png``: a page of text rendered here
    (shared by the run's xdist workers: the root conftest's ``shared_build``)."""
    return shared_build("serve-ocr", _build_ocr_dir) / "bundles"


def _build_ocr_dir(folder: Path) -> None:
    from edge_ocr_example.bundle import build_bundles
    from edge_ocr_example.make_image import main as render_page
    from edge_ocr_example.models import fetch_wheel

    out = folder / "bundles"
    build_bundles(out, wheel=fetch_wheel())
    text = (out / "pipeline.toml").read_text()
    text = text.replace('name = "ocr"\n', 'name = "ocr"\nadmission = 2\n', 1)
    # A stage whose call overruns a deadline is retired (ort-cpu cannot cancel in place)
    # and restarted through the whole gate.
    text = text.replace("\n[stages.backend]\n", '\nrestart = "on-failure"\n'
                        'restart_backoff_s = 0.2\n\n[stages.backend]\n')
    (out / "served.toml").write_text(text)
    render_page([str(out / "page.png"), "--line", "Served over HTTP today",
                 "--line", "Total 12.75 for 3 pages"])


@pytest.fixture(scope="session")
def generate_server(tmp_path_factory: pytest.TempPathFactory,
                    ocr_dir: Path) -> Iterator[SharedServer]:
    """The server the generate tests share (:mod:`generate_server`): ``ocr``, ``tiny``
    and ``page-chat``, started on first use, stopped and checked at the end."""
    folder = tmp_path_factory.mktemp("generate")
    shared = SharedServer(lambda: write_pipelines(folder, ocr_dir))
    yield shared
    shared.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                         pytest.TestReport]:
    """Add the end of the server's log to the report of a failed test that used one."""
    report = yield
    server = (getattr(item, "funcargs", None) or {}).get("server")
    if report.failed and isinstance(server, Served) and server.stderr:
        report.sections.append((f"edge serve's log (its last {LOG_TAIL_LINES} lines)",
                                 "".join(server.stderr[-LOG_TAIL_LINES:])))
    return report
