"""edge-echo: the reference test backend of edge-core."""

__version__ = "0.1.0"
