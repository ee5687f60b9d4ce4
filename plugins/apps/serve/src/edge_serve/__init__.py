"""edge-serve: opened pipelines behind a local HTTP API (``edge serve``).

The web stack (Starlette on uvicorn, python-multipart, prometheus-client) lives in this
distribution only; ``edge_core`` imports none of it. The ``edge`` command gains ``serve``
through the ``edge_register_commands`` hook (:mod:`edge_serve.plugin`).
"""

__version__ = "0.1.0"
