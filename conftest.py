"""The whole test suite sees the test backends (``echo``, ``echo-preemptible``).

They register in the ``edge.testing`` entry-point group, which edge-core loads only under
``EDGE_TEST_BACKENDS=1`` (or when ``EDGE_PLUGINS`` names them): set here, before any test
runs, so in-process plugin loading and every ``edge`` subprocess a test starts see them,
while a user's ``edge plugins`` in the same virtual environment does not.
"""

import os

os.environ["EDGE_TEST_BACKENDS"] = "1"
