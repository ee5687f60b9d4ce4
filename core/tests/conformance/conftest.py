"""Conformance-kit tests run real backends in real workers and must leave nothing behind."""

from __future__ import annotations

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)
