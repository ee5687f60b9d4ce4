"""edge-ort-cpu: ONNX Runtime on the CPU: the embedded default backend."""

__version__ = "0.1.0"
