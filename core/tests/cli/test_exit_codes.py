"""The documented exit codes of ``edge``, end to end in subprocesses on the echo backend.

2 with one line and no traceback for usage, input and configuration errors (the
traceback only with ``--debug`` or ``EDGE_DEBUG=1``); every configuration problem named
at once; output to a closed pipe ends quietly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_core.cli.common import warn_named_plugins
from edge_core.discovery import plugin_errors

from .conftest import echo_pipeline

PIPELINE = echo_pipeline("one")


def edge(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    full.update({"EDGE_PLUGINS": "echo", **env})
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def test_an_unreadable_input_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE)
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    result = edge("run", "p.toml", "--inputs", "bad.npz", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "--inputs" in line]
    assert errors == [errors[0]]
    assert errors[0].startswith("edge: --inputs bad.npz: not an .npz archive")
    assert result.stdout == ""


def test_debug_and_edge_debug_add_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE)
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    flagged = edge("run", "p.toml", "--inputs", "bad.npz", "--debug", cwd=tmp_path)
    assert flagged.returncode == 2
    assert "Traceback (most recent call last)" in flagged.stderr
    from_env = edge("run", "p.toml", "--inputs", "bad.npz", cwd=tmp_path, EDGE_DEBUG="1")
    assert from_env.returncode == 2
    assert "Traceback (most recent call last)" in from_env.stderr


def test_every_configuration_problem_is_named_at_once(tmp_path: Path) -> None:
    bad = PIPELINE.replace("scale = 2.0", "scale = 2.0\ndelay_ss = 1.0\ndelay_s = -1.0\n"
                           "allocate_mb = -3")
    (tmp_path / "p.toml").write_text(bad)
    result = edge("run", "p.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("edge: p.toml: 3 configuration problems: ")
    for path in ("stages[0].backend.options.delay_ss", "stages[0].backend.options.delay_s",
                 "stages[0].backend.options.allocate_mb"):
        assert f"{path} (stage 'a'):" in line, path  # the file's path, the stage's id
    as_json = edge("run", "p.toml", "--json", cwd=tmp_path)
    assert as_json.returncode == 2
    assert len(json.loads(as_json.stdout)["problems"]) == 3


#: Two stages, the second's input transform building a ``Fanout`` wrong (a ``ConfigError``).
TRANSFORM_FAILS = PIPELINE + """
[[stages]]
id = "b"
input_transform = "edge_echo.transforms:bad_fanout"
[stages.backend]
name = "echo"
"""


def test_a_transform_that_raises_config_error_exits_1_naming_it_not_2(tmp_path: Path) -> None:
    """The file and the input are good; the pipeline's transform failed on a request. Its
    ``ConfigError`` was reported as a configuration problem (exit 2, the message naming
    ``Fanout.items[0]`` only): it is the request's failure now, ``TransformFailed`` naming
    the stage's transform and the error (exit 1)."""
    (tmp_path / "p.toml").write_text(TRANSFORM_FAILS)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 2), np.float32))
    result = edge("run", "p.toml", "--inputs", "in.npz", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "Fanout" in line]
    assert line.startswith(
        "edge: TransformFailed: pipelines[one].stages[b].input_transform: transform "
        "edge_echo.transforms:bad_fanout raised ConfigError: Fanout.items[0]: must be a "
        "mapping of inputs: 'ndarray'; health: stage a: ready"), line
    as_json = edge("run", "p.toml", "--inputs", "in.npz", "--json", cwd=tmp_path)
    assert as_json.returncode == 1, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["ok"] is False and "problems" not in body  # not a configuration problem
    assert body["error"].startswith("TransformFailed: pipelines[one].stages[b]")


#: Two stages, the second's input transform building an array no stage can be sent.
OUTPUT_REFUSED = TRANSFORM_FAILS.replace("edge_echo.transforms:bad_fanout",
                                         "edge_echo.transforms:unsendable")


def test_a_stage_refusing_what_its_transform_built_exits_1_naming_both_not_2(
        tmp_path: Path) -> None:
    """The file and the input are good; stage ``b`` refused the inputs its transform built
    (an array of objects, ``InvalidValue`` naming ``inputs.x.dtype``). That was reported
    as the input's problem (exit 2, naming ``inputs.x.dtype`` only, as if ``in.npz`` held
    it): it is the request's failure now, ``TransformOutputRefused`` naming the stage,
    the transform and the refusal (exit 1)."""
    (tmp_path / "p.toml").write_text(OUTPUT_REFUSED)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 2), np.float32))
    result = edge("run", "p.toml", "--inputs", "in.npz", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "inputs.x.dtype" in line]
    assert line.startswith(
        "edge: TransformOutputRefused: pipelines[one].stages[b].input_transform: stage 'b' "
        "refused the inputs transform edge_echo.transforms:unsendable returned "
        "(InvalidValue): inputs.x.dtype: unsupported dtype "), line
    assert "; health: stage a: ready" in line
    as_json = edge("run", "p.toml", "--inputs", "in.npz", "--json", cwd=tmp_path)
    assert as_json.returncode == 1, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["ok"] is False and "problems" not in body  # not the input's problem
    assert body["error"].startswith("TransformOutputRefused: pipelines[one].stages[b]")


#: The warnings for the two named plugins of the tests below that do not load.
NAMED_WARNINGS = [
    "edge: warning: plugin 'no-such-entry-point' (named by EDGE_PLUGINS) did not load: "
    "not installed: no installed distribution has an entry point 'no-such-entry-point' "
    "in group 'edge'",
    "edge: warning: plugin 'no_such_edge_plugin' (named by a configuration's plugins) did "
    "not load: import failed: ModuleNotFoundError: No module named 'no_such_edge_plugin'"]


def test_a_named_plugin_that_does_not_load_warns_and_is_fatal_only_when_strict(
        tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('plugins = ["no_such_edge_plugin"]\n' + PIPELINE)
    result = edge("plan", "p.toml", "--probe-only", "--json", cwd=tmp_path,
                  EDGE_PLUGINS="echo,no-such-entry-point")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ok"] is True
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == NAMED_WARNINGS
    strict = edge("plan", "p.toml", "--probe-only", cwd=tmp_path, EDGE_STRICT_PLUGINS="1")
    assert strict.returncode == 3
    assert "no_such_edge_plugin" in strict.stderr


#: What ``--json`` lists for the two named plugins of the test below that do not load.
NAMED_FAILURES = [
    {"plugin": "no-such-entry-point", "named_by": "EDGE_PLUGINS",
     "error": "not installed: no installed distribution has an entry point "
              "'no-such-entry-point' in group 'edge'"},
    {"plugin": "no_such_edge_plugin", "named_by": "configuration",
     "error": "import failed: ModuleNotFoundError: No module named 'no_such_edge_plugin'"},
]


#: A profile as short as it can be (one request, one level, one process start).
QUICK_PROFILE = ["--requests", "1", "--warmup", "0", "--concurrency", "1",
                 "--process-starts", "1", "--out", "p.json"]


def test_plan_run_and_profile_json_list_the_plugins_that_did_not_load(tmp_path: Path) -> None:
    """``plugin_errors`` as edge probe --json lists them, with who named each one."""
    (tmp_path / "p.toml").write_text('plugins = ["no_such_edge_plugin"]\n' + PIPELINE)
    (tmp_path / "clean.toml").write_text(PIPELINE)
    (tmp_path / "x.npz").write_bytes(b"not a zip file")
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    named = {"EDGE_PLUGINS": "echo,no-such-entry-point"}
    for argv in (["plan", "p.toml", "--probe-only"], ["plan", "p.toml"],
                 ["run", "p.toml", "--inputs", "in.npz"],
                 ["profile", "p.toml", "--inputs", "in.npz", *QUICK_PROFILE]):
        result = edge(*argv, "--json", cwd=tmp_path, **named)
        assert result.returncode == 0, result.stderr
        body = json.loads(result.stdout)
        assert body["ok"] is True and body["plugin_errors"] == NAMED_FAILURES, argv
        clean = edge(*argv[:1], "clean.toml", *argv[2:], "--json", cwd=tmp_path)
        assert json.loads(clean.stdout)["plugin_errors"] == [], argv  # none failed
    # a failure carries them too (exit code and error unchanged): after the file was
    # checked, and when the file itself is refused (warned about on stderr there too)
    (tmp_path / "bad.toml").write_text('plugins = ["no_such_edge_plugin"]\n' + PIPELINE
                                       + "delay_s = -1.0\n")
    for argv in (["run", "p.toml", "--inputs", "x.npz"],
                 ["profile", "p.toml", "--inputs", "x.npz"],
                 ["profile", "p.toml", "--input", "in.npz"],  # no prepare to read it
                 ["plan", "bad.toml", "--probe-only"], ["run", "bad.toml"],
                 ["profile", "bad.toml"]):
        result = edge(*argv, "--json", cwd=tmp_path, **named)
        assert result.returncode == 2, result.stderr
        body = json.loads(result.stdout)
        assert body["ok"] is False and body["plugin_errors"] == NAMED_FAILURES, argv
        warnings = [line for line in result.stderr.splitlines() if "warning" in line]
        assert warnings == NAMED_WARNINGS, argv
        if "bad.toml" in argv:
            assert "stages[0].backend.options.delay_s" in body["error"]
    # an --input that cannot be read is refused before the file is read: no plugin was
    # loaded then, so its document has no plugin_errors (docs/cli.md: "once the pipeline
    # file is read")
    result = edge("plan", "p.toml", "--input", "missing.npz", "--json", cwd=tmp_path, **named)
    assert result.returncode == 2, result.stderr
    body = json.loads(result.stdout)
    assert body["ok"] is False and "plugin_errors" not in body
    assert body["error"].startswith("--input missing.npz: ")


def test_the_profile_files_list_the_plugins_that_did_not_load(tmp_path: Path) -> None:
    """``plugin_errors`` in what ``edge profile --out`` writes, as in ``edge run --profile``'s.

    Same key, same shape as the commands' ``--json``; in a failed run's profile too (it is
    written either way), and an empty list when every plugin loaded.
    """
    (tmp_path / "p.toml").write_text('plugins = ["no_such_edge_plugin"]\n' + PIPELINE)
    (tmp_path / "clean.toml").write_text(PIPELINE)
    (tmp_path / "fails.toml").write_text('plugins = ["no_such_edge_plugin"]\n' + PIPELINE
                                         + 'fail_at = "load"\n')
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    named = {"EDGE_PLUGINS": "echo,no-such-entry-point"}
    for pipeline, env, code, listed in (("p.toml", named, 0, NAMED_FAILURES),
                                        ("clean.toml", {}, 0, []),
                                        ("fails.toml", named, 1, NAMED_FAILURES)):
        for argv, written in ((["run", pipeline, "--inputs", "in.npz", "--profile", "r.json"],
                               "r.json"),
                              (["profile", pipeline, "--inputs", "in.npz", *QUICK_PROFILE],
                               "p.json")):
            (tmp_path / written).unlink(missing_ok=True)
            result = edge(*argv, cwd=tmp_path, **env)
            assert result.returncode == code, (argv, result.stderr)
            if argv[0] == "run" and code:
                continue  # a run whose pipeline does not open writes no profile
            profile = json.loads((tmp_path / written).read_text(encoding="utf-8"))
            assert profile["plugin_errors"] == listed, argv


def test_a_failed_plugin_nobody_named_is_listed_but_not_warned_about(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [{"name": "broken", "source": "entry-point", "error": "import failed: X"},
            {"name": "mine", "source": "config", "error": "import failed: Y"},
            {"name": "fine", "source": "entry-point", "error": None}]
    monkeypatch.delenv("EDGE_PLUGINS", raising=False)
    assert plugin_errors(rows) == [
        {"plugin": "broken", "error": "import failed: X", "named_by": None},
        {"plugin": "mine", "error": "import failed: Y", "named_by": "configuration"}]
    assert warn_named_plugins(rows) == [
        "warning: plugin 'mine' (named by a configuration's plugins) did not load: "
        "import failed: Y"]
    assert capsys.readouterr().err.count("warning") == 1
    monkeypatch.setenv("EDGE_PLUGINS", "broken,mine")
    assert [f["named_by"] for f in plugin_errors(rows)] == ["EDGE_PLUGINS", "configuration"]


def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    env = {**os.environ, "EDGE_PLUGINS": "echo"}
    for argv in (["plugins", "--json"], ["probe", "--json"], ["plugins"]):
        process = subprocess.Popen([sys.executable, "-m", "edge_core.cli", *argv], cwd=tmp_path,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the first line is written
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=120) == 0, stderr
        assert stderr == "", stderr


def test_a_usage_error_exits_2(tmp_path: Path) -> None:
    result = edge("run", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_debug_prints_the_traceback_of_an_unexpected_error_a_command_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Raised by the command itself, not wrapped on the way: --debug still shows where."""
    from edge_core import cli
    from edge_core.cli import cleanup_cmd

    def broken(args: object) -> int:
        raise RuntimeError("a bug in the command")

    monkeypatch.setattr(cleanup_cmd, "run", broken)
    monkeypatch.delenv("EDGE_DEBUG", raising=False)
    assert cli.main(["cleanup"]) == 1
    quiet = capsys.readouterr().err
    assert quiet == ("edge: internal error: RuntimeError: a bug in the command (--debug or "
                     "EDGE_DEBUG=1 prints the traceback)\n")
    assert cli.main(["cleanup", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err, err
    assert 'raise RuntimeError("a bug in the command")' in err, err
    assert err.endswith(quiet)


def test_the_table_names_the_commands_that_load_no_plugin_for_exit_3() -> None:
    """docs/cli.md's exit 3 row names exactly the commands ``EDGE_STRICT_PLUGINS`` spares.

    Before, the row said exit 3 for any command, while ``edge manifest``, ``qualify``,
    ``matrix`` and ``cleanup`` never load a plugin (exit 0/1/2 with a broken one):
    core/tests/plugins/test_loading.py runs them under ``EDGE_STRICT_PLUGINS=1``.
    """
    import re

    from edge_core.cli import BUILTIN_COMMANDS, PLUGIN_FREE_COMMANDS

    page = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text("utf-8")
    (row,) = [line for line in page.splitlines() if line.startswith("| 3 |")]
    assert "EDGE_STRICT_PLUGINS=1" in row
    spared = re.findall(r"`edge ([a-z]+)`", row)
    assert spared == list(PLUGIN_FREE_COMMANDS)
    assert set(spared) < set(BUILTIN_COMMANDS)
