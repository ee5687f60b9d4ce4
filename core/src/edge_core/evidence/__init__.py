"""Evidence: the profiling harness, qualification records and the device x model matrix.

- :func:`~edge_core.evidence.profiling.run_profile` (``edge profile``) measures a
  pipeline and writes a JSON profile with every raw sample;
- :mod:`~edge_core.evidence.records` holds the qualification record of one
  device x model x configuration cell and its statuses (``edge qualify``);
- :mod:`~edge_core.evidence.matrix` aggregates records into Markdown and a
  self-contained HTML report (``edge matrix``).
"""
