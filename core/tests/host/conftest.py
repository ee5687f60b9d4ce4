"""Fixtures of the host tests: every test fails if it leaks a process, segment or fd."""

from __future__ import annotations

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)
