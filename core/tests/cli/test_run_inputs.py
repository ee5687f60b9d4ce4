"""``edge run --input``: several files, directories, --json/--jsonl, bad input before opening."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.cli import common
from edge_core.cli.run_inputs import PreparedInputs, Progress, expand_inputs

from .conftest import echo_pipeline

PIPELINE = echo_pipeline("numbers", head='prepare = "edge_echo.ends:prepare"\n'
                                     'finish = "edge_echo.ends:finish"\n')


def edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": "echo"}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    (tmp_path / "broken.toml").write_text(
        PIPELINE.replace("scale = 2.0", 'scale = 2.0\nfail_at = "load"'))
    (tmp_path / "a.txt").write_text("1 2\n")
    (tmp_path / "b.txt").write_text("10\n")
    batch = tmp_path / "batch"
    batch.mkdir()
    (batch / "2.txt").write_text("2")
    (batch / "1.txt").write_text("1")
    (batch / "README.md").write_text("not an input")  # not a suffix prepare reads
    (batch / ".hidden.txt").write_text("x")
    return tmp_path


def test_several_inputs_give_one_json_document_with_a_result_each(work: Path) -> None:
    result = edge("run", "pipeline.toml", "--input", "a.txt", "--input", "b.txt", "--json",
                  cwd=work)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert next(iter(report)) == "results"  # the answer first, then the plan
    assert [{k: r[k] for k in ("file", "lines")} for r in report["results"]] == [
        {"file": "a.txt", "lines": [2.0, 4.0]}, {"file": "b.txt", "lines": [20.0]}]
    # each answer with the placement that served it (one backend: no choice made)
    assert all(r["placement"][0]["backend"] == "echo" and r["placement"][0]["decision"]
               == "only" for r in report["results"])
    assert report["requests"] == 2 and report["plan"]["stages"][0]["id"] == "a"
    assert report["ledger_after_close"]["reservations"] == []


def test_a_directory_reads_its_files_in_name_order_with_the_suffixes_prepare_takes(
    work: Path,
) -> None:
    result = edge("run", "pipeline.toml", "--input", "batch", "--jsonl", cwd=work)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [{k: line[k] for k in ("file", "lines")} for line in lines] == [
        {"file": str(Path("batch") / "1.txt"), "lines": [2.0]},
        {"file": str(Path("batch") / "2.txt"), "lines": [4.0]}]
    assert all("placement" in line for line in lines)
    assert "latency p50" in result.stderr  # the summary goes to stderr with --jsonl


def test_human_output_prints_each_files_answer_once(work: Path) -> None:
    result = edge("run", "pipeline.toml", "--input", "a.txt", cwd=work)
    assert result.returncode == 0, result.stderr
    assert "answer (a.txt): [2.0, 4.0]" in result.stdout
    assert result.stdout.count("[2.0, 4.0]") == 1


def test_the_files_a_directory_holds_but_prepare_does_not_read_are_listed(work: Path) -> None:
    result = edge("run", "pipeline.toml", "--input", "batch", cwd=work)
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert skipped == [f"edge: --input: skipped 1 entry not read (a suffix the pipeline's "
                       f"prepare does not read, a subdirectory/ or a special file): "
                       f"{Path('batch') / 'README.md'}"]
    as_json = edge("run", "pipeline.toml", "--input", "batch", "--json", cwd=work)
    assert json.loads(as_json.stdout)["skipped"] == [str(Path("batch") / "README.md")]
    # a subdirectory (not descended into) and a special file are listed too, not passed over
    (work / "batch" / "sub").mkdir()
    (work / "batch" / "sub" / "3.txt").write_text("3")
    os.mkfifo(work / "batch" / "pipe.txt")
    as_json = edge("run", "pipeline.toml", "--input", "batch", "--json", cwd=work)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert [r["file"] for r in report["results"]] == [
        str(Path("batch") / "1.txt"), str(Path("batch") / "2.txt")]
    assert report["skipped"] == [str(Path("batch") / name) for name in ("README.md",
                                                                      "pipe.txt")] + [
        f"{Path('batch') / 'sub'}/"]


def test_a_directory_with_nothing_to_read_is_refused_naming_it_and_what_it_holds(
    work: Path,
) -> None:
    (work / "empty").mkdir()
    (work / "notes").mkdir()
    (work / "notes" / "a.md").write_text("not an input")
    (work / "notes" / "deeper").mkdir()
    for folder, tail, skipped in (
            ("empty", "it is empty", []),
            ("notes", f"what it holds is not read: {Path('notes') / 'a.md'}, "
                      f"{Path('notes') / 'deeper'}/",
             [str(Path("notes") / "a.md"), f"{Path('notes') / 'deeper'}/"])):
        # a good file beside it does not make the empty directory acceptable
        result = edge("run", "pipeline.toml", "--input", "a.txt", "--input", folder, cwd=work)
        assert result.returncode == 2, result.stderr
        assert result.stderr == (f"edge: --input {folder}: the directory holds no file with a "
                                 f"suffix in ['.txt'] to read; {tail}\n")
        as_json = edge("run", "pipeline.toml", "--input", folder, "--json", cwd=work)
        assert as_json.returncode == 2
        body = json.loads(as_json.stdout)
        assert body["ok"] is False and body["option"] == "--input"
        assert body["input"] == folder and body["skipped"] == skipped


def test_every_refused_input_is_named_with_its_reason_before_anything_opens(
    work: Path,
) -> None:
    scans = work / "scans"
    scans.mkdir()
    (scans / "1.txt").write_text("1")
    (scans / "2.txt").write_text("two")  # prepare refuses it
    (scans / "3.txt").write_text("3")
    (scans / "4.txt").symlink_to(work / "gone.txt")  # a link to nothing: named, not skipped
    (scans / "5.txt").write_text("")  # prepare refuses it
    # broken.toml would fail while loading (exit 1): exit 2 shows nothing opened
    result = edge("run", "broken.toml", "--input", "scans", cwd=work)
    assert result.returncode == 2
    refused = [str(scans.relative_to(work) / name) for name in ("2.txt", "4.txt", "5.txt")]
    # one line for the count, then one line per refused file, each with its reason
    head, *lines = result.stderr.splitlines()
    assert head == "edge: 3 of 5 inputs refused:"
    assert len(lines) == 3, result.stderr
    assert lines[0].startswith(f"edge: input {refused[0]}: ValueError: {refused[0]}: not a "
                               "list of numbers: ")
    assert lines[1].startswith(f"edge: input {refused[1]}: FileNotFoundError: ")
    assert lines[2] == f"edge: input {refused[2]}: ValueError: {refused[2]}: holds no numbers: ''"
    assert "loading stage" not in result.stderr
    as_json = edge("run", "broken.toml", "--input", "scans", "--json", cwd=work)
    assert as_json.returncode == 2
    body = json.loads(as_json.stdout)
    assert body["ok"] is False and body["input"] == refused[0]
    assert [r["file"] for r in body["refused"]] == refused
    assert "not a list of numbers" in body["refused"][0]["error"]
    assert body["problems"] == [f"input {r['file']}: {r['error']}" for r in body["refused"]]
    # --json keeps its one-line error; each of its problems is a line of the text output
    assert body["error"] == "3 of 5 inputs refused: " + "; ".join(body["problems"])
    assert [f"edge: {problem}" for problem in body["problems"]] == lines


def test_a_refused_name_holding_a_newline_is_still_one_line(work: Path) -> None:
    """A file name may hold a newline: its refusal is one stderr line all the same."""
    scans = work / "scans"
    scans.mkdir()
    (scans / "1.txt").write_text("")
    (scans / "two\nlines.txt").write_text("x")
    result = edge("run", "pipeline.toml", "--input", "scans", cwd=work)
    assert result.returncode == 2
    named = [str(Path("scans") / name) for name in ("1.txt", "two lines.txt")]
    assert result.stderr.splitlines() == [
        "edge: 2 of 2 inputs refused:",
        f"edge: input {named[0]}: ValueError: {named[0]}: holds no numbers: ''",
        f"edge: input {named[1]}: ValueError: {named[1]}: not a list of numbers: could not "
        "convert string to float: 'x'"]


def test_a_path_that_is_not_a_regular_file_is_refused_without_reading_it(work: Path) -> None:
    os.mkfifo(work / "pipe.txt")  # reading it would wait for a writer forever
    result = edge("run", "pipeline.toml", "--input", "pipe.txt", cwd=work)
    assert result.returncode == 2
    assert result.stderr == "edge: input pipe.txt: not a regular file\n"


#: A regular file that even root cannot open to read (a write-only sysctl).
WRITE_ONLY = Path("/proc/sys/vm/compact_memory")


def test_an_unreadable_file_in_a_directory_is_named(work: Path) -> None:
    if os.geteuid() != 0:
        (work / "batch" / "secret.txt").write_text("1")
        (work / "batch" / "secret.txt").chmod(0)
    elif WRITE_ONLY.exists():  # root reads a file whatever its mode
        (work / "batch" / "secret.txt").symlink_to(WRITE_ONLY)
    else:
        pytest.skip("running as root without a write-only file to point at")
    result = edge("run", "pipeline.toml", "--input", "batch", "--json", cwd=work)
    assert result.returncode == 2, result.stderr
    body = json.loads(result.stdout)
    assert body["refused"] == [{"file": str(Path("batch") / "secret.txt"),
                                "error": body["refused"][0]["error"]}]
    assert body["refused"][0]["error"].startswith("PermissionError: ")


TWO_STAGES = PIPELINE + """
[[stages]]
id = "b"
input_transform = "edge_echo.transforms:refuse_negative"
[stages.backend]
name = "echo"
[stages.backend.options]
scale = 1.0
"""


def test_an_input_whose_request_fails_is_named_and_the_others_are_still_served(
    work: Path,
) -> None:
    (work / "two.toml").write_text(TWO_STAGES)
    scans = work / "scans"
    scans.mkdir()
    for name, text in (("1.txt", "1"), ("2.txt", "-5"), ("3.txt", "3")):
        (scans / name).write_text(text)  # -5 passes prepare; stage b refuses it
    files = [str(Path("scans") / name) for name in ("1.txt", "2.txt", "3.txt")]
    reason = ("TransformFailed: pipelines[numbers].stages[b].input_transform: transform "
              "edge_echo.transforms:refuse_negative raised ValueError: x: negative values "
              "are refused: -10.0")

    human = edge("run", "two.toml", "--input", "scans", cwd=work)
    assert human.returncode == 1, human.stderr
    assert [line for line in human.stdout.splitlines()
            if line.startswith(("answer", "failed"))] == [
        f"answer ({files[0]}): [2.0]", f"failed ({files[1]}): {reason}",
        f"answer ({files[2]}): [6.0]"]
    assert "latency p50 over 2 request(s)" in human.stdout
    assert human.stderr.splitlines()[-1] == (
        f"edge: 1 of 3 input(s) failed (each with its reason in the output): {files[1]}")

    as_json = edge("run", "two.toml", "--input", "scans", "--json", cwd=work)
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["failed"] == [files[1]]
    assert [{k: v for k, v in r.items() if k != "placement"} for r in report["results"]] == [
        {"file": files[0], "ok": True, "lines": [2.0]},
        {"file": files[1], "ok": False, "error": reason},
        {"file": files[2], "ok": True, "lines": [6.0]}]
    assert report["requests"] == 2 and report["ledger_after_close"]["reservations"] == []

    lines = edge("run", "two.toml", "--input", "scans", "--jsonl", cwd=work)
    assert lines.returncode == 1, lines.stderr
    assert [(r["file"], r["ok"], r.get("error")) for r in map(
        json.loads, lines.stdout.splitlines())] == [
        (files[0], True, None), (files[1], False, reason), (files[2], True, None)]

    every = edge("run", "two.toml", "--input", str(scans / "2.txt"), "--json", cwd=work)
    assert every.returncode == 1, every.stderr
    report = json.loads(every.stdout)
    assert report["ok"] is False and report["requests"] == 0
    assert set(report["latency_p50_ms"].values()) == {None}  # no request to time
    human = edge("run", "two.toml", "--input", str(scans / "2.txt"), cwd=work)
    assert human.returncode == 1 and "latency: no request succeeded" in human.stdout


def test_every_input_succeeding_reports_ok_and_exits_0(work: Path) -> None:
    result = edge("run", "pipeline.toml", "--input", "batch", "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["failed"] == []
    assert all(r["ok"] is True for r in report["results"])


def test_answers_print_as_text_lines_no_text_found_or_json(capsys: pytest.CaptureFixture[str],
                                                          ) -> None:
    import sys as system

    from edge_core.cli.run_cmd import print_answer

    print_answer([{"text": "Hello", "score": 0.9}, {"text": "world", "score": 0.8}], "p.png",
                 system.stdout)
    print_answer([], "blank.png", system.stdout)
    print_answer({"y": [1]}, None, system.stdout)
    assert capsys.readouterr().out.splitlines() == [
        "recognised text in p.png:", "  Hello", "  world",
        "no text found in blank.png",
        'answer: {"y": [1]}']


@pytest.mark.parametrize(("content", "reason"), [
    (None, "No such file"),
    ("", "holds no numbers"),
    ("1 two 3", "not a list of numbers"),
])
def test_bad_input_exits_2_naming_the_file_before_the_pipeline_opens(
    work: Path, content: str | None, reason: str,
) -> None:
    if content is not None:
        (work / "bad.txt").write_text(content)
    # broken.toml would fail while loading (exit 1): exit 2 shows prepare ran first
    result = edge("run", "broken.toml", "--input", "a.txt", "--input", "bad.txt", cwd=work)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("edge: input bad.txt: ") and reason in result.stderr
    as_json = edge("run", "broken.toml", "--input", "bad.txt", "--json", cwd=work)
    assert as_json.returncode == 2
    body = json.loads(as_json.stdout)
    assert body["ok"] is False and reason in body["error"] and body["input"] == "bad.txt"


def test_an_image_given_to_inputs_is_refused_with_a_hint(work: Path) -> None:
    (work / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    result = edge("run", "pipeline.toml", "--inputs", "photo.png", cwd=work)
    assert result.returncode == 2
    assert "--inputs photo.png: not an .npz archive" in result.stderr
    assert "use --input" in result.stderr and "pickled" not in result.stderr


def test_without_input_the_command_says_where_the_inputs_come_from(work: Path) -> None:
    np.savez(work / "in.npz", x=np.array([1.0], np.float32))
    result = edge("run", "pipeline.toml", "--inputs", "in.npz", "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["input"] == "--inputs in.npz" and report["answer"] == [2.0]


def test_expand_inputs_keeps_missing_paths_and_refuses_an_empty_directory(
    tmp_path: Path,
) -> None:
    assert expand_inputs(["nope.png"], (".png",)) == (["nope.png"], [])
    (tmp_path / "x.PNG").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert expand_inputs([str(tmp_path)], (".png",)) == ([str(tmp_path / "x.PNG")],
                                                         [str(tmp_path / "notes.txt")])
    with pytest.raises(common.CommandFailed, match="holds no file with a suffix in"):
        expand_inputs([str(tmp_path)], (".jpg",))


def test_prepared_inputs_keep_the_first_within_the_byte_budget_and_prepare_the_rest_again(
) -> None:
    calls: list[str] = []
    sizes = {"a": 600, "b": 300, "c": 200}  # a and b fit the budget; c would not

    def prepare(source: str) -> dict[str, Any]:
        calls.append(source)
        return {"x": np.zeros(sizes[source], np.uint8), "name": source}

    prepared = PreparedInputs(prepare, ["a", "b", "c"], keep_bytes=1000)
    assert calls == ["a", "b", "c"]
    assert [prepared.get(i)["name"] for i in range(3)] == ["a", "b", "c"]
    assert calls == ["a", "b", "c", "c"]
    calls.clear()
    prepared = PreparedInputs(prepare, ["a", "b", "c"], keep_bytes=500)  # a alone is over
    assert [prepared.get(i)["name"] for i in range(3)] == ["a", "b", "c"]
    assert calls == ["a", "b", "c", "a", "b", "c"]


def test_a_bug_in_prepare_is_not_taken_for_bad_input() -> None:
    def prepare(source: str) -> dict[str, str]:
        raise TypeError("a bug")

    with pytest.raises(TypeError):
        PreparedInputs(prepare, ["a"])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_only_on_a_terminal() -> None:
    terminal = _Terminal()
    bar = Progress(4, terminal)
    bar.update(2, "/some/dir/page.png")
    bar.close()
    assert terminal.getvalue().startswith("\r[" + "#" * 15 + "-" * 15 + "] 2/4 page.png")
    piped = io.StringIO()
    Progress(4, piped).update(1, "x")
    assert piped.getvalue() == ""


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal for the bar")
def test_an_interrupted_run_ends_the_bars_line_and_leaves_no_worker(work: Path) -> None:
    """Ctrl-C in the middle of a directory: ``edge: interrupted`` on a line of its own (not
    glued to the bar's), exit 130, and every worker retired before the exit."""
    import pty
    import signal

    import psutil

    (work / "slow.toml").write_text(PIPELINE.replace("scale = 2.0", "scale = 2.0\n"
                                                     "delay_s = 0.2"))
    many = work / "many"
    many.mkdir()
    for index in range(40):
        (many / f"{index:02d}.txt").write_text(str(index))
    leader, follower = pty.openpty()  # stderr a terminal: the bar is drawn
    env = {**os.environ, "EDGE_PLUGINS": "echo"}
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_core.cli", "run", "slow.toml", "--input", "many"],
        cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=follower)
    os.close(follower)
    seen = b""
    try:
        while b"] 3/40 " not in seen:  # a few inputs served: the bar is mid-line
            seen += os.read(leader, 4096)
        workers = psutil.Process(process.pid).children(recursive=True)
        assert workers
        process.send_signal(signal.SIGINT)
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal's other end closed: the command is gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert process.wait(timeout=60) == 130
    text = seen.decode()
    assert "\nedge: interrupted" in text, repr(text[-300:])  # its own line
    assert not [w for w in workers if w.is_running() and w.status() != "zombie"]


def test_large_inputs_travel_in_input_buffers_and_repeats_reuse_them(work: Path) -> None:
    count = 70_000  # float32: 280 000 bytes, above the shared-memory threshold (256 KiB)
    values = [np.arange(count, dtype=np.float32) % 97, np.arange(count, dtype=np.float32) % 89]
    for name, numbers in zip(("big1.txt", "big2.txt"), values, strict=True):
        (work / name).write_text(" ".join(str(int(v)) for v in numbers))
    result = edge("run", "pipeline.toml", "--input", "big1.txt", "--input", "big2.txt",
                  "--input", "a.txt", "--repeat", "3", "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    lines = [entry["lines"] for entry in report["results"]]
    assert lines == [(2 * values[0]).tolist(), (2 * values[1]).tolist(), [2.0, 4.0]]
    # one buffer for both large inputs (same name, shape, dtype), each copied in once;
    # their 2 x 3 requests went by reference; the small a.txt went as it was
    assert report["input_buffers"] == {"buffers": 1, "copied": 2, "sent_by_reference": 6}
    small = edge("run", "pipeline.toml", "--input", "a.txt", "--repeat", "2", "--json",
                 cwd=work)
    assert json.loads(small.stdout)["input_buffers"] == {
        "buffers": 0, "copied": 0, "sent_by_reference": 0}
    human = edge("run", "pipeline.toml", "--input", "big1.txt", "--repeat", "2", cwd=work)
    assert human.returncode == 0, human.stderr
    assert "input buffers: 1 tensor(s) copied in once, 2 request(s) sent them by reference" \
        in human.stdout


def test_inputs_of_varying_size_share_one_buffer_per_name(work: Path) -> None:
    sizes = {"big1.txt": 70_000, "big3.txt": 90_000}  # both above the 256 KiB threshold
    for name, count in sizes.items():
        (work / name).write_text(" ".join(["3"] * count))
    result = edge("run", "pipeline.toml", "--input", "big1.txt", "--input", "big3.txt",
                  "--input", "big1.txt", "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [len(entry["lines"]) for entry in report["results"]] == [70_000, 90_000, 70_000]
    # each shape replaced the buffer of the one before: one held at a time, not one per shape
    assert report["input_buffers"] == {"buffers": 1, "copied": 3, "sent_by_reference": 3}
    assert report["ledger_after_close"]["reservations"] == []
