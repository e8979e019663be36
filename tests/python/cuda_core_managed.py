"""cuda.core's managed memory on the driver this process loads (run by
`tests/tests/cuda_core_managed.rs`, on the simulator there; any GPU driver works the same).

What a GPU gives, checked through cuda.core and, beside it, through the driver's own range
attributes (`cuda.bindings.driver.cuMemRangeGetAttribute`):
- `ManagedMemoryResource`: the current pool (not owned) and owned pools preferring a device, the
  host or a host NUMA node, as `preferred_location`/`device_id` report them;
- `ManagedBuffer`'s advice: `read_mostly`, `preferred_location` (a device, `Host()`,
  `Host(numa_id=...)`, `Host.numa_current()`, which the driver resolves to a node, and `None`),
  `accessed_by` (add, discard, assign) and what pages that disagree read as;
- `prefetch`, `discard`, `discard_prefetch` and the batches in `cuda.core.utils`
  (`prefetch_batch`, `discard_batch`, `discard_prefetch_batch`, one location for all or one
  each), with the last prefetch location the driver records, and a prefetch keeping the bytes;
- a `cuMemAllocManaged` pointer wrapped by `ManagedBuffer.from_handle` (managed by the pointer
  attribute) and `Buffer.from_handle` in a batch;
- cuda.core's own refusals (a location kind an advice does not take, memory that is not managed,
  a single buffer or an empty sequence for a batch, location counts that differ, a closed
  buffer) and the driver's (a discard on the legacy default stream, which `cuda.h` forbids for
  the batched calls cuda.core uses even for one buffer; a host NUMA node that does not exist;
  range attributes of memory that is not managed).

With `--no-concurrent-managed-access` (the driver reporting
`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` as 0, as on Windows or some embedded GPUs)
it checks instead that cuda.core warns once, that advice and prefetches naming a device are
`CUDA_ERROR_INVALID_DEVICE`, that the host still works, and that the batched calls are refused.

Prints `cuda-core-managed: ok` last, only when every check passed.
"""

import ctypes
import sys
import warnings

from cuda.bindings import driver as cu
from cuda.core import (
    LEGACY_DEFAULT_STREAM,
    Buffer,
    Device,
    DeviceMemoryResource,
    Host,
    ManagedBuffer,
    ManagedMemoryResource,
    ManagedMemoryResourceOptions,
)
from cuda.core._utils.cuda_utils import CUDAError  # cuda.core 1.2 exports it nowhere public
from cuda.core.utils import discard_batch, discard_prefetch_batch, prefetch_batch

SIZE = 1 << 20
PAGE = 4096
CPU = -1  # CU_DEVICE_CPU
INVALID = -2  # CU_DEVICE_INVALID
A = cu.CUmem_range_attribute
T = cu.CUmemLocationType


def check(result):
    """The value of a cuda.bindings call that must succeed."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


def attribute(buf, attr, size=4, nbytes=None):
    """A range attribute of the whole buffer (or its first `nbytes`), from the driver."""
    return check(cu.cuMemRangeGetAttribute(size, attr, int(buf.handle), nbytes or buf.size))


def typed(buf, kind):
    """The driver's v2 location attribute pair: (CUmemLocationType, id)."""
    type_attr, id_attr = {
        "preferred": (A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID),
        "prefetch": (
            A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
            A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID,
        ),
    }[kind]
    return T(attribute(buf, type_attr)), attribute(buf, id_attr)


def accessed_by_ids(buf):
    """The driver's ACCESSED_BY list, room for every device and the host, padding dropped."""
    count = check(cu.cuDeviceGetCount())
    ids = attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, size=4 * (count + 1))
    return sorted(i for i in ids if i != INVALID)


def raises(exception, f, contains=""):
    """Asserts `f()` raises `exception` with `contains` in its message; returns the message."""
    try:
        f()
    except exception as e:
        assert contains in str(e), f"{exception.__name__} without {contains!r}: {e}"
        return str(e)
    raise AssertionError(f"no {exception.__name__} (wanted {contains!r})")


def host_bytes(buf, n=None):
    """Managed memory read in place by the host."""
    return bytes((ctypes.c_uint8 * (n or buf.size)).from_address(int(buf.handle)))


def check_resources(device):
    current = ManagedMemoryResource()
    assert not current.is_handle_owned and current.preferred_location is None, current.preferred_location
    assert current.is_managed and current.is_host_accessible and current.is_device_accessible
    expected = [
        (ManagedMemoryResourceOptions(), None, -1),
        (ManagedMemoryResourceOptions(preferred_location=device.device_id), ("device", device.device_id), 0),
        (ManagedMemoryResourceOptions(preferred_location=-1), ("host", None), -1),
        (ManagedMemoryResourceOptions(preferred_location_type="host"), ("host", None), -1),
        (ManagedMemoryResourceOptions(preferred_location=0, preferred_location_type="host_numa"), ("host_numa", 0), -1),
    ]
    for options, preferred, device_id in expected:
        mr = ManagedMemoryResource(options)
        got = mr.preferred_location
        got = None if got is None else (got[0].value, got[1])
        assert got == preferred and mr.device_id == device_id, (options, got, mr.device_id)
        assert mr.is_handle_owned
        mr.close()
    # host_numa without an id: the device's host NUMA node, as its properties report it.
    mr = ManagedMemoryResource(ManagedMemoryResourceOptions(preferred_location_type="host_numa"))
    assert mr.preferred_location[1] == device.properties.host_numa_id, mr.preferred_location
    mr.close()
    # What cuMemPoolCreate refuses (HOST_NUMA_CURRENT), cuda.core refuses first.
    current_node = ManagedMemoryResourceOptions(preferred_location_type="host_numa_current")
    raises(ValueError, lambda: ManagedMemoryResource(current_node))
    raises(ValueError, lambda: ManagedMemoryResource(ManagedMemoryResourceOptions(preferred_location=-3)))


def check_advice(buf, device):
    assert not buf.read_mostly and attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) == 0
    buf.read_mostly = True
    assert buf.read_mostly and attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) == 1
    buf.read_mostly = False
    assert not buf.read_mostly and attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) == 0

    assert buf.preferred_location is None
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == INVALID
    assert typed(buf, "preferred")[0] == T.CU_MEM_LOCATION_TYPE_INVALID
    buf.preferred_location = device
    assert buf.preferred_location == device
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == device.device_id
    assert typed(buf, "preferred") == (T.CU_MEM_LOCATION_TYPE_DEVICE, device.device_id)
    buf.preferred_location = Host()
    assert buf.preferred_location is Host()
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == CPU
    assert typed(buf, "preferred")[0] == T.CU_MEM_LOCATION_TYPE_HOST
    buf.preferred_location = Host(numa_id=0)
    assert buf.preferred_location is Host(numa_id=0)
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == CPU, "a NUMA node is the CPU"
    assert typed(buf, "preferred") == (T.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)
    # The calling thread's node is resolved when advised: it reads back as that node.
    buf.preferred_location = Host.numa_current()
    resolved = buf.preferred_location
    assert isinstance(resolved, Host) and resolved.numa_id is not None, resolved
    assert typed(buf, "preferred")[0] == T.CU_MEM_LOCATION_TYPE_HOST_NUMA
    buf.preferred_location = None
    assert buf.preferred_location is None
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == INVALID
    # A node the machine does not have: the driver refuses it.
    raises(CUDAError, lambda: setattr(buf, "preferred_location", Host(numa_id=4095)), "CUDA_ERROR_INVALID_VALUE")

    # Advice on the first page only: the whole range's pages disagree, so no preferred location.
    location = cu.CUmemLocation()
    location.type = T.CU_MEM_LOCATION_TYPE_DEVICE
    location.id = device.device_id
    check(cu.cuMemAdvise(int(buf.handle), PAGE, cu.CUmem_advise.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, location))
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, nbytes=PAGE) == device.device_id
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == INVALID
    assert buf.preferred_location is None
    buf.preferred_location = None

    assert list(buf.accessed_by) == [] and accessed_by_ids(buf) == []
    buf.accessed_by.add(device)
    buf.accessed_by.add(Host())
    assert set(buf.accessed_by) == {device, Host()} and len(buf.accessed_by) == 2
    assert device in buf.accessed_by and Host() in buf.accessed_by
    assert accessed_by_ids(buf) == sorted([device.device_id, CPU])
    buf.accessed_by.discard(device)
    assert set(buf.accessed_by) == {Host()} and accessed_by_ids(buf) == [CPU]
    buf.accessed_by = [device]
    assert set(buf.accessed_by) == {device} and accessed_by_ids(buf) == [device.device_id]
    # Accessed-by names a processor: a device or the host, never a NUMA node.
    for where in (Host(numa_id=0), Host.numa_current()):
        raises(ValueError, lambda: buf.accessed_by.add(where), "does not support location_type")
        raises(ValueError, lambda: setattr(buf, "accessed_by", [Host(), where]), "does not support location_type")
        buf.accessed_by.discard(where)  # never in the set: ignored, as MutableSet.discard
    assert set(buf.accessed_by) == {device}, "a refused assignment changed nothing"
    buf.accessed_by = []
    assert accessed_by_ids(buf) == []
    raises(TypeError, lambda: buf.accessed_by.add(0))


def check_prefetch_and_discard(mr, device, stream):
    buf = mr.allocate(SIZE, stream=stream)
    stream.sync()
    ctypes.memset(int(buf.handle), 0x5A, SIZE)
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == INVALID, "never prefetched"
    assert typed(buf, "prefetch")[0] == T.CU_MEM_LOCATION_TYPE_INVALID
    for where, legacy, type_ in [
        (device, device.device_id, T.CU_MEM_LOCATION_TYPE_DEVICE),
        (Host(), CPU, T.CU_MEM_LOCATION_TYPE_HOST),
        (Host(numa_id=0), CPU, T.CU_MEM_LOCATION_TYPE_HOST_NUMA),
        (Host.numa_current(), CPU, T.CU_MEM_LOCATION_TYPE_HOST_NUMA),
    ]:
        buf.prefetch(where, stream=stream)
        assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == legacy, where
        assert typed(buf, "prefetch")[0] == type_, where
    stream.sync()
    assert host_bytes(buf) == bytes([0x5A]) * SIZE, "a prefetch keeps the bytes"
    # A prefetch on the legacy default stream is allowed (cuMemPrefetchAsync takes any stream).
    buf.prefetch(device, stream=LEGACY_DEFAULT_STREAM)
    raises(ValueError, lambda: buf.prefetch(None, stream=stream), "location is required")
    raises(TypeError, lambda: buf.prefetch(0, stream=stream))
    raises(CUDAError, lambda: buf.prefetch(Host(numa_id=4095), stream=stream), "CUDA_ERROR_INVALID_VALUE")

    buf.discard(stream=stream)
    buf.discard_prefetch(device, stream=stream)
    assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == device.device_id
    buf.discard_prefetch(Host(), stream=stream)
    assert typed(buf, "prefetch")[0] == T.CU_MEM_LOCATION_TYPE_HOST
    stream.sync()
    # cuda.core discards one buffer through the batched call, which "must not" use the legacy
    # NULL stream: the driver refuses it (the device's default stream is the legacy one).
    for legacy in (LEGACY_DEFAULT_STREAM, device.default_stream):
        raises(CUDAError, lambda: buf.discard(stream=legacy), "CUDA_ERROR_INVALID_VALUE")
        raises(CUDAError, lambda: buf.discard_prefetch(device, stream=legacy), "CUDA_ERROR_INVALID_VALUE")

    others = [mr.allocate(size, stream=stream) for size in (PAGE, 3 * PAGE + 5)]
    batch = [buf, *others]
    prefetch_batch(stream, batch, device)
    assert all(attribute(b, A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == device.device_id for b in batch)
    prefetch_batch(stream, batch, [Host(), device, Host(numa_id=0)])
    assert [typed(b, "prefetch")[0] for b in batch] == [
        T.CU_MEM_LOCATION_TYPE_HOST,
        T.CU_MEM_LOCATION_TYPE_DEVICE,
        T.CU_MEM_LOCATION_TYPE_HOST_NUMA,
    ]
    discard_batch(stream, batch)
    discard_prefetch_batch(stream, batch, [device, Host(), device])
    assert [attribute(b, A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) for b in batch] == [
        device.device_id,
        CPU,
        device.device_id,
    ]
    stream.sync()
    # cuda.core's refusals, before any driver call.
    raises(TypeError, lambda: prefetch_batch(stream, buf, device), "for a single buffer")
    raises(ValueError, lambda: prefetch_batch(stream, [], device), "empty buffers sequence")
    raises(ValueError, lambda: discard_batch(stream, []), "empty buffers sequence")
    raises(ValueError, lambda: prefetch_batch(stream, batch, [device]), "does not match")
    raises(ValueError, lambda: discard_prefetch_batch(stream, batch, [device, Host()]), "does not match")
    # The driver's: the batched calls on the legacy default stream.
    raises(CUDAError, lambda: prefetch_batch(LEGACY_DEFAULT_STREAM, batch, device), "CUDA_ERROR_INVALID_VALUE")
    raises(CUDAError, lambda: discard_batch(device.default_stream, batch), "CUDA_ERROR_INVALID_VALUE")
    for b in batch:
        b.close(stream)
    stream.sync()
    raises(RuntimeError, lambda: buf.read_mostly, "closed")


def check_not_managed(mr, device, stream):
    dmr = DeviceMemoryResource(device)
    plain = dmr.allocate(PAGE, stream=stream)
    wrapped = ManagedBuffer.from_handle(plain.handle, PAGE, owner=plain)
    assert not plain.is_managed and not wrapped.is_managed
    managed = mr.allocate(PAGE, stream=stream)
    for what, f in [
        ("advise", lambda: setattr(wrapped, "read_mostly", True)),
        ("advise", lambda: setattr(wrapped, "preferred_location", device)),
        ("advise", lambda: wrapped.accessed_by.add(device)),
        ("prefetch", lambda: wrapped.prefetch(device, stream=stream)),
        ("discard", lambda: wrapped.discard(stream=stream)),
        ("discard_prefetch", lambda: wrapped.discard_prefetch(device, stream=stream)),
        ("prefetch_batch", lambda: prefetch_batch(stream, [managed, plain], device)),
        ("discard_batch", lambda: discard_batch(stream, [plain, managed])),
        ("discard_prefetch_batch", lambda: discard_prefetch_batch(stream, [managed, plain], device)),
    ]:
        raises(ValueError, f, f"{what} requires a managed-memory allocation")
    # Reads are not guarded by cuda.core: the driver refuses memory that is not managed.
    raises(CUDAError, lambda: wrapped.read_mostly, "CUDA_ERROR_INVALID_VALUE")
    raises(CUDAError, lambda: wrapped.preferred_location, "CUDA_ERROR_INVALID_VALUE")
    err, _ = cu.cuMemRangeGetAttribute(4, A.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, int(plain.handle), PAGE)
    assert err == cu.CUresult.CUDA_ERROR_INVALID_VALUE, err
    # Pool memory is managed by its resource, not by the pointer attribute (the driver does
    # not report a managed pool's memory as managed), so a bare pointer of it is not.
    assert managed.is_managed and not Buffer.from_handle(managed.handle, PAGE, owner=managed).is_managed
    managed.close(stream)
    plain.close(stream)
    stream.sync()


def check_wrapped_cu_mem_alloc_managed(device, stream):
    size = 2 * PAGE + 100
    ptr = check(cu.cuMemAllocManaged(size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    try:
        buf = ManagedBuffer.from_handle(int(ptr), size)
        assert isinstance(buf, ManagedBuffer) and buf.is_managed, "the pointer attribute says managed"
        assert Buffer.from_handle(int(ptr), size).is_managed
        buf.read_mostly = True
        assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) == 1
        buf.preferred_location = device
        buf.accessed_by.add(Host())
        assert buf.preferred_location == device and set(buf.accessed_by) == {Host()}
        ctypes.memset(int(ptr), 0x33, size)
        buf.prefetch(device, stream=stream)
        stream.sync()
        assert host_bytes(buf) == bytes([0x33]) * size
        other = ManagedMemoryResource(ManagedMemoryResourceOptions()).allocate(PAGE, stream=stream)
        # A plain Buffer of managed memory is accepted by the batches.
        prefetch_batch(stream, [Buffer.from_handle(int(ptr), size), other], Host())
        assert attribute(buf, A.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == CPU
        discard_prefetch_batch(stream, [buf, other], device)
        stream.sync()
        other.close(stream)
        buf.close()
    finally:
        check(cu.cuMemFree(ptr))


def main() -> None:
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    assert device.properties.concurrent_managed_access
    check_resources(device)
    mr = ManagedMemoryResource(ManagedMemoryResourceOptions())
    buf = mr.allocate(SIZE, stream=stream)
    check_advice(buf, device)
    buf.close(stream)
    check_prefetch_and_discard(mr, device, stream)
    check_not_managed(mr, device, stream)
    check_wrapped_cu_mem_alloc_managed(device, stream)
    mr.close()
    stream.sync()
    print("cuda-core-managed: ok")


def main_without_concurrent_access() -> None:
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    assert not device.properties.concurrent_managed_access
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mr = ManagedMemoryResource(ManagedMemoryResourceOptions())
        ManagedMemoryResource(ManagedMemoryResourceOptions())
    said = [w for w in caught if "does not support concurrent managed memory access" in str(w.message)]
    assert len(said) == 1 and said[0].category is UserWarning, [str(w.message) for w in caught]
    buf = mr.allocate(SIZE, stream=stream)
    other = mr.allocate(PAGE, stream=stream)
    raises(CUDAError, lambda: buf.prefetch(device, stream=stream), "CUDA_ERROR_INVALID_DEVICE")
    raises(CUDAError, lambda: setattr(buf, "preferred_location", device), "CUDA_ERROR_INVALID_DEVICE")
    raises(CUDAError, lambda: buf.accessed_by.add(device), "CUDA_ERROR_INVALID_DEVICE")
    buf.prefetch(Host(), stream=stream)
    buf.preferred_location = Host()
    buf.read_mostly = True
    assert buf.preferred_location is Host() and buf.read_mostly
    # The batched calls need concurrent managed access on every device.
    raises(CUDAError, lambda: prefetch_batch(stream, [buf, other], Host()), "CUDA_ERROR_NOT_SUPPORTED")
    raises(CUDAError, lambda: buf.discard(stream=stream), "CUDA_ERROR_NOT_SUPPORTED")
    stream.sync()
    other.close(stream)
    buf.close(stream)
    mr.close()
    stream.sync()
    print("cuda-core-managed: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--no-concurrent-managed-access"]:
        main_without_concurrent_access()
    else:
        main()
