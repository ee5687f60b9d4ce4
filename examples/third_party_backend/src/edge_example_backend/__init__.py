"""A template edge-core backend: copy this distribution to start your own."""

__version__ = "0.1.0"
