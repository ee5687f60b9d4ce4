"""The one ``edge serve`` process the generate tests share, and its pipeline files.

Starting vLLM takes tens of seconds (minutes on a loaded 2-core machine), so every test
of the OpenAI routes uses one server holding three pipelines loaded together:

* ``ocr`` — the PP-OCRv4 page pipeline (three ort-cpu stages, ``prepare`` and ``finish``);
* ``tiny`` — one generate stage: the tiny local Llama on the real vLLM CPU engine
  (context 256 tokens);
* ``page-chat`` — the OCR stages, then the same model, fed by the transform ``page_chat``;
  its generate stage restarts on failure.

:class:`SharedServer` starts it on first use and hands the same one to every module; a
test that stops it (the shutdown test) gets the checked closing summary back, and a
later test that asks for it again gets a fresh one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import httpx
from serving import Served, start

sys.path.insert(0, str(Path(__file__).parents[3] / "backends" / "vllm_cuda" / "tests"))

from vllm_env import build_tiny_model, ensure_env, route_env_table

API_KEY = "vllm-test-key"
GRACE_S = 0.25
"""The server's ``--grace``: the shutdown test's streams outlast it."""
MAX_MODEL_LEN = 256
ABORT_PROBES = 10
"""How many 2-token requests :func:`engine_unfinished_after_abort` sends at most."""


def _generate_stage(python: Path, model: Path, *, max_num_seqs: int) -> str:
    return f'''
[stages.backend]
name = "vllm-cuda"

[stages.backend.options]
model = "{model}"
device = "cpu"
dtype = "float32"
max_model_len = {MAX_MODEL_LEN}
enforce_eager = true
max_num_seqs = {max_num_seqs}

[stages.backend.route]
name = "vllm-cpu"
interpreter = "{python}"

{route_env_table()}'''


def write_pipelines(folder: Path, ocr_dir: Path) -> tuple[Path, Path, list[Path]]:
    """The vLLM environment's interpreter, the tiny model, and the three pipeline files."""
    python = ensure_env()
    model = build_tiny_model(python, folder / "tiny-llama")
    tiny = folder / "tiny.toml"
    tiny.write_text('name = "tiny"\nadmission = 8\n\n[[stages]]\nid = "gen"\n'
                    + _generate_stage(python, model, max_num_seqs=8))
    ocr = (ocr_dir / "pipeline.toml").read_text()
    page_chat = ocr_dir / "page-chat.toml"  # next to the bundles its stages name
    page_chat.write_text(ocr.replace('name = "ocr"\n', 'name = "page-chat"\nadmission = 2\n', 1)
                         + '\n[[stages]]\nid = "gen"\n'
                         'input_transform = "edge_ocr_example.prompt:page_chat"\n'
                         'restart = "on-failure"\n'  # the worker-lost test's stage restarts
                         + _generate_stage(python, model, max_num_seqs=8))
    return python, model, [ocr_dir / "pipeline.toml", tiny, page_chat]


class SharedServer:
    """The shared server, started on first use.

    Args:
        build: Builds the vLLM environment, the model and the pipeline files
            (:func:`write_pipelines`; called once, on first use).
    """

    def __init__(self, build: Callable[[], tuple[Path, Path, list[Path]]]) -> None:
        self._build = build
        self._built: tuple[Path, Path, list[Path]] | None = None
        self._served: Served | None = None

    def _files(self) -> tuple[Path, Path, list[Path]]:
        if self._built is None:
            self._built = self._build()
        return self._built

    @property
    def python(self) -> Path:
        """The vLLM environment's interpreter."""
        return self._files()[0]

    @property
    def model(self) -> Path:
        """The tiny model's directory."""
        return self._files()[1]

    def get(self) -> Served:
        """The running server (a fresh one when the last was stopped)."""
        if self._served is None or self._served.stopped:
            self._served = start(self._files()[2], "--api-key", API_KEY, "--grace",
                                 str(GRACE_S), start_timeout_s=900.0)
        return self._served

    def stop(self) -> Served | None:
        """Stop the server and check its shutdown (see :meth:`Served.stop`); it, or None."""
        served, self._served = self._served, None
        if served is not None:
            served.stop(stop_timeout_s=120.0)
        return served


def engine_unfinished(server: Served) -> int:
    """How many requests tiny's engine still held when a request of 2 tokens finished."""
    answer = httpx.post(f"{server.url}/v1/completions", timeout=300,
                        headers={"Authorization": f"Bearer {API_KEY}"},
                        json={"model": "tiny", "prompt": "next", "max_tokens": 2,
                              "ignore_eos": True, "temperature": 0.0})
    answer.raise_for_status()
    return int(answer.json()["edge"]["engine_unfinished"])


def engine_unfinished_after_abort(server: Served) -> list[int]:
    """How many requests tiny's engine held after each probe, until one finds it empty.

    The server answers a client that left (or whose deadline passed) at once and cancels
    its request off the event loop, so the worker may abort it in the engine a moment
    after the next request was sent. Each probe (:func:`engine_unfinished`) is at most 2
    engine steps: the engine must hold nothing within :data:`ABORT_PROBES` of them, at
    most 20 steps, fewer than the aborted requests of these tests mostly had left to
    generate. The last count is 0 when the engine let it go.
    """
    seen: list[int] = []
    for _ in range(ABORT_PROBES):
        seen.append(engine_unfinished(server))
        if seen[-1] == 0:
            break
    return seen
