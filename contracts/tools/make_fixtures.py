"""Write edge_contracts/conformance/v1.json from the hand-written cases below.

Every case is spelled out literally in the ``conformance_cases`` package next to this
script -- valid objects as plain JSON data, invalid ones as named overrides (RFC 6901
JSON pointers) with the error class and field they must produce, frames as bytes
assembled with ``struct`` -- so the fixtures do not depend on the implementation they
test. The script does not run the cases itself: ``python -m edge_contracts.conformance``
(and ``contracts/tests/test_conformance.py``) checks the implementation against them.

Usage::

    python contracts/tools/make_fixtures.py           # rewrite the fixture file
    python contracts/tools/make_fixtures.py --check   # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from conformance_cases.binary_frames import BINARY_INVALID_FRAMES, BINARY_VALID_FRAMES
from conformance_cases.json_frames import INVALID_FRAMES, VALID_FRAMES
from conformance_cases.value_cases import (
    ACCEPTED,
    BUFFERS,
    DEVICES,
    ERRORS,
    EVENTS,
    MANIFESTS,
    METADATAS,
    REQUESTS,
    STALE,
    STATE,
    STATES,
)
from conformance_cases.wire_cases import DTYPES, NEGOTIATION, WIRE_TYPES

OUT = Path(__file__).resolve().parents[1] / "src/edge_contracts/conformance/v1.json"


def build() -> dict[str, Any]:
    """Return the fixture document."""
    types = {"BufferDescriptor": BUFFERS, "StageRequest": REQUESTS, "StageEvent": EVENTS,
             "ErrorInfo": ERRORS, "StateHandle": STATES, "DeviceDescriptor": DEVICES,
             "ArtifactMetadata": METADATAS, "ArtifactManifest": MANIFESTS, **WIRE_TYPES}
    return {
        "format": "edge-contracts-conformance",
        "format_version": 1,
        "protocol_version": 1,
        "generated_by": "contracts/tools/make_fixtures.py",
        "dtypes": DTYPES,
        "types": types,
        "state": {"current": STATE, "stale": STALE, "accepted": ACCEPTED},
        "negotiation": NEGOTIATION,
        "frames": {"valid": VALID_FRAMES + BINARY_VALID_FRAMES,
                   "invalid": INVALID_FRAMES + BINARY_INVALID_FRAMES},
    }


def render(document: dict[str, Any]) -> str:
    """Serialise deterministically (sorted keys, ASCII, one-space indent, final newline)."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True, allow_nan=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the fixture file; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help="fixture file to write or check")
    args = parser.parse_args(argv)
    text = render(build())
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
