"""The echo handler the transport benchmark runs in its worker (stdlib + edge_contracts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_contracts.worker import BaseHandler, Call


class Echo(BaseHandler):
    """Returns its inputs unchanged (the worker copies them into its own outputs)."""

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        return call.inputs


def echo() -> BaseHandler:
    """Factory named by the benchmark's route."""
    return Echo()
