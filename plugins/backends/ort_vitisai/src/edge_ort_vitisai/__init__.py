"""edge-ort-vitisai: ONNX Runtime VitisAI on the AMD Ryzen AI NPU (Windows only)."""

__version__ = "0.1.0"
