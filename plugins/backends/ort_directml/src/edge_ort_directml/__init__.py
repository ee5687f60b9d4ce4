"""edge-ort-directml: ONNX Runtime DirectML on any DirectX 12 GPU (Windows only)."""

__version__ = "0.1.0"
