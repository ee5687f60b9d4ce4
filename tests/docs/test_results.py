"""benchmarks/RESULTS.md keeps its format: one section per benchmark, each current.

Every benchmark in ``benchmarks/`` (a script that prints one JSON object last) has a
``## NAME`` section with one table (command, machine, date) and, once measured, the JSON
line it printed, which must parse; the command runs that benchmark. The helper modules
the benchmarks import are not benchmarks. One more section, ``MOVED``, keeps the figures
moved out of the documentation's prose: each entry names the file it came from and the
date it was written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
#: Modules the benchmarks import or run first; they print no result of their own.
HELPERS = {"precompile", "tiny_generate", "transport_anchors", "transport_timing",
           "transport_worker"}
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                    if p.stem not in HELPERS and not p.stem.startswith("_"))
#: The section of figures moved out of the documentation's prose (not a benchmark).
MOVED = "Figures moved from the prose"
ROW = re.compile(r"^\| `(?P<command>[^`]+)` \| (?P<machine>[^|]+) \| (?P<date>[^|]+) \|$",
                 re.MULTILINE)


def sections() -> dict[str, str]:
    text = RESULTS.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_the_helpers_are_really_helpers() -> None:
    for name in HELPERS:
        assert (ROOT / "benchmarks" / f"{name}.py").is_file(), name


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_has_one_current_section(name: str) -> None:
    found = sections()
    assert name in found, f"benchmarks/RESULTS.md has no section for {name}"
    body = found[name]
    rows = ROW.findall(body)
    assert len(rows) == 1, f"{name}: one table row (command, machine, date), found {rows}"
    command, machine, date = (part.strip() for part in rows[0])
    assert f"benchmarks/{name}.py" in command, command
    blocks = re.findall(r"^```json\n(.*?)\n```", body, flags=re.MULTILINE | re.DOTALL)
    if machine == "not measured yet":
        assert not blocks and date == "—", name
        return
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), date
    assert len(blocks) == 1, f"{name}: one JSON line"
    line = json.loads(blocks[0])
    assert isinstance(line, dict)
    # A line that says where it ran (``machine``: edge_core.identity.host_identity) is the
    # machine column's source: the column names that CPU, never one typed from memory.
    cpu = (line.get("machine") or {}).get("cpu_model")
    if cpu:
        assert cpu in machine, f"{name}: the line ran on {cpu!r}; the column says {machine!r}"


def test_every_section_names_a_benchmark_here_or_on_its_way() -> None:
    unknown = set(sections()) - set(BENCHMARKS) - {MOVED}
    assert not unknown, unknown


def test_each_moved_figure_names_its_source_and_date() -> None:
    """Every entry of ``MOVED`` is titled by the file(s) it came from and a date."""
    body = sections()[MOVED]
    entries = re.findall(r"^### (.+)$", body, flags=re.MULTILINE)
    assert entries, f"{MOVED}: no entries"
    for title in entries:
        assert re.search(r"\((?:written|measured) \d{4}-\d{2}-\d{2}", title), title
        paths = re.findall(r"(?:docs|plugins|core|examples)/[\w./-]+", title.split(":")[0])
        assert paths, f"{title}: names no file"
        for path in paths:
            assert (ROOT / path).exists(), f"{title}: {path} does not exist"


#: The keys the performance goals are read from (issue 33's "How it is shown"), by benchmark:
#: renaming one in a script, or a line that lost one, leaves a goal without its figure.
GOAL_KEYS = {
    "startup": ("cold_first_answer_over_rapidocr", "cold_first_answer_over_rapidocr_first_ever",
                "edge_probe_over_import_onnxruntime", "edge_plugins_over_import_onnxruntime",
                "open_s"),
    "ocr_throughput": ("serve_c4_errors", "serve_c4_over_c1", "serve_c4_ceiling_over_c1",
                       "serve_c1_over_rapidocr_best", "edge_texts_equal", "cpu_s_per_page",
                       "rss_mib", "cer", "rapidocr_threads_grid"),
    "ort_call": ("zero_copy_overhead_vs_ort_defaults", "tiny_call_over_mp_pipe",
                 "cpu_per_call_over_mp_pipe", "cpu_us_per_call"),
    "transport": ("echo_over_mp_pipe", "echo_over_mp_pipe_no_spin"),
    "serve": ("http_overhead_over_bare_asgi", "edge_added_ms", "bare_asgi_added_ms",
              "ocr_paired_median_ms", "ocr_paired_ci95_ms"),
}


@pytest.mark.parametrize("name", sorted(GOAL_KEYS))
def test_each_goals_figure_is_in_its_benchmarks_line_and_script(name: str) -> None:
    """The current line holds every goal's key, and the script still names each (a key it
    builds, as serve.py's ``ocr_`` ones, is named in its docstring)."""
    blocks = re.findall(r"^```json\n(.*?)\n```", sections()[name], flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"{name}: not measured"
    line = json.loads(blocks[0])
    script = (ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
    for key in GOAL_KEYS[name]:
        assert key in line, f"{name}: the line in RESULTS.md has no {key!r}"
        assert re.search(rf"\b{key}\b", script), f"benchmarks/{name}.py names no {key!r}"
