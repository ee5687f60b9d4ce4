"""A seeded fuzz campaign over frames, control frames and manifests (part of make test).

10,000 mutated inputs through the frame decoder, the stream reader, the receivers' parsing
of control frames (ack, cancel, boot, hello) and the manifest parser: nothing but typed
errors, no hang, accepted inputs survive a round trip, and no payload is allocated before
its bytes arrive. ``benchmarks/fuzz.py`` runs the same fuzzer for longer.
"""

from __future__ import annotations

import contextlib
import random

from edge_core.testing.fuzz_forms import FRAME_FORMS
from edge_core.testing.fuzzing import LIMITS, alloc_before_payload, run_campaign

CASES = 10_000
MiB = 1 << 20


def test_ten_thousand_mutated_inputs_fail_only_with_typed_errors() -> None:
    campaign = run_campaign(CASES, seed=19)
    assert campaign.cases == CASES
    assert campaign.failures == []
    result = campaign.result()
    assert result["untyped_errors"] == result["hangs"] == 0
    assert result["accepted_roundtrip_mismatches"] == 0
    assert 0 < result["max_alloc_bytes_before_payload"] <= MiB
    assert campaign.accepted > CASES // 20  # the mutations leave enough inputs valid


def test_every_frame_form_makes_frames_its_own_decoder_accepts() -> None:
    for form in FRAME_FORMS:
        for index in range(20):
            rng = random.Random(index)
            frame = form.decode(form.make(rng), LIMITS[0])
            if form.check is not None:
                with contextlib.suppress(*form.check_errors):  # e.g. a hello's wrong token
                    form.check(frame)


def test_the_allocation_probe_sees_a_payload_allocated_whole() -> None:
    """The measurement can fail: a reader that allocates the declared payload shows it."""
    import edge_contracts.wire as wire
    from edge_contracts.dtypes import DType
    from edge_contracts.headers import FrameHeader, TensorSpec

    size = 8 * MiB
    raw = wire.encode_header(FrameHeader("run", "r", "s", 0, 1,
                                         (TensorSpec("x", DType.UINT8, (size,), size),)))
    data = wire.PREFIX.pack(b"EDGW", len(raw), size) + raw
    assert (alloc_before_payload(data, LIMITS[0]) or 0) <= MiB
    original = wire.PAYLOAD_STEP
    try:
        wire.PAYLOAD_STEP = size  # a reader that allocates the whole payload at once
        assert (alloc_before_payload(data, LIMITS[0]) or 0) >= size
    finally:
        wire.PAYLOAD_STEP = original
