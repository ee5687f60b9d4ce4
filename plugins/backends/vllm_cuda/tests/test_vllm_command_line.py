"""``edge run`` on a generate pipeline, with the real vLLM CPU engine behind it.

stdout carries exactly one JSON document (the engine's log lines go to the worker's log
file); the answer is the generated text, its token ids and the finish reason; and the
worker's handler shuts its engine down cleanly: no task left on its loop, no asyncio
"Task was destroyed but it is pending!", no "output_handler failed" traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from vllm_env import ENGINE_ENV

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DESTROYED = "Task was destroyed but it is pending"


def asyncio_noise(text: str) -> list[str]:
    """Lines of ``text`` that say an asyncio task or coroutine was left unfinished."""
    return [line for line in text.splitlines()
            if DESTROYED in line or "was never awaited" in line
            or "Exception ignored" in line or ("Task" in line and "pending" in line)]


def test_edge_run_json_prints_the_generated_text_and_nothing_else(
    pipeline_file: Any, tmp_path: Path,
) -> None:
    path = pipeline_file("cli")
    env = {k: v for k, v in os.environ.items() if k != "EDGE_WORKER_LOG_DIR"}
    params = {"prompt": "hello", "max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    result = subprocess.run([sys.executable, "-m", "edge_core.cli", "run", str(path),
                             "--params", json.dumps(params), "--json"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)  # the whole of stdout is one JSON document
    answer = report["answer"]
    assert answer["finish_reason"] == "length"
    assert len(answer["token_ids"]) == 6 and all(isinstance(i, int) for i in answer["token_ids"])
    assert isinstance(answer["text"], str) and answer["text"]
    (stage,) = report["plan"]["stages"]
    log = Path(stage["worker"]["log"]).read_text()
    retire = report["closed"]["gen"]["retire"]
    assert retire["verified"] is True and retire["escalation"] == "graceful", retire
    # End to end on the real engine: open, generate, close. The worker left by itself
    # within its declared window (escalation "graceful", no signal needed), its release
    # settled, and its log, which holds the engine's own output, no trace of a task
    # destroyed while pending. (One engine load serves the JSON answer and the clean
    # close: this was two tests, each loading the engine.)
    assert report["closed"]["gen"]["release"] == "released", report["closed"]
    assert "EngineCore" in log
    assert asyncio_noise(log) == [] and asyncio_noise(result.stderr) == []
    assert "asyncio" not in result.stderr and "Traceback" not in result.stderr
    assert "Traceback" not in log


CLOSE = textwrap.dedent('''
    import asyncio, gc, json, sys
    from edge_vllm_cuda.worker import VllmHandler

    def main():
        handler = VllmHandler()
        handler.load({"model": sys.argv[1], "device": "cpu", "dtype": "float32",
                      "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4,
                      "seed": 0})
        handler.warmup({"tokens": 3})
        loop = handler._loop
        handler.close()
        left = len(asyncio.all_tasks(loop))
        closed = loop.is_closed()
        del handler, loop
        gc.collect()
        print(json.dumps({"tasks_left": left, "loop_closed": closed}), flush=True)

    if __name__ == "__main__":
        main()
''')


def test_the_handler_ends_its_engine_tasks_cleanly(
    vllm_python: Path, tiny_model: Path, tmp_path: Path,
) -> None:
    script = tmp_path / "close_engine.py"
    script.write_text(CLOSE)
    src = Path(__file__).resolve().parents[1] / "src"
    contracts = Path(__file__).resolve().parents[4] / "contracts/src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(contracts)]),
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **ENGINE_ENV}
    result = subprocess.run([str(vllm_python), str(script), str(tiny_model)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"tasks_left": 0, "loop_closed": True}
    assert DESTROYED not in output
    assert "output_handler failed" not in output and "Traceback" not in output


def test_on_a_terminal_the_text_streams_before_the_summary(
    pipeline_file: Any, tmp_path: Path,
) -> None:
    import pty

    path = pipeline_file("tty")
    params = {"prompt": "hello", "max_tokens": 5, "temperature": 0.0, "ignore_eos": True}
    primary, secondary = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "edge_core.cli", "run", str(path), "--params",
             json.dumps(params), "--profile", str(tmp_path / "run.json")], cwd=tmp_path,
            stdout=secondary, stderr=subprocess.PIPE)
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal's other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        _, stderr = process.communicate(timeout=600)
    finally:
        os.close(primary)
    assert process.returncode == 0, stderr.decode()[-3000:]
    lines = b"".join(chunks).decode().replace("\r\n", "\n").splitlines()
    answer = json.loads((tmp_path / "run.json").read_text())["answer"]
    assert answer["finish_reason"] == "length" and len(answer["token_ids"]) == 5
    summary = next(i for i, line in enumerate(lines) if line.startswith("pipeline tty"))
    streamed = "\n".join(lines[:summary])  # printed before the plan's summary
    assert streamed.strip() == answer["text"].strip()  # greedy: equal to the timed one
    text = answer["text"].strip()
    assert not text or not any(text in line for line in lines[summary:])  # printed once
