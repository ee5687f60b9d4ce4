"""Fail any test that leaves a worker process, a shared-memory segment or a descriptor."""

from __future__ import annotations

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)
