"""The docs' commands run: what a reader copies is what the suite runs.

Three kinds of page:

* **Walk-through pages** — the README, docs/getting-started.md, every how-to in
  docs/howto/ and docs/evidence.md — have each shell (``sh``, ``bash``) and ``python``
  block run, in order, in a fresh working directory where ``build/`` is ``make demo``'s
  build (the session's ``demo_build`` fixture, built once) and ``.venv`` is this
  environment, with the environment a user has (no test backends, no ``EDGE_PLUGINS``);
  their ``pip install`` lines (getting-started's route from wheels) meet
  :data:`PIP_SHIM`, as the command pages' do. A block is in one of three classes,
  marked by an HTML comment on the line before its fence:

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

Beyond the docs/ pages:

* **Command pages** (:data:`COMMAND_PAGES`: core/README.md, the OCR example's and the
  backend template's READMEs) run their shell and Python blocks as a walk-through does,
  in a fresh folder of their own (the template's in a copy of the template): what they
  build, they build. Their ``pip install`` lines meet :data:`PIP_SHIM`, the stand-in at
  the network boundary: named distributions are checked to be installed here (extras
  included), a local folder not installed yet is built and installed for real into the
  page's own ``site`` folder.
* ``<!-- doc-test: given NAME -->`` before a block runs the context :data:`CONTEXTS`
  names around it (what the fragment takes as given: an open pipeline, a folder of
  scans), so that a reference fragment runs as printed; ```` ```sh run ```` blocks of a
  reference page run too (:func:`test_the_reference_commands_run`).
* **Every page** (:data:`ALL_PAGES`): every fenced block has a language, and each block
  of commands or code (:data:`COMMAND_LANGS`) is run, or marked syntax-only or excluded
  with its reason (:func:`test_every_command_block_is_run_or_marked`, which prints the
  count of each class); a syntax-only block is parsed, the modules and names it imports
  exist where installed, and its ``edge`` commands exist and take its options
  (``--help``); docs/hooks.md's generated signatures are the hookspecs' own.

``test_block_counts`` prints how many blocks of each class the walk-throughs have.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDE = DOCS / "authoring.md"
FENCE = re.compile(r"^```python run[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

#: Pages whose shell and Python blocks are run (see the module docstring).
WALKTHROUGHS = [ROOT / "README.md", DOCS / "getting-started.md",
                *sorted((DOCS / "howto").glob("*.md")), DOCS / "evidence.md"]
SHELL = {"sh", "bash", "shell"}
RUNNABLE = SHELL | {"python"}
BLOCK = re.compile(
    r"((?:^<!-- doc-test: [^\n]*-->[ \t]*\n)*)^```([A-Za-z]*)([^\n]*)\n(.*?)^```[ \t]*$",
    re.MULTILINE | re.DOTALL)
MARKER = re.compile(
    r"<!-- doc-test: (exclude|syntax-only|expect|write|append|given) ?(.*?) ?-->")
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
    info: str = ""  # the fence's words after the language (``run``)
    kind: str = "run"  # run, syntax-only, excluded, file, shown (not a command);
    # command_blocks adds hook (a generated signature) and unmarked (no test runs it)
    reason: str = ""
    expects: list[str] = field(default_factory=list)
    path: str = ""
    append: bool = False
    given: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def walkthrough_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its class (``shown`` for data, output, TOML)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        markers, lang, body = match.group(1), match.group(2).lower(), match.group(4)
        line = text.count("\n", 0, match.start(2)) + 1
        block = Block(page, line, lang, body, info=match.group(3).strip(),
                      kind="run" if lang in RUNNABLE else "shown")
        for kind, argument in MARKER.findall(markers):
            if kind == "expect":
                block.expects.append(argument)
            elif kind == "given":
                block.given = argument
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


#: What a fragment marked ``<!-- doc-test: given NAME -->`` takes as given: Python run
#: before it (and after it, to use what it defined), in the page's working directory.
#: Real components throughout: the packaged ``add_relu`` graph on ONNX Runtime's CPU.
CONTEXTS: dict[str, tuple[str, str]] = {
    # docs/runtime.md: "open_pipeline('pipeline.toml')" and an input named x.
    "pipeline.toml": (r"""
from pathlib import Path as _Path
from edge_ort.bundles import EXAMPLE_X as image, write_add_relu_bundle
write_add_relu_bundle(_Path("net"))
_Path("pipeline.toml").write_text(
    'name = "net"\n[[stages]]\nid = "s"\nmanifest = "net"\nbackend = { name = "ort-cpu" }\n')
""", ""),
    # docs/cancellation.md: a pipeline already open, closed (and its ledger checked) after.
    "an open pipeline": ("""
from pathlib import Path as _Path
from edge_core.config import load_pipeline as _load
from edge_core.ledger import ResourceLedger as _Ledger
from edge_core.plugins import load_plugins as _plugins
from edge_core.pools import probe_host as _host
from edge_core.runtime import Pipeline as _Pipeline
from edge_ort.bundles import EXAMPLE_X as image, write_add_relu_bundle
from tempfile import mkdtemp as _mkdtemp  # one bundle directory per fragment
_ledger = _Ledger.from_topology(_host().topology())
pipeline = _Pipeline.open(_load({"name": "doc", "stages": [{"id": "s", "manifest": str(
    write_add_relu_bundle(_Path(_mkdtemp(dir=".")) / "open")), "backend": {"name": "ort-cpu"}}]}),
    _plugins(), _ledger)
""", """
assert submission.cancel().value == "already-finished"
pipeline.close()
assert _ledger.is_empty()
"""),
    # docs/runtime.md's fan-out transform, called on 37 crops.
    "a crop chunker": ("""
import numpy as _np
def chunk_crops(previous, source):
    crops, sizes, start = previous["crops"], [], 0
    while start < len(crops):
        size = min(16, 1 << (len(crops) - start).bit_length() - 1)
        sizes.append(crops[start:start + size])
        start += size
    return sizes, previous["boxes"]
""", """
_made = crops_to_recognize({"crops": _np.zeros((37, 3, 48, 320), _np.float32),
                            "boxes": _np.zeros((37, 4, 2))}, {})
assert isinstance(_made, Fanout)
assert [len(item["x"]) for item in _made.items] == [16, 16, 4, 1]
assert _made.carry["carry:boxes"].shape == (37, 4, 2)
"""),
    # core/README.md: a folder holding a graph and its example input, to make a bundle of.
    "models/net": ("""
from pathlib import Path
import numpy as np
from edge_ort.bundles import EXAMPLE_X, write_add_relu_graph
Path("models/net").mkdir(parents=True)
write_add_relu_graph(Path("models/net"))
np.savez("models/net/x.npz", x=EXAMPLE_X)
""", ""),
    # docs/serve.md: a request fault declared on an error type is a 400 with its code.
    "the server's error mapping": ("", """
from edge_serve.outcomes import describe as _describe, from_exception as _answer
_refusal = _answer(ContextLengthExceeded("asks for 100000 tokens"))
assert _refusal.status == 400, _refusal.status
assert _describe(_refusal)["error"]["code"] == "context_length_exceeded"
"""),
    # docs/fixtures.md: another fixtures file (a copy of the shipped one).
    "other.json": ("""
import json
from edge_contracts.conformance import load_fixtures
with open("other.json", "w", encoding="utf-8") as file:
    json.dump(load_fixtures(), file)
""", ""),
    # examples/ocr/README.md: a folder of scans (the demo page, written alone).
    "scans/": ("""
import subprocess, sys
from pathlib import Path
Path("scans").mkdir()
subprocess.run([sys.executable, "-m", "edge_ocr_example.make_image", "scans/page.png"],
               check=True)
""", ""),
}


def _given(block: Block) -> tuple[str, str]:
    if not block.given:
        return "", ""
    assert block.given in CONTEXTS, f"{block.where}: no doc-test context {block.given!r}"
    return CONTEXTS[block.given]


def page_script(page: Path) -> str:
    """A reference page's ``python run`` blocks as one script, each with its context."""
    parts = []
    for block in walkthrough_blocks(page):
        if block.lang == "python" and block.info == "run":
            before, after = _given(block)
            parts += [before, block.text, after]
    return "\n\n".join(part for part in parts if part)


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


def _check_syntax(block: Block) -> None:
    if block.lang in SHELL:
        check = subprocess.run(["bash", "-n", "-c", block.text], capture_output=True,
                               text=True, check=False)
        assert check.returncode == 0, f"{block.where}: {check.stderr}"
    elif block.lang == "python":
        compile(block.text, block.where, "exec")


def _run_blocks(page: Path, work: Path, env: dict[str, str]) -> int:
    """Run ``page``'s blocks in ``work`` as the module docstring says; how many ran."""
    ran = 0
    for block in walkthrough_blocks(page):
        if block.kind == "file":
            _write(block, work)
        elif block.kind == "syntax-only":
            _check_syntax(block)
        elif block.kind == "run":
            before, after = _given(block)
            if block.lang == "python":
                block = replace(block, text=f"{before}\n{block.text}\n{after}")
            elif before or after:  # a shell block's context runs as Python around it
                block = replace(block, text=(
                    f"python - <<'CONTEXT'\n{before}\nCONTEXT\n{block.text}\n"
                    f"python - <<'CONTEXT'\n{after}\nCONTEXT\n"))
            done = _run(block, work, env)
            assert done.returncode == 0, (
                f"{block.where} exited {done.returncode}:\n{block.text}\n--- stdout\n"
                f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-4000:]}")
            for text in block.expects:
                assert text in done.stdout, f"{block.where}: {text!r} not in\n{done.stdout}"
            ran += 1
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in WALKTHROUGHS if p.is_file()],
                         ids=[p.name for p in WALKTHROUGHS if p.is_file()])
def test_the_walkthrough_runs(page: Path, demo_build: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "build").symlink_to(demo_build / "build", target_is_directory=True)
    venv = Path(sys.prefix)
    (work / ".venv").symlink_to(venv, target_is_directory=True)
    env = _pip_shim(_user_env(Path(sys.executable).parent), tmp_path)  # the wheel route
    assert _run_blocks(page, work, env), f"{page.name}: no block ran"


#: Pages of the distributions and examples whose shell and Python blocks run as a
#: walk-through's do, in a fresh working directory of their own (not ``make demo``'s
#: build: what they build, they build), and the folder their relative paths start from.
COMMAND_PAGES = {
    ROOT / "core" / "README.md": "work",
    ROOT / "examples" / "ocr" / "README.md": "work",
    ROOT / "examples" / "third_party_backend" / "README.md": "template",
}

#: ``pip`` for the command pages: the stand-in at the network boundary (the docs'
#: ``pip install`` of unpublished distributions cannot reach an index here). A name is
#: checked to be installed in this environment, with its extras' requirements; a local
#: folder (named as pip reads one: a path holding ``/`` or starting with ``.``, or any
#: folder after ``-e``; a bare ``contracts`` is a project name, as it is to pip) already
#: installed (the workspace's editable installs) is checked the same way,
#: and any other is built and installed for real (``--no-deps``) into the page's own
#: ``site`` folder, which is on the page's ``PYTHONPATH``.
PIP_SHIM = """
import re, subprocess, sys, tomllib
from importlib import metadata
from pathlib import Path

args = sys.argv[1:]
assert args and args[0] == "install", f"pip shim: only 'pip install', not {args}"
editable = False
for arg in args[1:]:
    if arg in {"-e", "--editable"}:
        editable = True
        continue
    assert not arg.startswith("-"), f"pip shim: option {arg} not understood"
    spec = re.fullmatch(r"(.+?)(?:\\[(.+)\\])?", arg)
    where, extras = spec.group(1), (spec.group(2) or "").split(",")
    local = Path(where)
    # as pip reads it: a folder when it looks like a path (or follows -e), else a name
    as_path = "/" in where or where.startswith(".") or editable
    editable = False
    if as_path:
        name = tomllib.loads((local / "pyproject.toml").read_text())["project"]["name"]
    else:
        local, name = None, where
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        assert local is not None, f"pip shim: {name} is not installed here"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-index", "--no-build-isolation", "--target", "SITE",
                        str(local)], check=True)
        print(f"installed {name} from {local} into SITE")
        continue
    for extra in filter(None, extras):
        wanted = [r for r in dist.requires or ()
                  if extra in re.findall(r"extra == .([A-Za-z0-9_.-]+).", r)]
        assert wanted, f"pip shim: {name} has no extra {extra!r}"
        for requirement in wanted:
            metadata.version(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0))
    print(f"{name} {dist.version}: already installed")
"""


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(COMMAND_PAGES),
                         ids=[str(p.relative_to(ROOT)) for p in sorted(COMMAND_PAGES)])
def test_the_command_page_runs(page: Path, tmp_path: Path) -> None:
    if COMMAND_PAGES[page] == "template":  # its blocks run in a copy of the template
        work = tmp_path / "template"
        shutil.copytree(page.parent, work, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    else:  # the checkout's examples/ beside what the page builds (pip install -e ...)
        work = tmp_path / "work"
        work.mkdir()
        (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = _pip_shim(_user_env(Path(sys.executable).parent), tmp_path)
    assert _run_blocks(page, work, env), f"{page.name}: no block ran"


def test_the_pip_shim_reads_a_bare_folder_name_as_a_project_name(tmp_path: Path) -> None:
    """As pip does: ``pip install contracts`` is the index's ``contracts``, not the folder."""
    env = _pip_shim(_user_env(Path(sys.executable).parent), tmp_path)
    bare = subprocess.run(["pip", "install", "contracts"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert bare.returncode != 0 and "contracts is not installed here" in bare.stderr
    for args in (["./contracts"], ["-e", "contracts"]):
        named = subprocess.run(["pip", "install", *args], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120, check=False)
        assert named.returncode == 0, named.stderr
        assert "edge-contracts 0.1.0: already installed" in named.stdout


def _pip_shim(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``env`` with :data:`PIP_SHIM` as ``pip``, its ``site`` folder on ``PYTHONPATH``.

    A page's ``pip install`` of the wheels (getting-started's route from wheels, the
    command pages') is checked against this environment's installed distributions and
    their extras instead of reaching an index, as the module docstring says.
    """
    site = tmp_path / "site"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pip").write_text(f"#!{sys.executable}\n" +
                              PIP_SHIM.replace("SITE", str(site)), encoding="utf-8")
    (shim / "pip").chmod(0o755)
    return {**env, "PATH": f"{shim}{os.pathsep}{env['PATH']}", "PYTHONPATH": str(site)}


#: Fence languages that hold commands or code a reader runs.
COMMAND_LANGS = RUNNABLE | {"console", "zsh", "bat", "cmd", "powershell", "ps1", "py",
                            "pycon"}
#: Every Markdown page of the repository, but what tools and builds leave in it.
SKIPPED_DIRS = {"build", "dist", "node_modules", "__pycache__"}
ALL_PAGES = sorted(
    p for p in ROOT.rglob("*.md")
    if not any(part.startswith(".") or part in SKIPPED_DIRS or part.endswith(".egg-info")
               for part in p.relative_to(ROOT).parts[:-1]))
HOOKS = DOCS / "hooks.md"
#: Pages whose every command block a test of their own runs or checks.
RUN_WHOLE = {*WALKTHROUGHS, *COMMAND_PAGES, GUIDE, HOOKS}
INDENTED_FENCE = re.compile(r"^[ \t]+```([A-Za-z]*)", re.MULTILINE)


def command_blocks(page: Path) -> list[Block]:
    """``page``'s blocks of commands or code, each classed as the docstring says.

    ``run`` (a test runs it), ``syntax-only``, ``excluded``, ``file``, ``hook`` (a
    generated hook signature), or ``unmarked``: a block no test runs and no marker
    explains (a ``python`` block of a reference page without ``run``, a ``console`` or
    ``bat`` block without a marker).
    """
    found = []
    for block in walkthrough_blocks(page):
        if block.lang not in COMMAND_LANGS and block.kind != "bad-marker":
            continue
        if block.kind == "run" and page not in RUN_WHOLE and block.info != "run":
            block.kind = "unmarked"
        elif block.kind == "run" and page == HOOKS:
            block.kind = "hook"
        elif block.kind == "shown":
            block.kind = "unmarked"
        found.append(block)
    return found


def test_every_command_block_is_run_or_marked(request: pytest.FixtureRequest) -> None:
    """A block of commands or code added to any page is run, or marked with its reason."""
    assert ROOT / "README.md" in ALL_PAGES and GUIDE in ALL_PAGES
    every = [b for page in ALL_PAGES for b in command_blocks(page)]
    counts = {kind: sum(b.kind == kind for b in every)
              for kind in ("run", "file", "hook", "syntax-only", "excluded")}
    line = "command blocks of every page: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)
    unlabelled = [b.where for page in ALL_PAGES for b in walkthrough_blocks(page)
                  if not b.lang]
    assert not unlabelled, f"fenced blocks without a language (say text, sh, ...): {unlabelled}"
    indented = [f"{p.relative_to(ROOT)}: {lang or '(none)'}" for p in ALL_PAGES
                for lang in INDENTED_FENCE.findall(p.read_text(encoding="utf-8"))
                if lang.lower() in COMMAND_LANGS]
    assert not indented, f"indented command fences are not found by the runners: {indented}"
    bad = [f"{b.where}: {b.reason}" for b in every if b.kind == "bad-marker"]
    assert not bad, f"unknown doc-test markers: {bad}"
    unmarked = [f"{b.where} ({b.lang})" for b in every if b.kind == "unmarked"]
    assert not unmarked, (
        "blocks no test runs: make them ```python run```, or mark them "
        f"<!-- doc-test: syntax-only (REASON) --> / exclude (REASON): {unmarked}")
    unexplained = [b.where for b in every if b.kind in {"syntax-only", "excluded"}
                   and not b.reason]
    assert not unexplained, f"a syntax-only or excluded block must say why: {unexplained}"
    givens = [b.where for b in every if b.given and b.given not in CONTEXTS]
    assert not givens, f"unknown doc-test contexts: {givens}"


def _logical_lines(block: Block) -> list[str]:
    lines = []
    text = block.text
    if block.lang == "console":  # a transcript: the commands are the lines after "$ "
        text = "\n".join(re.findall(r"^\$ ((?:.*\\\n)*.*)", text, re.MULTILINE))
    if block.lang in {"bat", "cmd"}:
        text = text.replace("\\", "/")
    for line in text.replace("\\\n", " ").splitlines():
        with contextlib.suppress(ValueError):
            lines.append(shlex.split(line, comments=True))
    return [" ".join(shlex.quote(word) for word in words) for words in lines if words]


def _edge_help(words: tuple[str, ...], env: dict[str, str]) -> str:
    edge = str(Path(sys.executable).with_name("edge"))
    for end in range(len(words), 0 if words else -1, -1):
        shown = subprocess.run([edge, *words[:end], "--help"], capture_output=True,
                               text=True, env=env, timeout=120, check=False)
        if shown.returncode == 0:
            return shown.stdout
    raise AssertionError(f"edge {' '.join(words)}: no such command")


def _command_starts(words: list[str], names: set[str]) -> list[int]:
    """Where a command named one of ``names`` starts (first word, or after ``&&`` ...)."""
    return [i for i, w in enumerate(words)
            if re.split(r"[/\\]", w)[-1] in names
            and all(re.fullmatch(r"[A-Za-z_]+=.*", v) for v in itertools.takewhile(
                lambda v: v not in {"&&", "||", ";", "|", "&"}, reversed(words[:i])))]


def _python_help(args: list[str], env: dict[str, str]) -> tuple[str, list[str]] | None:
    """``python SCRIPT.py ...`` (a script of the checkout) or ``python -m MODULE ...``."""
    if args[:1] == ["-m"] and len(args) > 1:
        target, rest = ["-m", args[1]], args[2:]
    elif args and args[0].endswith(".py") and (ROOT / args[0]).is_file():
        target, rest = [str(ROOT / args[0])], args[1:]
    else:
        return None
    if target[0] == "-m" and target[1] in {"pip", "venv", "pytest"}:
        return None
    shown = subprocess.run([sys.executable, *target, "--help"], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert shown.returncode == 0, f"python {' '.join(target)} --help: {shown.stderr[-2000:]}"
    return shown.stdout, rest


def check_command_options(block: Block, env: dict[str, str]) -> int:
    """Every ``edge`` command of ``block`` (its command exists) and every ``python``
    script or module of the checkout it runs: each takes the options the block gives it
    (as its ``--help`` lists them). Returns how many commands were checked."""
    checked = 0
    for line in _logical_lines(block):
        words = [w.strip("[]|") for w in shlex.split(line)]
        for start in _command_starts(words, {"edge", "edge.exe"}):
            args = words[start + 1:]
            command = tuple(itertools.takewhile(
                lambda w: re.fullmatch(r"[a-z][a-z-]*", w) is not None, args))
            name, shown = f"edge {' '.join(command[:2])}", _edge_help(command[:2], env)
            break
        else:
            for start in _command_starts(words, {"python", "python3", "python.exe"}):
                found = _python_help(words[start + 1:], env)
                if found is not None:
                    shown, args = found
                    name = " ".join(words[start:start + 3])
                    break
            else:
                continue
        for word in itertools.takewhile(lambda w: w not in {"&&", "||", ";", "|"}, args):
            option = word.split("=")[0]
            if option.startswith("--"):
                assert re.search(rf"{re.escape(option)}(?![\w-])", shown), (
                    f"{block.where}: {name} has no option {option}")
        checked += 1
    return checked


#: Modules a checked-only block may import that this machine has not installed.
NOT_INSTALLED_HERE = {"vllm", "torch", "onnxruntime_directml", "qai_hub"}


def check_imports(block: Block) -> None:
    """The modules ``block`` imports exist, and so do the names it takes from them."""
    import ast
    import importlib
    import importlib.util

    for node in ast.walk(ast.parse(block.text)):
        if isinstance(node, ast.Import):
            wanted = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            wanted = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in wanted:
            if importlib.util.find_spec(module.split(".")[0]) is None:
                assert module.split(".")[0] in NOT_INSTALLED_HERE, f"{block.where}: {module}"
                continue
            loaded = importlib.import_module(module)
            assert name is None or hasattr(loaded, name), f"{block.where}: {module}.{name}"


CHECKED = [b for page in ALL_PAGES for b in command_blocks(page) if b.kind == "syntax-only"]


@pytest.mark.parametrize("block", CHECKED, ids=[b.where for b in CHECKED])
def test_a_checked_only_block_is_checked_as_far_as_this_machine_allows(block: Block) -> None:
    """Parsed; its imports and names exist; its ``edge`` commands take its options."""
    if block.lang in {"bat", "cmd"}:
        assert check_command_options(block, _user_env(Path(sys.executable).parent)), block.where
        return
    if block.lang == "console":
        script = "\n".join(_logical_lines(block))
        check = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True,
                               check=False)
        assert check.returncode == 0, f"{block.where}: {check.stderr}"
    else:
        _check_syntax(block)
    if block.lang == "python":
        check_imports(block)
    check_command_options(block, _user_env(Path(sys.executable).parent))


#: pip options that take a value (the word after them is not a requirement).
PIP_VALUED = {"-w", "--wheel-dir", "-r", "--requirement", "-c", "--constraint", "-f",
              "--find-links", "-i", "--index-url", "--extra-index-url", "-t", "--target",
              "--prefix", "--root", "--src", "-d", "--dest", "--platform",
              "--python-version", "--only-binary", "--no-binary"}


def bare_folder_requirements(block: Block) -> list[str]:
    """The requirements of ``block``'s ``pip install/wheel/download`` commands that name a
    folder of the checkout by a bare name (``contracts``, not ``./contracts``).

    pip reads a requirement as a local folder only when it looks like a path (holds a
    ``/`` or starts with ``.``), or after ``-e``; a bare name is a project name looked up
    on the package index: another project's, or none (pip then fails).
    """
    found = []
    for line in _logical_lines(block):
        words = shlex.split(line)
        starts = [i + 1 for i in _command_starts(words, {"pip", "pip3"})]
        starts += [i + 3 for i in _command_starts(words, {"python", "python3"})
                   if words[i + 1:i + 3] == ["-m", "pip"]]
        for start in starts:
            args = list(itertools.takewhile(
                lambda w: w not in {"&&", "||", ";", "|", "&"}, words[start:]))
            if args[:1] not in (["install"], ["wheel"], ["download"]):
                continue
            skip = False
            for word in args[1:]:
                if skip or word.startswith("-"):
                    skip = word in PIP_VALUED or word in {"-e", "--editable"}
                    continue
                name = re.split(r"[\[<>=!~;@ ]", word, maxsplit=1)[0]
                if ("/" not in name and not name.startswith(".")
                        and (ROOT / name / "pyproject.toml").is_file()):
                    found.append(f"{block.where}: {word}")
    return found


EVERY_BLOCK = [b for page in ALL_PAGES for b in command_blocks(page)
               if b.lang in SHELL | {"console"}]


def test_a_pip_command_names_a_checkout_folder_as_a_path() -> None:
    """``pip wheel contracts core`` fetches whatever the index calls ``contracts``."""
    bare = [where for block in EVERY_BLOCK for where in bare_folder_requirements(block)]
    assert not bare, ("pip reads a bare name as a project on the index, not the folder: "
                      f"write ./NAME: {bare}")


def test_the_pip_folder_check_finds_a_bare_folder_name() -> None:
    """The check above is not vacuous: the README's old wheel command is caught."""
    old = Block(ROOT / "README.md", 1, "sh",
                "python -m pip wheel --no-deps -w dist contracts core plugins/libraries/ort\n"
                "pip install -e contracts --find-links dist 'core[yaml]' ./core\n")
    assert [w.split(": ")[1] for w in bare_folder_requirements(old)] == [
        "contracts", "core", "core[yaml]"]


HOOK_BLOCKS = [b for b in command_blocks(HOOKS) if b.kind == "hook"]


def test_the_hook_reference_shows_the_real_hookspecs() -> None:
    """docs/hooks.md's signatures parse, and each is its hookspec's, name and parameters."""
    import ast
    import inspect

    from edge_core import hookspecs

    assert len(HOOK_BLOCKS) >= 10
    shown = set()
    for block in HOOK_BLOCKS:
        tree = ast.parse(block.text.rstrip() + ": ...\n", block.where)
        [function] = tree.body
        assert isinstance(function, ast.FunctionDef), block.where
        spec = getattr(hookspecs, function.name)
        real = inspect.signature(spec)
        assert [a.arg for a in function.args.args] == list(real.parameters), block.where
        assert ast.unparse(function.returns) == ast.unparse(ast.parse(
            inspect.getsource(spec)).body[0].returns), block.where  # type: ignore[attr-defined]
        shown.add(function.name)
    specs = {name for name, value in vars(hookspecs).items()
             if name.startswith("edge_") and callable(value)}
    assert shown == specs


@pytest.mark.parametrize("page", [p for p in ALL_PAGES if p not in RUN_WHOLE and any(
    b.lang in SHELL and b.info == "run" for b in command_blocks(p))],
    ids=lambda p: str(p.relative_to(ROOT)))
def test_the_reference_commands_run(page: Path, tmp_path: Path) -> None:
    """A reference page's ```` ```sh run ```` blocks run in order, in a fresh folder."""
    env = _user_env(Path(sys.executable).parent)
    for block in command_blocks(page):
        if block.lang in SHELL and block.info == "run":
            before, after = _given(block)
            if before or after:
                block = replace(block, text=(
                    f"python - <<'CONTEXT'\n{before}\nCONTEXT\n{block.text}\n"
                    f"python - <<'CONTEXT'\n{after}\nCONTEXT\n"))
            done = _run(block, tmp_path, env)
            assert done.returncode == 0, (
                f"{block.where} exited {done.returncode}:\n{block.text}\n--- stdout\n"
                f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-4000:]}")
            for text in block.expects:
                assert text in done.stdout, f"{block.where}: {text!r} not in\n{done.stdout}"


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
    script = page_script(page)
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


def test_the_recipe_backend_declares_each_parameter_its_worker_reads(tmp_path: Path) -> None:
    """docs/recipes.md's ``recipe-tanh``: ``BackendInfo.params`` names what its worker reads.

    A front end refuses a request parameter its final stage's backend does not declare
    (``edge serve``: 400 naming it); a backend that declares none passes every name on, a
    misspelt one too. The worker block is run (it writes the module) and its handler given
    a request whose parameters note each name read; the plugin block is run as the page
    runs it, and its loaded declaration must name exactly those.
    """
    import importlib.util
    import threading
    from types import SimpleNamespace

    import numpy as np

    from edge_core.plugins import load_plugins

    page = blocks(DOCS / "recipes.md")
    (worker,) = [block for block in page if '"recipe_worker.py"' in block]
    (plugin,) = [block for block in page if 'BackendInfo(name="recipe-tanh"' in block]
    source = tmp_path / "recipe_worker.py"
    exec(worker.replace('Path("recipe_worker.py")', f"Path({str(source)!r})"),
         {"Path": Path})
    spec = importlib.util.spec_from_file_location("recipe_worker_params", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    read: set[str] = set()

    class Noted(dict[str, object]):
        def get(self, key: str, default: object = None) -> object:
            read.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> object:
            read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            read.add(str(key))
            return super().__contains__(key)

    handler = module.create()
    handler.load({})
    answered = threading.Event()
    call = SimpleNamespace(inputs={"x": np.zeros((2, 3), np.float32)}, params=Noted(),
                           request_id="r", done=lambda outputs: answered.set())
    assert handler.submit(call) is None
    assert answered.wait(10), "the recipe's worker never answered"
    plugin_names: dict[str, object] = {"np": np, "load_plugins": load_plugins}
    exec(plugin, plugin_names)
    loaded = plugin_names["tanh_plugins"]
    info, _owner = loaded.backends["recipe-tanh"]  # type: ignore[attr-defined]
    assert info.params == read, f"recipe-tanh declares params={info.params}, reads {read}"


def test_the_recipe_backend_declares_it_needs_a_bundle(tmp_path: Path) -> None:
    """docs/recipes.md's ``recipe-tanh``: a stage without a bundle is refused by the check.

    Its ``edge_load`` refuses a stage whose ``manifest_dir`` is None; declaring
    ``needs_bundle`` has the pipeline-file check (what ``edge run``, ``plan``, ``profile``
    and ``serve`` do before opening anything) refuse such a stage at its ``manifest``,
    before any worker starts. The plugin block is run as the page runs it.
    """
    import numpy as np

    from edge_core.config import InvalidConfigError
    from edge_core.plugins import load_plugins
    from edge_core.preflight import check_pipeline

    (plugin,) = [block for block in blocks(DOCS / "recipes.md")
                 if 'BackendInfo(name="recipe-tanh"' in block]
    plugin_names: dict[str, object] = {"np": np, "load_plugins": load_plugins}
    exec(plugin, plugin_names)
    loaded = plugin_names["tanh_plugins"]
    info, _owner = loaded.backends["recipe-tanh"]  # type: ignore[attr-defined]
    assert info.needs_bundle, "recipe-tanh refuses a stage without a bundle, undeclared"
    bare = tmp_path / "bare.toml"
    bare.write_text('name = "tanh"\n\n[[stages]]\nid = "t"\n'
                    'backend = { name = "recipe-tanh" }\n', encoding="utf-8")
    with pytest.raises(InvalidConfigError) as refused:
        check_pipeline(bare, plugins=loaded)  # type: ignore[arg-type]
    assert [(problem.path, problem.value) for problem in refused.value.problems] == [
        ("stages[0].manifest", None)], refused.value.problems
    assert "'recipe-tanh' needs an artifact bundle" in str(refused.value)


def _installs_before_pytest(page: Path) -> list[str]:
    """The ``pip install`` lines of ``page``'s command blocks before its first ``pytest``
    command; ``["no pytest"]`` when none runs pytest."""
    installs = []
    for block in command_blocks(page):
        if block.lang not in SHELL:
            continue
        for line in _logical_lines(block):
            words = shlex.split(line)
            if _command_starts(words, {"pytest"}):
                return installs
            if [i for i in _command_starts(words, {"pip", "pip3"})
                    if words[i + 1:i + 2] == ["install"]]:
                installs.append(line)
    return ["no pytest"]


@pytest.mark.parametrize("page", [GUIDE, ROOT / "examples/third_party_backend/README.md"],
                         ids=["authoring", "template"])
def test_a_page_that_runs_the_kits_pytest_items_installs_pytest_first(page: Path) -> None:
    """pytest is no dependency of edge-core: its ``testing`` extra brings it, and a
    backend author with only the wheels has no pytest until the page says so."""
    import tomllib

    with (ROOT / "core" / "pyproject.toml").open("rb") as handle:
        extras = tomllib.load(handle)["project"]["optional-dependencies"]
    assert [r for r in extras["testing"] if r.startswith("pytest")], extras
    installs = _installs_before_pytest(page)
    assert installs != ["no pytest"], page
    assert any("edge-core[testing]" in line for line in installs), (
        f"{page.relative_to(ROOT)}: runs pytest without installing 'edge-core[testing]' "
        f"first: {installs}")


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
    # its pip install meets the shim; PYTHONPATH is the shim's site folder, where the
    # distribution was installed: as pip install would add it
    env = _pip_shim(_user_env(Path(sys.executable).parent), tmp_path)
    assert env["PYTHONPATH"] == str(site)
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

