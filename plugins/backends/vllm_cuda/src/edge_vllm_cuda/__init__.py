"""edge-vllm-cuda: vLLM generation stages on NVIDIA GPUs: streaming, abort, VRAM reservation."""

__version__ = "0.1.0"
