"""Build the page pipeline's bundles: graphs with shape sets, examples per entry, the demo page.

Each stage serves a shape set (``metadata.validation.shapes``, see docs/runtime.md) and
carries, for every entry, example inputs at its minimum, its maximum and one shape
between, each with the outputs of a direct onnxruntime CPU run (the load gate warms up
and checks every one):

========== ======================================= =======================================
stage      served inputs ``x``                     examples (from the demo page)
========== ======================================= =======================================
detect     ``1 x 3 x [32..L/32] x [32..L/32]``     32 x 32, L x L, the page's own input
classify   ``[1..B] x 3 x 48 x 192``               1, B and B/2 of the page's windows
recognize  ``[1..R] x 3 x 48 x [32..1280]``        1 x 32, R x 1280, R/2 x 640
========== ======================================= =======================================

``L`` is the detection limit (960 unless ``--det-limit``; ``/32``: in steps of 32, as the
DB network downsamples by 32), ``B`` the classifier's batch of one call
(:data:`edge_ocr_example.page_pipeline.BATCH`), ``R`` the recogniser's
(:data:`edge_ocr_example.page_pipeline.REC_BATCH` unless ``--rec-batch``; the pipeline
then needs ``EDGE_OCR_REC_BATCH`` at most ``R``). The page glue chooses the rows' widths
within that range (:func:`edge_ocr_example.page_reader.own_width` for one row per call,
320, 640, 960 or 1280 for several, so calls of similar lines batch together); the bundle
is the same for both. The recogniser's graph
ends in its CTC head (:mod:`edge_ocr_example.ctc_head`): each step's best class and its
probability instead of the ``N x T x 6625`` probabilities.

The directory also gets ``pipeline.toml`` (prepare, transforms and finish of
:mod:`edge_ocr_example.page_pipeline`, the quality check
:func:`edge_ocr_example.quality.page_cer` on ``golden.json``; ort-cpu),
``golden.json`` (the golden set: the demo page with its ground truth, shipped with the
package as ``demo_page_truth.json``, and its pass criterion ``cer <= GOLDEN_MAX_CER``),
``pipeline-auto.toml`` (the classifier
with a ``qnn`` candidate on the bundle ``make demo`` derives into ``classify-qnn``, then
``ort-cpu``: :func:`pipeline_auto_toml`; not built here: the command prints what makes it,
:func:`derive_command`, and what to install first where edge-qnn or its derive extra is
missing, :func:`edge_ocr_example.derive_tool.derive_missing`), ``page.png`` (the demo page:
:func:`edge_ocr_example.pages.demo_page`) and ``bundle.json``.

``python -m edge_ocr_example.page_bundle OUT [--det-limit L] [--rec-batch R] [--wheel WHL]``
builds it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnxruntime as ort

from edge_ocr_example.buckets import REC_BEST, REC_CONFIDENCE
from edge_ocr_example.bundle import ManifestWriter, edge_manifest
from edge_ocr_example.bundle_layout import DESCRIPTION, MANIFEST, PIPELINE, graph_name
from edge_ocr_example.chain import STAGES
from edge_ocr_example.ctc_head import with_ctc_head
from edge_ocr_example.decode import CHARACTERS_FILE, character_table
from edge_ocr_example.derive_tool import derive_missing
from edge_ocr_example.errors import OcrError
from edge_ocr_example.line_input import line_row
from edge_ocr_example.models import RAPIDOCR_VERSION, WHEEL_SHA256, read_graph
from edge_ocr_example.npz import save_npz
from edge_ocr_example.page_pipeline import BATCH, REC_BATCH
from edge_ocr_example.page_reader import (
    CLS_ROW,
    REC_HEIGHT,
    classifier_rows,
    find_lines,
    read_page,
)
from edge_ocr_example.page_scale import DET_LIMIT, DET_MULTIPLE, page_input
from edge_ocr_example.pages import demo_page
from edge_ocr_example.reference import PROVIDER, DirectRunner

__all__ = ["ADMISSION", "AUTO_CLASSIFY", "AUTO_DERIVE_NEEDS", "AUTO_FP16_BOUND",
           "AUTO_GATE_TIMEOUT_S", "AUTO_MEASUREMENT", "AUTO_PIPELINE", "GOLDEN",
           "GOLDEN_MAX_CER", "INTRA_OP_THREADS", "PAGE", "REC_MAX", "REC_REPLICAS",
           "PageBuild", "build_page_bundles", "derive_command", "golden_set", "main",
           "pipeline_auto_toml", "pipeline_toml"]

PAGE: Final = "page.png"
"""The demo page in the bundle directory."""
GOLDEN: Final = "golden.json"
"""The golden set in the bundle directory (the pipeline's ``golden``)."""
GOLDEN_MAX_CER: Final = 0.02
"""The golden set's pass criterion: the demo page read with at most 2 % character errors
(the direct onnxruntime run of the same transforms reads it without any)."""
TRUTH: Final = "demo_page_truth.json"
"""The demo page's ground truth, shipped inside the package."""
REC_MAX: Final = 1280
"""Widest recogniser input the bundle serves."""
AUTO_PIPELINE: Final = "pipeline-auto.toml"
"""The page pipeline with a ``qnn`` candidate for the classifier (:func:`pipeline_auto_toml`)."""
AUTO_CLASSIFY: Final = "classify-qnn"
"""Where ``make demo`` writes the classifier's derived static bundle (``edge derive``)."""
AUTO_DERIVE_NEEDS: Final = ("edge derive comes with the edge-qnn plugin: "
                            "pip install 'edge-qnn[derive]'")
"""Where ``edge derive`` comes from: not from the wheels the page pipeline needs (the note
in ``pipeline-auto.toml``; the command's last line says what this environment lacks,
:func:`edge_ocr_example.derive_tool.derive_missing`)."""
AUTO_GATE_TIMEOUT_S: Final = 60.0
"""Bound on the qnn candidate's load and, separately, its warm-up gate (seconds)."""
AUTO_FP16_BOUND: Final = {"max_abs_error": 0.01, "normalised_error": 0.01}
"""The qnn candidate's bound: fp16 on HTP against the fp32 reference (observed 0.0015)."""
AUTO_MEASUREMENT: Final = {"budget_s": 20, "warmup_calls": 0}
"""``pipeline-auto.toml``'s ``[measurement]``: the classifier's candidates are raced on
the page within 20 s, unwarmed (their gates ran every bucket already). On the simulator
one page through the chain takes about 15 s with ``qnn`` classifying: its first sample
(every entrant gets one) spends most of the budget, the CPU's samples the rest, and a
second simulator sample would only say again that it is over twenty times slower (45 s
bought that second sample and made ``make demo``'s last step 15 s longer)."""
ADMISSION: Final = 3
"""Pages ``pipeline.toml`` admits at once: one page's detection overlaps others'
recognition, and ``edge serve``'s queue keeps the places filled. With
:data:`REC_REPLICAS`, :data:`INTRA_OP_THREADS` and ``REC_BATCH`` 1, the best of the
configurations ``benchmarks/ocr_throughput.py --sweep`` measured on the 2-vCPU machine at
one and at four clients, and the fewest CPU seconds per page (benchmarks/RESULTS.md,
``ocr_throughput``; docs/config.md)."""
INTRA_OP_THREADS: Final[int | None] = 1
"""ONNX Runtime intra-op threads of every ort-cpu worker in ``pipeline.toml`` (None: ORT's
default, one per core): with four workers on two cores, one each leaves the cores to the
stages running at once instead of contending for them."""
REC_REPLICAS: Final = 2
"""Recogniser workers in ``pipeline.toml``: the recogniser is most of a page, and a
page's lines fan out over both."""
_MODULE: Final = "edge_ocr_example.page_pipeline"
_DEMANDS: Final = {"detect": "416 MiB", "classify": "96 MiB", "recognize": "448 MiB"}
"""RAM reserved per stage worker: its peak plus a quarter, rounded up to 32 MiB. The peaks
(the worker tree's peak resident set: load, the warm-up of every declared shape up to
960 x 960 and 4 x 1280, and 13 varied pages served: ``benchmarks/memory.py``'s
``stage_peak_mib`` for the default settings on the 2-vCPU machine, benchmarks/RESULTS.md)
were detect 331 MiB, classify 69 MiB, recognise 333 MiB. The other settings that run
measures reach at most detect 376 MiB (no arena) and recognise 366 MiB (arena growing by
what is requested): still within."""


@dataclass(frozen=True)
class PageBuild:
    """What :func:`build_page_bundles` wrote."""

    root: Path
    """The bundle directory."""
    shapes: Mapping[str, list[dict[str, Any]]]
    """Stage id -> its declared shape set (with example members)."""
    text: tuple[str, ...]
    """The demo page read by the direct run, in reading order."""


def _entry(name: str, dims: list[Any]) -> dict[str, Any]:
    return {"name": name, "inputs": {"x": {"dtype": "float32", "dims": dims}}}


def _examples(stage: str, det: np.ndarray, lines_rows: np.ndarray, crops: list[np.ndarray],
              limit: int, rec_batch: int = REC_BATCH,
              ) -> list[tuple[dict[str, Any], list[np.ndarray]]]:
    """The shape-set entries of one stage and the example input arrays of each."""
    if stage == "detect":
        biggest = np.ones((1, 3, limit, limit), np.float32)  # white paper around the page
        biggest[:, :, : det.shape[2], : det.shape[3]] = det[:, :, :limit, :limit]
        smallest = np.ascontiguousarray(det[:, :, :DET_MULTIPLE, :DET_MULTIPLE])
        side = [DET_MULTIPLE, limit, DET_MULTIPLE]  # multiples of 32 up to the limit
        dims = [1, 3, side, side]
        return [(_entry("page", dims), [smallest, biggest, det])]
    if stage == "classify":
        rows = lines_rows
        picks = [rows[:1], rows[:BATCH], rows[: max(2, BATCH // 2)]]
        return [(_entry("rows", [[1, BATCH], 3, *CLS_ROW]), picks)]
    widths = [DET_MULTIPLE, REC_MAX, REC_MAX // 2]
    counts = [1, rec_batch, max(1, rec_batch // 2)]
    picks = [np.stack([line_row(crops[i % len(crops)], REC_HEIGHT, w) for i in range(n)])
             for w, n in zip(widths, counts, strict=True)]
    batches: Any = [1, rec_batch] if rec_batch > 1 else 1
    return [(_entry("pieces", [batches, 3, REC_HEIGHT, [DET_MULTIPLE, REC_MAX]]), picks)]


def _metadata(stage_id: str, producer: str, shapes: list[dict[str, Any]]) -> dict[str, Any]:
    stage = next(spec for spec in STAGES if spec.id == stage_id)
    first = shapes[0]["examples"][-1]  # the demo page's own input (detect), mid-sized rows
    validation: dict[str, Any] = {
        "shapes": shapes,
        "expected_outputs": first["expected_outputs"],
        "reference": f"onnxruntime {ort.__version__} {PROVIDER}",
        "session_options": "defaults (graph optimisation level ORT_ENABLE_ALL)",
        "comparison": "exact (bit for bit)",
    }
    if stage_id == "recognize":
        validation["characters"] = CHARACTERS_FILE
    revision = (f"rapidocr-onnxruntime=={RAPIDOCR_VERSION} (wheel sha256:{WHEEL_SHA256}) "
                f"{stage.graph_member}")
    if stage_id == "recognize":
        revision += f" with a CTC head ({REC_BEST}, {REC_CONFIDENCE}: edge_ocr_example.ctc_head)"
    return {
        "component": f"ocr-page-{stage_id}",
        "graph": graph_name(stage),
        "example_inputs": first["example_inputs"],
        "expected_outputs": first["expected_outputs"],
        "checkpoint_revision": revision,
        "precision": "float32",
        "layout": "NCHW",
        "exporter": producer or "unrecorded in the graph",
        "calibration": None,
        "validation": validation,
    }


def pipeline_toml(backend: str = "ort-cpu", target: str = PROVIDER) -> str:
    """The page pipeline's file, for the bundles it sits beside.

    It admits :data:`ADMISSION` pages at once and runs the recogniser in
    :data:`REC_REPLICAS` workers; every ort-cpu worker runs :data:`INTRA_OP_THREADS`
    intra-op threads, and the recogniser takes ``REC_BATCH`` rows a call
    (:data:`edge_ocr_example.page_pipeline.REC_BATCH`).
    """
    transforms = {"classify": f"{_MODULE}:detect_to_classify",
                  "recognize": f"{_MODULE}:classify_to_recognize"}
    lines = ['name = "ocr-page"', f"admission = {ADMISSION}", f'prepare = "{_MODULE}:prepare"',
             f'finish = "{_MODULE}:finish"', 'quality = "edge_ocr_example.quality:page_cer"',
             f'golden = "{GOLDEN}"', ""]
    for stage in STAGES:
        lines += ["[[stages]]", f'id = "{stage.id}"', f'manifest = "{stage.id}/{MANIFEST}"']
        if stage.id == "recognize" and REC_REPLICAS > 1:
            lines.append(f"replicas = {REC_REPLICAS}")
        if stage.id in transforms:
            lines.append(f'input_transform = "{transforms[stage.id]}"')
        lines += ["", "[stages.resources]",
                  f'demands = {{ "machine:ram" = "{_DEMANDS[stage.id]}" }}',
                  "", "[stages.backend]", f'name = "{backend}"']
        if backend == "ort-cpu" and INTRA_OP_THREADS is not None:
            lines.append(f"options = {{ intra_op_threads = {INTRA_OP_THREADS} }}")
        lines += ["", "[stages.placement]",
                  f'target = "{target}"', "min_fraction_on_target = 1.0", ""]
    return "\n".join(lines)


def pipeline_auto_toml(gate_timeout_s: float = AUTO_GATE_TIMEOUT_S) -> str:
    """``pipeline-auto.toml``: the page pipeline with candidates for the classifier.

    The classifier lists ``qnn`` (the HTP simulator on x86_64) with its derived bundle
    ``classify-qnn`` (``edge derive qnn-static classify --bucket 4x3x48x192``: one static
    bucket of ``BATCH`` rows, run in fp16 within a declared bound, its load and warm-up
    each bounded by ``gate_timeout_s``) before ``ort-cpu`` with the plain bundle; every
    call is padded to ``BATCH`` rows (the simulator's cost is per call, not per row).
    Which one serves is measured (the default ``selection``) on what ``edge run --input``
    reads, within :data:`AUTO_MEASUREMENT`. Detection and recognition stay on
    ``ort-cpu`` (on the simulator they take 19.5 and 58 s per run:
    plugins/backends/qnn/README.md).
    """
    plain = pipeline_toml()
    start = plain.index('[[stages]]\nid = "classify"')
    end = plain.index("[[stages]]", start + 1)
    bound = ", ".join(f"{k} = {v}" for k, v in AUTO_FP16_BOUND.items())
    classify = "\n".join([
        "[[stages]]", 'id = "classify"', f'manifest = "classify/{MANIFEST}"',
        f'input_transform = "{_MODULE}:detect_to_classify_padded"', "",
        "[stages.resources]", f'demands = {{ "machine:ram" = "{_DEMANDS["classify"]}" }}', "",
        "[[stages.candidates]]", f'manifest = "{AUTO_CLASSIFY}/{MANIFEST}"',
        'backend = { name = "qnn", options = { fp16_precision = true, soc_model = 60, '
        f"gate_timeout_s = {gate_timeout_s}, numerics_bound = {{ {bound} }} }} }}",
        'placement = { target = "QNNExecutionProvider", min_fraction_on_target = 1.0 }',
        'resources = { demands = { "machine:ram" = "512 MiB" } }', "",
        "[[stages.candidates]]", 'backend = { name = "ort-cpu" }',
        f'placement = {{ target = "{PROVIDER}", min_fraction_on_target = 1.0 }}', "", ""])
    measurement = "\n".join(["[measurement]"] + [f"{key} = {value}" for key, value
                                                   in AUTO_MEASUREMENT.items()] + ["", ""])
    head = plain[:start].replace('name = "ocr-page"', 'name = "ocr-page-auto"', 1)
    first = head.index("[[stages]]")  # the table after the top-level keys
    needs = "".join(f"# {line}\n" for line in (
        f"Needs {AUTO_CLASSIFY}/ beside this file: a static copy of the classifier for QNN,",
        "which python -m edge_ocr_example.page_bundle does not build. From this folder:",
        f"  {derive_command(Path())}",
        f"({AUTO_DERIVE_NEEDS}; make demo runs it.)"))
    return needs + head[:first] + measurement + head[first:] + classify + plain[end:]


def derive_command(out: Path) -> str:
    """The ``edge derive`` command that makes ``pipeline-auto.toml``'s ``classify-qnn``.

    ``out`` is the bundle directory (``Path()``: the command as run from inside it): the
    classifier's bundle ``out/classify`` made static at one bucket of ``BATCH`` rows
    into ``out/classify-qnn``, as ``make demo`` runs it.
    """
    bucket = "x".join(str(n) for n in (BATCH, 3, *CLS_ROW))
    return (f"edge derive qnn-static {out / 'classify'} --bucket {bucket} "
            f"--out {out / AUTO_CLASSIFY}")


def golden_set(drawn: tuple[str, ...]) -> dict[str, Any]:
    """The golden set file: the demo page with the shipped truth, and its pass criterion.

    Raises:
        OcrError: the page as drawn now does not carry the shipped truth's text.
    """
    from importlib.resources import files

    truth = json.loads(files("edge_ocr_example").joinpath(TRUTH).read_text(encoding="utf-8"))
    if list(drawn) != truth["lines"]:
        raise OcrError("golden", f"the demo page no longer draws the text of {TRUTH}",
                       list(drawn))
    return {"schema": "edge.golden/1",
            "description": f"{truth['page']}; read through the whole pipeline, scored by "
                           "page CER (edge_ocr_example.quality)",
            "passes": [f"cer <= {GOLDEN_MAX_CER}"],
            "items": [{"name": "demo-page", "input": PAGE, "truth": truth["lines"]}]}


def _clear(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OcrError("out", "exists and is not a directory", str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / DESCRIPTION).is_file():
        raise OcrError("out", f"non-empty directory without {DESCRIPTION}; refusing to mix",
                       str(out))
    out.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        shutil.rmtree(out / stage.id, ignore_errors=True)
    shutil.rmtree(out / AUTO_CLASSIFY, ignore_errors=True)  # derived from the old classify


def build_page_bundles(
    out: Path,
    *,
    limit: int = DET_LIMIT,
    rec_batch: int = REC_BATCH,
    wheel: Path | None = None,
    cache_dir: Path | None = None,
    write_manifest: ManifestWriter | None = edge_manifest,
) -> PageBuild:
    """Write the page pipeline's three bundles, ``pipeline.toml`` and the demo page.

    ``rec_batch`` is the most rows the recogniser's bundle serves in one call.

    Raises:
        OcrError: ``out`` is unusable, the limit is not a multiple of 32, the recogniser's
            batch is below 1, the graphs cannot be obtained, or the demo page reads no text.

    """
    if limit < DET_MULTIPLE or limit % DET_MULTIPLE:
        raise OcrError("det_limit", f"must be a multiple of {DET_MULTIPLE}", limit)
    if rec_batch < 1:
        raise OcrError("rec_batch", "must be at least 1", rec_batch)
    graphs = {s.id: read_graph(s.graph_member, wheel=wheel, cache_dir=cache_dir) for s in STAGES}
    graphs["recognize"] = with_ctc_head(graphs["recognize"])
    runner = DirectRunner(graphs)
    dictionary = runner.metadata("recognize", "character")
    if not dictionary:
        raise OcrError("recognize.metadata['character']", "no dictionary in the graph", None)
    characters = character_table(dictionary.split("\n"))
    image, drawn = demo_page()
    golden = golden_set(drawn)
    pixels = np.asarray(image)
    text = tuple(line.text for line in read_page(pixels, runner, characters=characters,
                                                 limit=limit, batch=BATCH))
    if not text:
        raise OcrError("page", "no text recognised on the demo page", pixels.shape)
    det, frame = page_input(pixels, limit=limit)
    prob = runner("detect", {"x": det})["sigmoid_0.tmp_0"]
    lines = find_lines(prob[0, 0], frame, pixels)
    cls_rows, _ = classifier_rows(lines)
    _clear(out)
    image.save(out / PAGE)
    shapes: dict[str, list[dict[str, Any]]] = {}
    for stage in STAGES:
        folder = out / stage.id
        (folder / "examples").mkdir(parents=True)
        (folder / graph_name(stage)).write_bytes(graphs[stage.id])
        declared: list[dict[str, Any]] = []
        crops = [line.crop for line in lines]
        for entry, arrays in _examples(stage.id, det, cls_rows, crops, limit, rec_batch):
            examples = []
            for number, array in enumerate(arrays):
                stem = f"examples/{entry['name']}-{number}"
                save_npz(folder / f"{stem}.npz", {"x": array})
                save_npz(folder / f"{stem}.expected.npz", runner(stage.id, {"x": array}))
                examples.append({"example_inputs": f"{stem}.npz",
                                 "expected_outputs": f"{stem}.expected.npz"})
            declared.append({**entry, "examples": examples})
        if stage.id == "recognize":
            (folder / CHARACTERS_FILE).write_bytes(dictionary.encode("utf-8"))
        shapes[stage.id] = declared
        if write_manifest is not None:
            write_manifest(folder, _metadata(stage.id, runner.producer(stage.id), declared))
    description = {"pipeline": "ocr-page", "det_limit": limit, "batch": BATCH,
                   "rec_batch": rec_batch,
                   "shapes": shapes, "example_text": list(text)}
    (out / DESCRIPTION).write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
    (out / GOLDEN).write_text(json.dumps(golden, indent=1) + "\n")
    (out / PIPELINE).write_text(pipeline_toml())
    (out / AUTO_PIPELINE).write_text(pipeline_auto_toml())
    return PageBuild(out, shapes, text)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the page bundles and print the demo page's text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="bundle directory to write")
    parser.add_argument("--det-limit", type=int, default=DET_LIMIT,
                        help="longest side of the detection input (a multiple of 32)")
    parser.add_argument("--rec-batch", type=int, default=REC_BATCH,
                        help="most rows the recogniser's bundle serves in one call "
                        f"(default {REC_BATCH}; the pipeline's EDGE_OCR_REC_BATCH must not "
                        "exceed it)")
    parser.add_argument("--wheel", type=Path, help="a local rapidocr-onnxruntime wheel")
    parser.add_argument("--cache", type=Path, help="where to download the wheel to")
    args = parser.parse_args(argv)
    try:
        result = build_page_bundles(args.out, limit=args.det_limit, rec_batch=args.rec_batch,
                                    wheel=args.wheel, cache_dir=args.cache)
    except (OcrError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for stage, declared in result.shapes.items():
        served = " | ".join(f"{e['name']} x{e['inputs']['x']['dims']}" for e in declared)
        print(f"{stage}: {args.out / stage} serves {served}")
    print(f"demo page {args.out / PAGE}:")
    for line in result.text:
        print(f"  {line}")
    print(f"ready: edge run {args.out / PIPELINE} --input {args.out / PAGE}")
    missing = derive_missing()  # edge derive's distributions, read from their metadata
    step = (f"run {derive_command(args.out)} (edge-qnn and its derive extra are installed)"
            if missing is None else f"{derive_command(args.out)} ({missing})")
    print(f"not ready: {args.out / AUTO_PIPELINE} needs {args.out / AUTO_CLASSIFY}, which "
          f"this command does not build: {step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
