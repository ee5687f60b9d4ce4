"""edge-core: run ML model stages on the accelerators of one machine."""

__version__ = "0.1.0"
