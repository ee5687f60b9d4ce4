"""edge-qnn: Qualcomm QNN through ONNX Runtime (HTP, GPU or CPU QNN backends)."""

__version__ = "0.1.0"
