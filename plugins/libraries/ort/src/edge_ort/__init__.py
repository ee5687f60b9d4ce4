"""The ONNX Runtime worker shared by every ORT backend (CPU, DirectML, VitisAI, QNN).

Worker-side modules (:mod:`edge_ort.worker`, :mod:`edge_ort.assignment`,
:mod:`edge_ort.numerics`) import only ``edge_contracts``, numpy and ``onnxruntime``, so the
controller can stage this package into a vendor interpreter whose ``onnxruntime`` is a
DirectML, QNN or VitisAI build. Whichever ``onnxruntime`` distribution that interpreter
has is the one used: nothing here depends on a particular one.
"""
