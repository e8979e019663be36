"""cuda.core's side of `cargo xtask bench --compare`: the same cases as our benchmarks, through
cuda.core and through raw cuda.bindings calls on the same driver, in the same run.

Prints one JSON object on stdout. Run by xtask in a private virtual environment, with
LD_LIBRARY_PATH pointing at the driver to use (the simulator, or nothing on a GPU machine).
"""
import json
import statistics
import sys
import time

from cuda.bindings import driver as cu
from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions


def check(result):
    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return result[1:] if isinstance(result, tuple) else ()


def timed(fn, repeats, inner):
    """Median and p10/p90 of `repeats` samples, each the mean over `inner` calls, in ns."""
    for _ in range(inner):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - start) / inner)
    samples.sort()
    return {
        "median_ns": statistics.median(samples),
        "p10_ns": samples[len(samples) // 10],
        "p90_ns": samples[(len(samples) * 9) // 10],
    }


def pool_pairs(results, quick):
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    mr = DeviceMemoryResource(device, DeviceMemoryResourceOptions())
    pool = mr.handle
    check(cu.cuMemPoolSetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                   cu.cuuint64_t(2**64 - 1)))
    raw_stream = stream.handle
    repeats, inner = (15, 200) if quick else (31, 1000)
    for size in (256, 64 << 10, 4 << 20):
        def through_core():
            mr.allocate(size, stream=stream).close()

        def raw():
            (ptr,) = check(cu.cuMemAllocFromPoolAsync(size, pool, raw_stream))
            check(cu.cuMemFreeAsync(ptr, raw_stream))

        results.append({"case": "pool_pair", "size": size, "api": "cuda.core",
                        **timed(through_core, repeats, inner)})
        results.append({"case": "pool_pair", "size": size, "api": "cuda.bindings raw",
                        **timed(raw, repeats, inner)})
    stream.sync()


def vmm_grow(results, quick):
    """Grow one buffer from 2 MiB in 2 MiB steps through VirtualMemoryResource.modify_allocation."""
    from cuda.core import VirtualMemoryResource, VirtualMemoryResourceOptions

    device = Device(0)
    device.set_current()
    vmr = VirtualMemoryResource(device, VirtualMemoryResourceOptions())
    step = 2 << 20
    steps = 64 if quick else 256
    buffer = vmr.allocate(step)
    times = []
    for i in range(2, steps + 2):
        start = time.perf_counter_ns()
        buffer = vmr.modify_allocation(buffer, i * step)
        times.append(time.perf_counter_ns() - start)
    times.sort()
    results.append({"case": "vmm_grow_step", "api": "cuda.core", "steps": steps,
                    "median_ns": statistics.median(times), "p10_ns": times[len(times) // 10],
                    "p90_ns": times[(len(times) * 9) // 10]})


def main():
    quick = "--quick" in sys.argv
    results = []
    pool_pairs(results, quick)
    try:
        vmm_grow(results, quick)
    except Exception as error:  # reported, not fatal: the pool comparison still stands
        results.append({"case": "vmm_grow_step", "api": "cuda.core", "error": str(error)})
    (version,) = check(cu.cuDriverGetVersion())
    print(json.dumps({"driver_version": version, "results": results}))


if __name__ == "__main__":
    main()
