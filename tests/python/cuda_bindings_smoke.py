"""NVIDIA's cuda-bindings (the layer under cuda.core) driving the cuda-sim simulator.

`cargo xtask ci` runs this with LD_LIBRARY_PATH pointing at a folder where `libcuda.so.1` is the
simulator, so cuda-bindings loads it by the normal library search and resolves every entry point
through cuGetProcAddress_v2, as it does with the real driver.
"""
from cuda.bindings import driver as cu
def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, r
    return r[1:] if isinstance(r, tuple) and len(r) > 1 else None
ok(cu.cuInit(0))
print("version", ok(cu.cuDriverGetVersion()))
print("count", ok(cu.cuDeviceGetCount()))
dev, = ok(cu.cuDeviceGet(0))
print("name", ok(cu.cuDeviceGetName(64, dev))[0][:30])
ctx, = ok(cu.cuDevicePrimaryCtxRetain(dev))
ok(cu.cuCtxSetCurrent(ctx))
ptr, = ok(cu.cuMemAlloc(1024))
ok(cu.cuMemsetD8(ptr, 7, 1024))
buf = bytearray(1024)
ok(cu.cuMemcpyDtoH(buf, ptr, 1024))
assert buf == bytearray([7])*1024
ok(cu.cuMemFree(ptr))
print("ok")
