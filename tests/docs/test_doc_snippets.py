"""The docs' commands run: what a reader copies is what the suite runs.

Three kinds of page:

* **Walk-through pages** — the README, docs/getting-started.md, every how-to in
  docs/howto/ and docs/evidence.md — have each shell (``sh``, ``bash``) and ``python``
  block run, in order, in a fresh working directory where ``build/`` is ``make demo``'s
  build (the session's ``demo_build`` fixture, built once) and ``.venv`` is this
  environment, with the environment a user has (no test backends, no ``EDGE_PLUGINS``).
  A block is in one of three classes, marked by an HTML comment on the line before its
  fence:

  - run (the default, no marker);
  - ``<!-- doc-test: syntax-only (REASON) -->``: only parsed (``bash -n``, ``compile``),
    for what cannot run here, each with its reason (a GPU, Windows, the network, an
    unpublished package); at most a tenth of the blocks;
  - ``<!-- doc-test: exclude (REASON) -->``: not run, for the test entry points
    themselves (``make demo``, ``make test``).

  Other markers: ``<!-- doc-test: write PATH -->`` writes the block (a TOML file, say) to
  PATH in the working directory before the next block runs, ``<!-- doc-test: append
  PATH -->`` adds it to the end of PATH (fragments of one module); ``<!-- doc-test: expect
  TEXT -->`` requires TEXT in the block's standard output. A shell block runs under
  ``bash -e -o pipefail`` in its own process group, which is ended after the block (a
  server it started in the background goes with it); a Python block runs as a script of
  its own.
* **Reference pages** (docs/*.md) have their ```` ```python run ```` blocks executed, in
  order, in one fresh interpreter per page (later blocks build on earlier ones).
* **The backend guide** (docs/authoring.md) builds a distribution: its ``write``/``append``
  blocks are its files (the pyproject.toml, the plugin module's fragments), the parts it
  tells the reader to copy from ``examples/third_party_backend`` (the worker, the options
  class, the lifecycle hooks of its §5 table) are copied from there renamed, the result
  is built and installed by pip (into a folder on ``PYTHONPATH``, not this environment),
  and then its shell blocks run in the distribution's folder, in order: ``edge plugins``
  lists it and the conformance kit passes, from the command line and from pytest.

``test_block_counts`` prints how many blocks of each class there are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python run[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

#: Pages whose shell and Python blocks are run (see the module docstring).
WALKTHROUGHS = [ROOT / "README.md", DOCS / "getting-started.md",
                *sorted((DOCS / "howto").glob("*.md")), DOCS / "evidence.md"]
SHELL = {"sh", "bash", "shell"}
RUNNABLE = SHELL | {"python"}
BLOCK = re.compile(
    r"((?:^<!-- doc-test: [^\n]*-->[ \t]*\n)*)^```([A-Za-z]*)[^\n]*\n(.*?)^```[ \t]*$",
    re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- doc-test: (exclude|syntax-only|expect|write|append) ?(.*?) ?-->")
REASON = re.compile(r"^\((.+)\)$")
BLOCK_TIMEOUT_S = 900

#: Link targets written on another branch (issue 27, layering): checked once they exist.
PENDING_TARGETS = {ROOT / "CONTRIBUTING.md", DOCS / "architecture.md"}

#: Names that the tested snippets must show, one group per docs gap of issue 21.
COVERED = {
    "warm-up report built by the plugin": ["WarmupReport", "PlacementReport",
                                           "ProviderShare", '"passed"', '"reference"'],
    "WorkerStage.start with manifest, and cleanup": ["WorkerStage.start", "manifest=",
                                                     "bundle.cleanup()"],
    "manifest_dir may be None": ["manifest_dir is None"],
    "a graph for a non-ONNX bundle": ['graph="weights.bin"'],
    "normalised error": ["normalised_error"],
    "prepare and finish": ["prepare", "finish"],
    "the kit's API": ["run_backend", "CHECKS", "Status", "leaks."],
    "preemptible submit hands work to a thread": ["threading.Thread", "def submit"],
    "sizing a reservation": ["observed_memory", "edge_reserve"],
    "a pipeline in Python and the per-stage API": [
        "load_plugins", "ResourceLedger", "Pipeline.open", "pipeline.stage(", ".submit(",
        ".ack(", ".cancel()", ".restart()", ".epoch", ".outstanding"],
}


@dataclass
class Block:
    """One fenced block of a walk-through page and what its markers say."""

    page: Path
    line: int
    lang: str
    text: str
    kind: str = "run"  # run, syntax-only, excluded, file, shown (not a command)
    reason: str = ""
    expects: list[str] = field(default_factory=list)
    path: str = ""
    append: bool = False

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def walkthrough_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its class (``shown`` for data, output, TOML)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        markers, lang, body = match.group(1), match.group(2).lower(), match.group(3)
        line = text.count("\n", 0, match.start(2)) + 1
        block = Block(page, line, lang, body,
                      kind="run" if lang in RUNNABLE else "shown")
        for kind, argument in MARKER.findall(markers):
            if kind == "expect":
                block.expects.append(argument)
            elif kind in {"write", "append"}:
                block.kind, block.path, block.append = "file", argument, kind == "append"
            else:
                reason = REASON.match(argument)
                block.kind = "excluded" if kind == "exclude" else "syntax-only"
                block.reason = reason.group(1) if reason else ""
        if markers.count("<!--") != len(MARKER.findall(markers)):
            block.kind, block.reason = "bad-marker", markers.strip()
        found.append(block)
    return found


def blocks(page: Path) -> list[str]:
    """The ``python run`` blocks of a reference page, in order."""
    return FENCE.findall(page.read_text(encoding="utf-8"))


PAGES = sorted(p for p in DOCS.glob("*.md") if blocks(p))
COUNTED = ("run", "syntax-only", "excluded")


def _user_env(venv_bin: Path) -> dict[str, str]:
    hidden = {"EDGE_PLUGINS", "EDGE_TEST_BACKENDS", "PYTHONPATH", "EDGE_DEBUG",
              "EDGE_WORKER_LOG_DIR", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    return env


def _write(block: Block, work: Path) -> None:
    target = work / block.path
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a" if block.append else "w", encoding="utf-8") as file:
        file.write(block.text + ("\n\n" if block.append else ""))


def _run(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if block.lang in SHELL:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    else:
        argv = [sys.executable, "-c", block.text]
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(
            f"{block.where}: no end within {BLOCK_TIMEOUT_S} s\n{err[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # what the block left running
            os.killpg(process.pid, signal.SIGTERM)
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def test_the_runner_finds_blocks_and_only_marked_ones(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nnot run\n```\n\n```python run\nx = 1\n```\n")
    assert blocks(page) == ["x = 1\n"]
    assert PAGES, "no docs page has a ```python run block"
    walk = tmp_path / "walk.md"
    walk.write_text("```sh\nls\n```\n\n<!-- doc-test: syntax-only (needs a GPU) -->\n"
                    "```python\nimport cuda\n```\n\n<!-- doc-test: expect hello -->\n"
                    "```sh\necho hello\n```\n\n```text\noutput\n```\n\n"
                    "<!-- doc-test: write p.toml -->\n```toml\nname = 1\n```\n"
                    "<!-- doc-test: append m.py -->\n```python\nx = 1\n```\n")
    found = [(b.kind, b.reason, b.expects, b.path, b.append)
             for b in walkthrough_blocks(walk)]
    assert found == [("run", "", [], "", False), ("syntax-only", "needs a GPU", [], "", False),
                     ("run", "", ["hello"], "", False), ("shown", "", [], "", False),
                     ("file", "", [], "p.toml", False), ("file", "", [], "m.py", True)]


def test_block_counts(request: pytest.FixtureRequest) -> None:
    every = [b for page in WALKTHROUGHS for b in walkthrough_blocks(page)]
    counts = {kind: sum(b.kind == kind for b in every) for kind in COUNTED}
    line = ("doc blocks of the README and walk-throughs: " +
            ", ".join(f"{n} {kind}" for kind, n in counts.items()))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown in the run's output
            reporter.write_line(line)
    print(line)
    bad = [f"{b.where}: {b.reason}" for b in every if b.kind == "bad-marker"]
    assert not bad, f"unknown doc-test markers: {bad}"
    unexplained = [b.where for b in every if b.kind in {"syntax-only", "excluded"}
                   and not b.reason]
    assert not unexplained, f"a syntax-only or excluded block must say why: {unexplained}"
    assert counts["run"] >= 20
    assert counts["syntax-only"] * 10 <= sum(counts.values()), counts


#: The README is a landing page (issue 30): at most this many words, as ``wc -w`` counts.
README_WORDS = 900


def test_the_readme_is_a_landing_page() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.split()) <= README_WORDS, f"README.md: {len(text.split())} words"
    first = text.split("\n## ")[0]  # the first screen: what it does, before any heading
    for promise in ("reads your files", "HTTP API", "refuses to run silently"):
        assert promise in " ".join(first.split()), promise


@pytest.mark.parametrize("page", WALKTHROUGHS, ids=[p.name for p in WALKTHROUGHS])
def test_every_walkthrough_page_exists(page: Path) -> None:
    assert page.is_file(), page


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in WALKTHROUGHS if p.is_file()],
                         ids=[p.name for p in WALKTHROUGHS if p.is_file()])
def test_the_walkthrough_runs(page: Path, demo_build: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "build").symlink_to(demo_build / "build", target_is_directory=True)
    venv = Path(sys.prefix)
    (work / ".venv").symlink_to(venv, target_is_directory=True)
    env = _user_env(Path(sys.executable).parent)
    ran = 0
    for block in walkthrough_blocks(page):
        if block.kind == "file":
            _write(block, work)
        elif block.kind == "syntax-only":
            if block.lang in SHELL:
                check = subprocess.run(["bash", "-n", "-c", block.text], capture_output=True,
                                       text=True, check=False)
                assert check.returncode == 0, f"{block.where}: {check.stderr}"
            else:
                compile(block.text, block.where, "exec")
        elif block.kind == "run":
            done = _run(block, work, env)
            assert done.returncode == 0, (
                f"{block.where} exited {done.returncode}:\n{block.text}\n--- stdout\n"
                f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-4000:]}")
            for text in block.expects:
                assert text in done.stdout, f"{block.where}: {text!r} not in\n{done.stdout}"
            ran += 1
    assert ran, f"{page.name}: no block ran"


def _links(page: Path) -> list[tuple[str, Path]]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        found.append((target, (page.parent / target.split("#")[0]).resolve()))
    return found


LINKED = [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), ROOT / "benchmarks/RESULTS.md"]


@pytest.mark.parametrize("page", LINKED, ids=[str(p.relative_to(ROOT)) for p in LINKED])
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [target for target, path in _links(page)
               if not path.exists() and path not in PENDING_TARGETS]
    assert not missing, f"{page.relative_to(ROOT)}: links to nothing: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_page_runs(page: Path, tmp_path: Path) -> None:
    script = "\n\n".join(blocks(page))
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_PLUGINS", "PYTHONPATH"}}
    env["PYTHONPATH"] = str(tmp_path)  # modules a snippet writes are importable
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{page.name}:\n{result.stderr[-4000:]}"


@pytest.mark.parametrize("gap", sorted(COVERED))
def test_each_docs_gap_has_a_tested_snippet(gap: str) -> None:
    tested = "\n".join(block for page in PAGES for block in blocks(page))
    missing = [name for name in COVERED[gap] if name not in tested]
    assert not missing, f"{gap}: no tested snippet shows {missing}"


GUIDE = DOCS / "authoring.md"
TEMPLATE = ROOT / "examples" / "third_party_backend" / "src" / "edge_example_backend"
#: The template's names, and the guide's.
RENAMED = {"edge_example_backend": "edge_mybackend", "example-numpy": "mybackend",
           "ExampleOptions": "MyOptions"}


def _renamed(text: str) -> str:
    for old, new in RENAMED.items():
        text = text.replace(old, new)
    return text


def _guide_plugin(fragments: str) -> str:
    """The plugin module: the template's header, the guide's fragments, the §5 hooks.

    The guide shows the module's declaration, probe and options hooks and says to take
    the lifecycle hooks (its §5 table) from the template's ``plugin.py``: those come from
    there, renamed, with the template's imports (the hooks' annotations need them).
    """
    template = (TEMPLATE / "plugin.py").read_text(encoding="utf-8")
    header = template[:template.index("#: The hook-contract version")]
    constants = template[template.index("BACKEND = "):template.index("@hookimpl")]
    lifecycle = template[template.index("@hookimpl\ndef edge_reserve"):]
    return _renamed(header) + fragments + _renamed(constants) + _renamed(lifecycle)


@pytest.mark.slow
def test_the_backend_guide_builds_a_backend_that_passes_the_kit(tmp_path: Path) -> None:
    guide = walkthrough_blocks(GUIDE)
    files = [b for b in guide if b.kind == "file"]
    commands = [b for b in guide if b.kind == "run"]
    assert {b.path for b in files} == {"my-backend/pyproject.toml",
                                       "my-backend/src/edge_mybackend/plugin.py"}
    assert [b.lang for b in commands] == ["sh", "sh"]
    assert not [b.where for b in guide if b.kind in {"bad-marker", "syntax-only"}]
    for block in files:
        _write(block, tmp_path)
    dist = tmp_path / "my-backend"
    package = dist / "src" / "edge_mybackend"
    plugin = package / "plugin.py"
    plugin.write_text(_guide_plugin(plugin.read_text(encoding="utf-8")), encoding="utf-8")
    for name in ("__init__.py", "py.typed", "worker.py", "options.py"):
        (package / name).write_text(_renamed((TEMPLATE / name).read_text(encoding="utf-8")),
                                    encoding="utf-8")
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(site), str(dist)],
        capture_output=True, text=True, timeout=600, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    assert (site / "edge_mybackend" / "plugin.py").is_file()
    env = _user_env(Path(sys.executable).parent)
    env["PYTHONPATH"] = str(site)  # the installed distribution, as pip install would add it
    for block in commands:
        done = _run(block, dist, env)
        assert done.returncode == 0, (
            f"{block.where} exited {done.returncode}:\n{block.text}\n--- stdout\n"
            f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-4000:]}")
        for text in block.expects:
            assert text in done.stdout, f"{block.where}: {text!r} not in\n{done.stdout}"
    from edge_core.testing.checks import CHECKS

    report = json.loads((dist / "conformance.json").read_text(encoding="utf-8"))
    assert report["summary"] == {"passed": len(CHECKS), "failed": 0, "skipped": 0}
    assert [b["backend"] for b in report["backends"]] == ["mybackend"]

