"""A long fuzz campaign: frames (every form), control frames and manifests.

Runs :func:`edge_core.testing.fuzzing.run_campaign` — the fuzzer ``make test`` runs for
10,000 cases — for ``--cases`` cases (default 1,200,000; a tenth are manifests unless
``--manifests`` says otherwise) from ``--seed``, through the frame decoder and the stream
reader, printing progress every 10,000 cases on stderr. A new frame form (a binary
per-request frame, say) is fuzzed here as soon as it is registered in
``edge_core.testing.fuzz_forms.FRAME_FORMS``.

The last line is one JSON object: ``cases``, ``untyped_errors``, ``hangs``,
``max_alloc_bytes_before_payload`` (tracemalloc peak while a frame's prefix and header
have been delivered and no payload byte yet; goal <= 1 MiB) and
``accepted_roundtrip_mismatches`` (accepted inputs that do not survive re-encoding, or that
the decoder and the stream reader read differently). Goal: 0, 0, <= 1048576, 0. Failing
cases are listed on stderr with their index: ``--seed S --first I --cases 1`` replays one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from edge_core.testing.fuzzing import Campaign, run_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1_200_000,
                        help="cases to run (default 1,200,000: over 1,000,000 frames)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first case")
    parser.add_argument("--manifests", type=float, default=0.1,
                        help="share of cases that are manifests (default 0.1)")
    args = parser.parse_args()
    started = time.monotonic()

    def progress(campaign: Campaign) -> None:
        rate = campaign.cases / max(time.monotonic() - started, 1e-9)
        print(f"{campaign.cases} cases, {rate:.0f}/s: {campaign.result()}", file=sys.stderr)

    campaign = run_campaign(args.cases, seed=args.seed, first=args.first,
                            manifests=args.manifests, progress=progress)
    for failure in campaign.failures:
        print(failure, file=sys.stderr)
    print(f"accepted {campaign.accepted} of {campaign.cases} in "
          f"{time.monotonic() - started:.1f} s", file=sys.stderr)
    print(json.dumps(campaign.result()))
    result = campaign.result()
    clean = not (result["untyped_errors"] or result["hangs"]
                 or result["accepted_roundtrip_mismatches"])
    return 0 if clean and result["max_alloc_bytes_before_payload"] <= 1 << 20 else 1


if __name__ == "__main__":
    sys.exit(main())
