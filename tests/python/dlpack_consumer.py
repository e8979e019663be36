"""DLPack between cuda-mem-core and cuda.core in one process (run by
`tests/tests/dlpack_consumer.rs`).

Both sides drive one simulator: cuda.bindings loads `libcuda.so.1` from `LD_LIBRARY_PATH`, and
the Rust library (`target/<profile>/examples/libdlpack_ffi.so`, given as the first argument) the
same library through `CUDA_MEM_DRIVER`.

- Rust to cuda.core: a tensor exported by `Buffer::into_dlpack`, wrapped in a PyCapsule named
  `dltensor_versioned` behind `__dlpack__`, is taken by cuda.core's `StridedMemoryView`; its
  pointer, shape, dtype and device are checked and its elements read through cuda.bindings;
  releasing the view calls the Rust deleter exactly once; a capsule dropped unconsumed is
  released (once) by its destructor.
- cuda.core to Rust: a cuda.core `Buffer` from a `DeviceMemoryResource`, written through
  cuda.bindings, exported with its `__dlpack__`, is imported by `DlpackImport::from_raw`, which
  reads it back and, when dropped, calls cuda.core's deleter exactly once.

Prints `dlpack-consumer: ok` last, only when every check passed.
"""

import ctypes
import gc
import struct
import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.core import Device, DeviceMemoryResource
from cuda.core.utils import StridedMemoryView

VERSIONED = b"dltensor_versioned"
USED_VERSIONED = b"used_dltensor_versioned"
# PyCapsule keeps the name's pointer: these buffers live as long as the module.
_VERSIONED_NAME = ctypes.create_string_buffer(VERSIONED)
_USED_NAME = ctypes.create_string_buffer(USED_VERSIONED)

K_DL_CUDA = 2
K_DL_FLOAT = 2
K_DL_UINT = 1
K_DL_INT = 0

api = ctypes.pythonapi
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
api.PyCapsule_IsValid.restype = ctypes.c_int
api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_void_p]
api.PyCapsule_GetName.restype = ctypes.c_char_p
api.PyCapsule_GetName.argtypes = [ctypes.py_object]


class ImportInfo(ctypes.Structure):
    """`dlpack_ffi::ImportInfo`."""

    _fields_ = [
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("dtype_code", ctypes.c_uint8),
        ("dtype_bits", ctypes.c_uint8),
        ("dtype_lanes", ctypes.c_uint16),
        ("ndim", ctypes.c_int32),
        ("shape0", ctypes.c_int64),
        ("size", ctypes.c_uint64),
        ("ptr", ctypes.c_uint64),
        ("read_only", ctypes.c_int32),
    ]


class ManagedTensorHead(ctypes.Structure):
    """The start of `DLManagedTensorVersioned`: version, manager_ctx, deleter, flags."""

    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def load(path):
    lib = ctypes.CDLL(path)
    lib.dlpack_ffi_export_f32.restype = ctypes.c_int32
    lib.dlpack_ffi_export_f32.argtypes = [ctypes.c_size_t, ctypes.c_ssize_t, ctypes.POINTER(ctypes.c_void_p)]
    lib.dlpack_ffi_release.restype = ctypes.c_int32
    lib.dlpack_ffi_release.argtypes = [ctypes.c_void_p]
    lib.dlpack_ffi_sources_released.restype = ctypes.c_size_t
    lib.dlpack_ffi_sources_released.argtypes = []
    lib.dlpack_ffi_import_read.restype = ctypes.c_int32
    lib.dlpack_ffi_import_read.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ImportInfo),
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    lib.dlpack_ffi_last_error.restype = ctypes.c_char_p
    lib.dlpack_ffi_last_error.argtypes = []
    return lib


def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, r
    return r[1:] if isinstance(r, tuple) and len(r) > 1 else None


class Rust:
    """The Rust library and what its capsules' destructors did."""

    def __init__(self, path):
        self.lib = load(path)
        # Tensors the capsule destructor released (capsules dropped unconsumed), and errors
        # in the destructor (which Python would only print).
        self.released_by_capsule = 0
        self.destructor_errors = []
        self.destructor = DELETER(self._destroy_capsule)

    def check(self, status, what):
        if status != 0:
            message = self.lib.dlpack_ffi_last_error()
            raise AssertionError(f"{what}: status {status}: {message.decode() if message else '?'}")

    def released(self):
        return self.lib.dlpack_ffi_sources_released()

    def _destroy_capsule(self, capsule):
        # A consumer renames the capsule `used_dltensor_versioned` and owns the tensor; one
        # still named `dltensor_versioned` was never consumed, so its tensor is released here.
        try:
            if api.PyCapsule_IsValid(capsule, VERSIONED):
                pointer = api.PyCapsule_GetPointer(ctypes.cast(capsule, ctypes.py_object), VERSIONED)
                self.check(self.lib.dlpack_ffi_release(pointer), "dlpack_ffi_release")
                self.released_by_capsule += 1
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            self.destructor_errors.append(repr(error))


class RustTensor:
    """`n` f32s exported by cuda-mem-core, offered through the DLPack protocol."""

    def __init__(self, rust, n):
        self.rust = rust
        self.n = n
        self.requests = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.requests.append({"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy})
        if max_version is None or max_version[0] < 1:
            raise BufferError("this producer gives versioned tensors (DLPack 1.x) only")
        if dl_device is not None and tuple(dl_device) != (K_DL_CUDA, 0):
            raise BufferError(f"the tensor is on (kDLCUDA, 0), not {dl_device}")
        if copy:
            raise BufferError("this producer does not copy")
        tensor = ctypes.c_void_p()
        # DLPack: None means the legacy default stream (1) for CUDA.
        consumer = 1 if stream is None else stream
        self.rust.check(
            self.rust.lib.dlpack_ffi_export_f32(self.n, consumer, ctypes.byref(tensor)), "dlpack_ffi_export_f32"
        )
        destructor = ctypes.cast(self.rust.destructor, ctypes.c_void_p)
        return api.PyCapsule_New(tensor, ctypes.addressof(_VERSIONED_NAME), destructor)

    def __dlpack_device__(self):
        return (K_DL_CUDA, 0)


def rust_to_cuda_core(rust, stream):
    n = 1000
    producer = RustTensor(rust, n)
    before = rust.released()
    view = StridedMemoryView.from_dlpack(producer, stream_ptr=int(stream.handle))
    assert len(producer.requests) == 1, producer.requests
    request = producer.requests[0]
    assert request["stream"] == int(stream.handle), request
    assert request["max_version"] is not None and request["max_version"][0] >= 1, request
    assert view.shape == (n,), view.shape
    assert view.strides in (None, (1,)), view.strides
    assert view.dtype == np.float32, view.dtype
    assert view.device_id == 0, view.device_id
    assert view.is_device_accessible
    assert not view.readonly, "an exported Buffer is exclusive, so writable"
    assert view.ptr != 0
    memory_type = ok(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, view.ptr))[0]
    assert memory_type == cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, memory_type
    ordinal = ok(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, view.ptr))[0]
    assert ordinal == 0, ordinal
    # The export made the consumer's stream wait for the fill: work on it sees the data.
    stream.sync()
    host = bytearray(n * 4)
    ok(cu.cuMemcpyDtoH(host, view.ptr, len(host)))
    assert list(struct.unpack(f"<{n}f", host)) == [float(i) for i in range(n)]
    assert rust.released() == before, "released while cuda.core's view holds it"
    del view
    gc.collect()
    assert rust.released() == before + 1, ("the view's release calls the deleter once", rust.released() - before)
    assert rust.released_by_capsule == 0, "a consumed capsule is not released by its destructor"

    # A capsule nobody consumes: its destructor releases the tensor, once.
    capsule = producer.__dlpack__(stream=-1, max_version=(1, 0))
    assert api.PyCapsule_GetName(capsule) == VERSIONED
    del capsule
    gc.collect()
    assert rust.released() == before + 2, rust.released() - before
    assert rust.released_by_capsule == 1
    assert not rust.destructor_errors, rust.destructor_errors
    print("dlpack-consumer: rust -> cuda.core ok")


def cuda_core_to_rust(rust, device, stream):
    size = 4096
    mr = DeviceMemoryResource(device)
    buffer = mr.allocate(size, stream=stream)
    stream.sync()
    data = bytes((i * 7 + 3) & 0xFF for i in range(size))
    ok(cu.cuMemcpyHtoD(int(buffer.handle), data, size))
    refs = sys.getrefcount(buffer)

    capsule = buffer.__dlpack__(stream=int(stream.handle), max_version=(1, 0))
    assert api.PyCapsule_GetName(capsule) == VERSIONED, api.PyCapsule_GetName(capsule)
    pointer = api.PyCapsule_GetPointer(capsule, VERSIONED)
    # Consumed: the capsule's destructor leaves the tensor to its new owner.
    assert api.PyCapsule_SetName(capsule, ctypes.addressof(_USED_NAME)) == 0
    del capsule
    gc.collect()

    # cuda.core's deleter, counted: wrapped in one that counts its calls.
    head = ManagedTensorHead.from_address(pointer)
    assert head.major == 1, (head.major, head.minor)
    original = DELETER(head.deleter)
    calls = []

    def counting(tensor):
        calls.append(tensor)
        original(tensor)

    counting_deleter = DELETER(counting)
    head.deleter = ctypes.cast(counting_deleter, ctypes.c_void_p).value

    info = ImportInfo()
    out = ctypes.create_string_buffer(size)
    rust.check(rust.lib.dlpack_ffi_import_read(pointer, ctypes.byref(info), out, size), "dlpack_ffi_import_read")
    assert calls == [pointer], ("the import's drop calls cuda.core's deleter once", calls)
    assert (info.device_type, info.device_id) == (K_DL_CUDA, 0), (info.device_type, info.device_id)
    assert info.dtype_code in (K_DL_INT, K_DL_UINT) and info.dtype_bits == 8 and info.dtype_lanes == 1, (
        info.dtype_code,
        info.dtype_bits,
        info.dtype_lanes,
    )
    assert (info.ndim, info.shape0, info.size) == (1, size, size), (info.ndim, info.shape0, info.size)
    assert info.ptr == int(buffer.handle), (hex(info.ptr), buffer.handle)
    assert out.raw == data, "Rust read cuda.core's bytes"
    gc.collect()
    assert sys.getrefcount(buffer) == refs, "cuda.core's tensor no longer holds the buffer"
    buffer.close(stream)
    stream.sync()
    print("dlpack-consumer: cuda.core -> rust ok")


def main():
    rust = Rust(sys.argv[1])
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    rust_to_cuda_core(rust, stream)
    cuda_core_to_rust(rust, device, stream)
    print("dlpack-consumer: ok")


if __name__ == "__main__":
    main()
