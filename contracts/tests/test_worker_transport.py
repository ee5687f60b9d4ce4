"""TensorPacker: shared-memory output buffers and when they must be private; its byte cap."""

from __future__ import annotations

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue, PayloadTooLarge
from edge_contracts.shm import SegmentProducer, new_prefix
from edge_contracts.worker_transport import TensorPacker


@pytest.fixture
def producer():
    made = SegmentProducer(new_prefix(), max_bytes=8 << 20)
    yield made
    made.close()


def test_a_large_buffer_is_sent_as_its_own_segment_without_a_copy(producer) -> None:
    packer = TensorPacker(producer, threshold=4096)
    array, lease = packer.allocate((256, 64), np.float32)
    assert lease is not None and array.flags.writeable
    array[:] = 3.0
    allocated = {id(array): (array, lease)}
    packed = packer.pack({"y": array}, allocated)
    assert allocated == {}
    (spec,) = packed.specs
    assert spec.ref is not None and spec.ref.segment == lease.segment
    assert packed.leases == [(lease.segment, lease.generation)] and packed.payloads == []
    assert producer.retained_buffers == 1


def test_a_buffer_sent_again_from_its_segment_carries_each_lease_s_generation(producer) -> None:
    from edge_contracts.dtypes import DType
    from edge_contracts.headers import ShmRef, TensorSpec

    packer = TensorPacker(producer, threshold=4096)
    seen = []
    for _ in range(3):  # pooled: the same segment, a new generation each time
        array, lease = packer.allocate((256, 64), np.float32)
        (spec,) = packer.pack({"y": array}, {id(array): (array, lease)}).specs
        assert spec == TensorSpec("y", DType.FLOAT32, (256, 64), 256 * 64 * 4,
                                  ShmRef(lease.segment, lease.offset, lease.generation))
        seen.append((lease.segment, lease.generation))
        producer.release(lease.segment, lease.generation)
    assert len({segment for segment, _ in seen}) == 1 and len(set(seen)) == 3
    array, lease = packer.allocate((128, 128), np.float32)  # same bytes, another shape
    (spec,) = packer.pack({"y": array}, {id(array): (array, lease)}).specs
    assert spec.shape == (128, 128) and spec.ref is not None
    assert spec.ref.generation == lease.generation


@pytest.mark.parametrize("dtype", [object, np.complex64, ">f4", "U4"])
def test_dtypes_the_wire_does_not_carry_as_is_get_private_arrays(producer, dtype) -> None:
    packer = TensorPacker(producer, threshold=16)
    array, lease = packer.allocate((1024,), dtype)
    assert lease is None and producer.retained_buffers == 0
    assert array.shape == (1024,)


def test_small_buffers_and_a_full_cap_give_private_arrays(producer) -> None:
    packer = TensorPacker(producer, threshold=4096)
    assert packer.allocate((8,), np.uint8)[1] is None
    held = [packer.allocate((4 << 20,), np.uint8)[1] for _ in range(2)]
    assert all(lease is not None for lease in held)
    array, lease = packer.allocate((4 << 20,), np.uint8)  # over the 8 MiB cap
    assert lease is None and array.nbytes == 4 << 20
    assert packer.allocate((4 << 20,), np.uint8, private=True)[1] is None


def test_arrays_over_max_bytes_together_are_refused_before_the_one_that_crosses_is_leased(
    producer,
) -> None:
    packer = TensorPacker(producer, threshold=4096, max_bytes=10_000)
    assert packer.max_bytes == 10_000
    fits = packer.pack({"a": np.zeros(6000, np.uint8), "b": np.zeros(4000, np.uint8)})
    assert [spec.nbytes for spec in fits.specs] == [6000, 4000]  # exactly max_bytes
    packer.take_back(fits.leases)
    spied: list[int] = []
    lease = producer.lease
    producer.lease = lambda nbytes: spied.append(nbytes) or lease(nbytes)  # type: ignore[method-assign]
    with pytest.raises(PayloadTooLarge) as refused:
        packer.pack({"a": np.zeros(6000, np.uint8), "b": np.zeros(4001, np.uint8),
                     "c": [1, 2]})
    assert (refused.value.field, refused.value.value) == ("tensors", 10_000 + 1 + 16)
    assert str(refused.value) == (
        "tensors: the tensors of one frame must be <= max_bytes 10000: 10017")
    assert spied == [6000]  # "b" was never leased or copied, and "a" was taken back
    assert producer.retained_bytes == 0
    # an array already in its own segment (allocate) crossing the limit: taken back too
    array, held = packer.allocate((12_000,), np.uint8)
    assert held is not None
    with pytest.raises(PayloadTooLarge) as again:
        packer.pack({"y": array}, {id(array): (array, held)})
    assert producer.retained_bytes == 0
    del refused, again, array, held  # their frames hold views of the segments


def test_sizes_are_each_array_s_wire_bytes_leaving_out_what_is_no_array() -> None:
    sizes = TensorPacker.sizes({"a": np.zeros((3, 4), np.float32), "b": [1.5, 2.5],
                                "c": [[1], [1, 2]]})  # ragged: no array
    assert sizes == {"a": 48, "b": 16}


def test_unlinked_names_taken_for_a_frame_that_was_not_sent_come_back(producer) -> None:
    first = producer.lease(4096)
    producer.release(first.segment, first.generation, unlink=True)
    taken = producer.take_gone()
    assert taken == [first.segment] and producer.take_gone() == []
    producer.restore_gone(taken)
    assert producer.take_gone() == [first.segment]


def test_unpacked_inline_tensors_are_read_only_views_and_bools_are_still_checked() -> None:
    from edge_contracts.errors import BoolBytesInvalid
    from edge_contracts.headers import FrameHeader
    from edge_contracts.wire import Frame
    from edge_contracts.worker_transport import TensorUnpacker

    packed = TensorPacker(None, threshold=1 << 20).pack(
        {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True, False]),
         "e": np.zeros((0, 4), np.int64)})
    header = FrameHeader("run", "r1", "s", 0, 1, packed.specs)
    payload = bytearray(b"".join(bytes(p) for p in packed.payloads))
    arrays = TensorUnpacker(None).unpack(Frame(header, payload))
    np.testing.assert_array_equal(arrays["f"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert arrays["b"].tolist() == [True, False] and arrays["e"].shape == (0, 4)
    assert not any(array.flags.writeable for array in arrays.values())
    payload[0] = 0x7F  # views, not copies: the frame's own bytes
    assert arrays["f"][0, 0] != 0.0
    payload[24] = 2  # a bool byte other than 0 and 1 is refused, as before
    with pytest.raises(BoolBytesInvalid, match=r"^tensors\.b: bool payload .*: 2$"):
        TensorUnpacker(None).unpack(Frame(header, payload))


def test_a_repeated_entry_list_is_unpacked_from_its_kept_layout_the_same_way() -> None:
    from edge_contracts.headers import FrameHeader
    from edge_contracts.wire import Frame
    from edge_contracts.worker_transport import TensorUnpacker

    packed = TensorPacker(None, threshold=1 << 20).pack(
        {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.int64(7),
         "e": np.zeros((0, 4), np.int16), "h": np.ones(3, np.float16)})
    unpacker = TensorUnpacker(None)
    seen = []
    for round_ in range(3):  # the first builds the layout, the others use it
        header = FrameHeader("run", f"r{round_}", "s", 0, 1, packed.specs)
        payload = bytearray(b"".join(bytes(p) for p in packed.payloads))
        arrays = unpacker.unpack(Frame(header, payload))
        assert list(arrays) == ["f", "s", "e", "h"]
        np.testing.assert_array_equal(arrays["f"], np.arange(6, dtype=np.float32).reshape(2, 3))
        assert arrays["s"].shape == () and int(arrays["s"]) == 7
        assert arrays["e"].shape == (0, 4) and arrays["e"].dtype == np.int16
        assert arrays["h"].dtype == np.dtype("<f2") and arrays["h"].tolist() == [1.0] * 3
        assert not any(array.flags.writeable for array in arrays.values())
        payload[0] = 0x7F  # views of this frame's own bytes, not of an earlier one
        assert arrays["f"][0, 0] != 0.0
        seen.append(arrays)
    assert seen[0]["f"][0, 0] == seen[2]["f"][0, 0]  # each frame its own payload


PLAIN = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
         "float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", PLAIN)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (0, 3), (1, 1, 4)])
def test_inline_payloads_are_the_array_bytes_whatever_the_layout(
    dtype: str, shape: tuple[int, ...]
) -> None:
    packer = TensorPacker(None, 1 << 20)
    base = (np.arange(int(np.prod(shape)) * 2) % 3).astype(dtype)
    contiguous = base[: base.size // 2].reshape(shape)
    strided = base[::2].reshape(shape)  # every other element: not contiguous
    frozen = contiguous.copy()
    frozen.flags.writeable = False
    for array in (contiguous, strided, frozen):
        packed = packer.pack({"a": array})
        payload = b"".join(bytes(view) for view in packed.payloads)
        assert payload == np.ascontiguousarray(array).tobytes()
        (spec,) = packed.specs
        assert (spec.shape, spec.nbytes, spec.ref) == (shape, array.nbytes, None)
        assert all(view.ndim == 1 and view.itemsize == 1 for view in packed.payloads)


@pytest.mark.parametrize(("field", "value"), [("outputs", np.array(["a"])),
                                              ("inputs", np.array([None])),
                                              ("inputs", "text")])
def test_a_dtype_the_wire_does_not_carry_is_refused_naming_the_packers_arrays(
        producer, field, value) -> None:
    packer = TensorPacker(producer, threshold=16, field=field)
    refused = ""
    try:
        packer.pack({"ok": np.zeros(64, np.float32), "x": value})
    except InvalidValue as exc:  # not kept: its traceback holds pack's lease views
        refused = exc.field
    assert refused == f"{field}.x.dtype"
    assert producer.retained_buffers == 0  # the first array's lease was taken back


def test_a_lone_array_packed_again_goes_as_it_went_unless_it_differs(producer) -> None:
    """The entry kept for a lone inline array serves only an array packed the same way."""
    packer = TensorPacker(producer, threshold=4096)
    small = np.arange(4, dtype=np.float32)
    first = packer.pack({"x": small})
    again = packer.pack({"x": small + 1})  # the kept entry: the same spec, its own bytes
    assert again.specs == first.specs and again.specs[0].ref is None
    assert again.leases == [] and again.features == frozenset()
    assert [bytes(view) for view in again.payloads] == [(small + 1).tobytes()]
    swapped = (small + 2).astype(">f4")  # same name and shape, the other byte order
    (spec,) = (packed := packer.pack({"x": swapped})).specs
    assert spec == first.specs[0]
    assert [bytes(view) for view in packed.payloads] == [(small + 2).tobytes()]
    strided = np.arange(8, dtype=np.float32)[::2]  # same key, not contiguous
    packed = packer.pack({"x": strided})
    assert [bytes(view) for view in packed.payloads] == [strided.tobytes()]
    assert packer.pack({"y": small}).specs[0].name == "y"  # another name: its own entry
    large = packer.pack({"x": np.zeros(2048, np.float32)})  # over the threshold
    assert large.specs[0].ref is not None and len(large.leases) == 1
    packer.take_back(large.leases)
    assert producer.retained_buffers == 0
