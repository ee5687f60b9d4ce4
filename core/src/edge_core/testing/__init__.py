"""Helpers for the tests of edge-core and of its plugins (leak checks, real workers)."""
