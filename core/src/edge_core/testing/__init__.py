"""Testing support for edge-core and its plugins: leak checks and the conformance kit.

* :mod:`edge_core.testing.leaks` — fail a test that leaves a process, a shared-memory
  segment or a descriptor behind.
* The conformance kit — :mod:`~edge_core.testing.checks` (the checks),
  :mod:`~edge_core.testing.runner` (``run_backend``), :mod:`~edge_core.testing.plugin`
  (the pytest plugin: ``pytest --edge-backend NAME``), and ``edge conformance NAME``.
* :mod:`edge_core.testing.interrupts` — a Ctrl-C at each point where CPython acts on one,
  for sweeps that check what an interrupt leaves behind.
* :mod:`edge_core.testing.hookref` — generates ``docs/hooks.md`` from the hookspecs.
"""
