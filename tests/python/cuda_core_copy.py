"""cuda.core's `copy_batch` and `CopyOptions` on the driver this process loads (run by
`tests/tests/cuda_core_copy.rs`, on the simulator there; any GPU driver works the same).

What a GPU gives, checked:
- `copy_batch` with one `CopyOptions` for all copies and with one per copy (device to device,
  pinned host to device, device to pinned host) copies every range;
- `DURING_API_CALL` reads the source before `copy_batch` returns: overwriting the pinned
  source at once, while a host function holds the stream, leaves the copied bytes as they were;
  a `STREAM` copy held the same way sees the new bytes;
- cuda.core's own refusals (an empty batch, lengths and sizes that differ, the legacy default
  stream, a capturing stream) and the per-thread default stream accepted;
- `Buffer.copy_to`/`copy_from` with options: through `cuMemcpyWithAttributesAsync` on a CUDA 13.2
  driver; on an older one `STREAM` and `ANY` fall back to a plain copy and `DURING_API_CALL` is a
  `RuntimeError`;
- on a CUDA 12 driver (no `cuMemcpyBatchAsync`, no `cuMemGetMemPool`, so pinned memory comes from
  `LegacyPinnedMemoryResource`), `copy_batch` falls back to plain copies and `DURING_API_CALL` is a
  `RuntimeError` there too;
- on the simulator, which counts the driver calls a stretch of code makes (`cuSimCountCalls`),
  which path each took: `cuMemcpyBatchAsync` for a batch from CUDA 13.0, one `cuMemcpyAsync` per
  copy before; `cuMemcpyWithAttributesAsync` for one copy with options from CUDA 13.2,
  `cuMemcpyAsync` before (on a real driver, whose library has no such control, this is skipped);
- the driver's own answers through cuda.bindings: `cuMemcpyBatchAsync` with no copies, with an
  invalid access order and on the legacy stream is `CUDA_ERROR_INVALID_VALUE`; on a capturing
  stream it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and the capture stays active (what
  CUDA 13 drivers answer: rapidsai/rmm#2518); a CUDA 12 driver does not have it.

Prints `cuda-core-copy: ok` last, only when every check passed.
"""

import ctypes
import os
import threading

from cuda.bindings import driver as cu
from cuda.core import (
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    Device,
    DeviceMemoryResource,
    LegacyPinnedMemoryResource,
    PinnedMemoryResource,
)
from cuda.core.utils import CopyOptions, MemcpySrcAccessOrder, copy_batch


def check(result):
    """The value of a cuda.bindings call that must succeed."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


def driver_version():
    return check(cu.cuDriverGetVersion())


def simulator_counts():
    """The simulator's call counters (`cuSimCountCalls`, `cuSimCallCount`) in the driver library
    this process loaded, or None where there are none (a real driver, or the simulator with its
    controls hidden)."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
        start, read_count = library.cuSimCountCalls, library.cuSimCallCount
    except (OSError, AttributeError):
        return None
    start.argtypes, start.restype = [ctypes.c_uint], ctypes.c_int
    read_count.argtypes, read_count.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint)], ctypes.c_int
    if start(0) != 0:
        return None
    return start, read_count


# Set by `tests/tests/cuda_core_copy.rs` on the simulator, whose counters must then be there.
EXPECT_COUNTS = os.environ.get("CUDA_CORE_COPY_EXPECT_COUNTS") == "1"


def calls(fn, names):
    """Runs `fn`; the driver calls of each of `names` it made, where the simulator counts them
    (None elsewhere)."""
    counters = simulator_counts()
    if counters is None:
        assert not EXPECT_COUNTS, "the simulator's call counters are not there"
        fn()
        return None
    start, read_count = counters
    assert start(1) == 0
    try:
        fn()
    finally:
        start(0)
    counts = {}
    for name in names:
        count = ctypes.c_uint(0)
        assert read_count(name.encode(), ctypes.byref(count)) == 0, name
        counts[name] = count.value
    return counts


COPIES = ["cuMemcpyAsync", "cuMemcpyBatchAsync_v2", "cuMemcpyWithAttributesAsync"]


def expect_calls(counts, **expected):
    """Where calls were counted, each of `expected` (a name of COPIES) was called so often."""
    if counts is not None:
        for name, times in expected.items():
            assert counts[name] == times, f"{name}: {counts}"


def read(buf, stream):
    """A buffer's bytes, after its stream's work."""
    stream.sync()
    host = (ctypes.c_uint8 * buf.size)()
    check(cu.cuMemcpyDtoH(ctypes.addressof(host), int(buf.handle), buf.size))
    return bytes(host)


def pinned_bytes(buf):
    """A pinned buffer's bytes, read in place."""
    return bytes((ctypes.c_uint8 * buf.size).from_address(int(buf.handle)))


def fill_pinned(buf, value):
    ctypes.memset(int(buf.handle), value, buf.size)


class Hold:
    """A host function that holds a stream's later work until `release`."""

    def __init__(self, stream):
        self.event = threading.Event()

        def wait(_data):
            self.event.wait(30)

        # A C function pointer (kept alive with this object) made from the Python function.
        self.callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(wait)
        address = ctypes.cast(self.callback, ctypes.c_void_p).value
        check(cu.cuLaunchHostFunc(cu.CUstream(int(stream.handle)), cu.CUhostFn(address), 0))

    def release(self):
        self.event.set()


def expect(error_type, fn, text=None):
    try:
        fn()
    except error_type as error:
        assert text is None or text in str(error), str(error)
        return
    raise AssertionError(f"expected {error_type.__name__}")


def batches(dev, stream):
    batched = driver_version() >= 13000
    mr = DeviceMemoryResource(dev)
    # cuda.core's pinned pool needs CUDA 13.0's cuMemGetMemPool.
    pinned = PinnedMemoryResource() if batched else LegacyPinnedMemoryResource()
    src = pinned.allocate(32, stream=stream)
    stream.sync()
    ctypes.memmove(int(src.handle), bytes(range(32)), 32)
    a, b = mr.allocate(32, stream=stream), mr.allocate(32, stream=stream)
    back = pinned.allocate(32, stream=stream)
    # One set of options for all, then one per copy: one batch from CUDA 13.0, plain copies before.
    counts = calls(lambda: copy_batch(stream, [src, src], [a, b], options=CopyOptions(src_access_order="any")), COPIES)
    if batched:
        expect_calls(counts, cuMemcpyBatchAsync_v2=1, cuMemcpyAsync=0)
    else:
        expect_calls(counts, cuMemcpyBatchAsync_v2=0, cuMemcpyAsync=2)
    assert read(a, stream) == bytes(range(32)) and read(b, stream) == bytes(range(32))
    per_copy = [CopyOptions(), CopyOptions(overlap_mode="prefer_overlap_with_compute", dst_location_hint=dev)]
    c = mr.allocate(32, stream=stream)
    copy_batch(stream, [a, b], [c, back], options=per_copy)
    stream.sync()
    assert read(c, stream) == bytes(range(32)) and pinned_bytes(back) == bytes(range(32))

    # The source access order, as far as a caller sees it (a plain copy cannot read the source
    # during the call).
    early, late = mr.allocate(32, stream=stream), mr.allocate(32, stream=stream)
    stream.sync()
    during = CopyOptions(src_access_order=MemcpySrcAccessOrder.DURING_API_CALL)
    if batched:
        hold = Hold(stream)
        copy_batch(stream, [src], [early], options=during)
        copy_batch(stream, [src], [late])
        fill_pinned(src, 0xAB)
        hold.release()
        assert read(early, stream) == bytes(range(32)), "DURING_API_CALL read the source during the call"
        assert read(late, stream) == bytes([0xAB] * 32), "STREAM read the source in stream order"
    else:
        expect(RuntimeError, lambda: copy_batch(stream, [src], [early], options=during), "DURING_API_CALL")

    # cuda.core's refusals.
    expect(ValueError, lambda: copy_batch(stream, [], []), "empty")
    expect(ValueError, lambda: copy_batch(stream, [src], [a, b]))
    expect(ValueError, lambda: copy_batch(stream, [src], [mr.allocate(16, stream=stream)]), "size mismatch")
    expect(TypeError, lambda: copy_batch(LEGACY_DEFAULT_STREAM, [src], [a]), "LEGACY_DEFAULT_STREAM")
    copy_batch(PER_THREAD_DEFAULT_STREAM, [src], [a])
    PER_THREAD_DEFAULT_STREAM.sync()
    builder = stream.create_graph_builder()
    builder.begin_building()
    expect(TypeError, lambda: copy_batch(builder.stream, [src], [a]), "graph capture")
    builder.end_building()
    builder.close()
    return src, a, b


def single_copies(dev, stream, src, a):
    """`Buffer.copy_to`/`copy_from` with options, on this driver's version."""
    with_attributes = driver_version() >= 13020
    fill_pinned(src, 5)
    counts = calls(lambda: a.copy_from(src, stream=stream, options=CopyOptions(src_access_order="stream")), COPIES)
    if with_attributes:
        expect_calls(counts, cuMemcpyWithAttributesAsync=1, cuMemcpyAsync=0, cuMemcpyBatchAsync_v2=0)
    else:
        expect_calls(counts, cuMemcpyWithAttributesAsync=0, cuMemcpyAsync=1, cuMemcpyBatchAsync_v2=0)
    assert read(a, stream) == bytes([5] * 32)
    during = CopyOptions(src_access_order="during_api_call")
    if with_attributes:
        stream.sync()
        hold = Hold(stream)
        counts = calls(lambda: src.copy_to(a, stream=stream, options=during), COPIES)
        expect_calls(counts, cuMemcpyWithAttributesAsync=1, cuMemcpyAsync=0)
        fill_pinned(src, 6)
        hold.release()
        assert read(a, stream) == bytes([5] * 32), "read during the call"
    else:
        expect(RuntimeError, lambda: src.copy_to(a, stream=stream, options=during), "DURING_API_CALL")
    expect(TypeError, lambda: src.copy_to(a, stream=LEGACY_DEFAULT_STREAM, options=CopyOptions()))
    return with_attributes


def driver_answers(stream, src, a, b):
    """cuMemcpyBatchAsync's own errors, through cuda.bindings (a CUDA 12 driver has none)."""
    s = cu.CUstream(int(stream.handle))
    if driver_version() < 13000:
        expect(Exception, lambda: cu.cuMemcpyBatchAsync([], [], [], 0, [], [], 0, s), "not found")
        return
    attr = cu.CUmemcpyAttributes()
    attr.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    dst, sr = [cu.CUdeviceptr(int(a.handle))], [cu.CUdeviceptr(int(src.handle))]

    def batch(dsts, srcs, sizes, attrs, idxs, stream_handle):
        return cu.cuMemcpyBatchAsync(dsts, srcs, sizes, len(dsts), attrs, idxs, len(attrs), stream_handle)

    invalid = cu.CUresult.CUDA_ERROR_INVALID_VALUE
    assert batch(dst, sr, [32], [attr], [0], s)[0] == cu.CUresult.CUDA_SUCCESS
    assert batch([], [], [], [attr], [0], s)[0] == invalid, "no copies"
    bad = cu.CUmemcpyAttributes()
    assert batch(dst, sr, [32], [bad], [0], s)[0] == invalid, "CU_MEMCPY_SRC_ACCESS_ORDER_INVALID"
    assert batch(dst, sr, [32], [attr], [0], cu.CUstream(1))[0] == invalid, "the legacy stream"
    check(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    err = batch(dst, sr, [32], [attr], [0], s)[0]
    assert err == cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, err
    status = check(cu.cuStreamIsCapturing(s))
    assert status == cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE, status
    graph = check(cu.cuStreamEndCapture(s))
    check(cu.cuGraphDestroy(graph))
    stream.sync()


def main():
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    src, a, b = batches(dev, stream)
    with_attributes = single_copies(dev, stream, src, a)
    driver_answers(stream, src, a, b)
    print(f"driver {driver_version()}: copies with attributes {'native' if with_attributes else 'fall back'}")
    print("cuda-core-copy: ok")


if __name__ == "__main__":
    main()
