"""PP-OCRv4 text detection, direction classification and recognition as an edge pipeline.

Model-owned pieces only; the edge runtime wires them:

* :mod:`~edge_ocr_example.buckets` - the fixed input shape of every stage, tensor names;
* :mod:`~edge_ocr_example.make_image` - a deterministic page of rendered text;
* :mod:`~edge_ocr_example.preprocess` - image -> detection input (letterbox, normalise);
* :mod:`~edge_ocr_example.transforms` - detect -> classify -> recognise input transforms;
* :mod:`~edge_ocr_example.decode` - recogniser output -> ``(text, score, box)`` lines;
* :mod:`~edge_ocr_example.bundle` - stage bundles with example and expected tensors;
* :mod:`~edge_ocr_example.reference` - the direct onnxruntime run, the parity baseline.

Importing the package (or the transforms) does not import onnxruntime.
"""

from __future__ import annotations

__all__: list[str] = []
