"""cuda.core's side of `cargo xtask bench --compare`: the same cases as our benchmarks, through
cuda.core and through raw cuda.bindings calls on the same driver, in the same run.

Prints one JSON object on stdout. Run by xtask in a private virtual environment, with
LD_LIBRARY_PATH pointing at the driver to use (the simulator, or nothing on a GPU machine); the
child process of the sharing case inherits it. `--quick` takes fewer samples; `--pool-pairs`
runs case (1) only.
"""
import ctypes
import json
import multiprocessing
import os
import pickle
import socket
import sys
import time

from cuda.bindings import driver as cu
from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions


def check(result):
    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return result[1:] if isinstance(result, tuple) else ()


def summary(samples):
    """Median, p10 and p90 (in ns) and the count of `samples`, each quantile the sample nearest
    to its rank, as our benchmarks compute them."""
    samples = sorted(samples)
    at = lambda q: samples[round((len(samples) - 1) * q)]  # noqa: E731
    return {"median_ns": at(0.5), "p10_ns": at(0.1), "p90_ns": at(0.9), "n": len(samples)}


def loaded_drivers():
    """The files of the CUDA drivers mapped into this process (their real paths, as
    /proc/self/maps gives them), so that xtask can check that the driver it chose, by
    LD_LIBRARY_PATH, is the one cuda.bindings loaded and these figures are of."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6:
                path = fields[5].strip()
                name = os.path.basename(path)
                if name.startswith("libcuda.so") or name == "libcuda_sim.so":
                    paths.add(path)
    return sorted(paths)


# -------------------------------------------------------------------------------------------------
# 1. Pool allocate+free pairs.
# -------------------------------------------------------------------------------------------------


def native_raw_pairs():
    """The native loop of raw allocate+free pairs (`raw_pairs.rs`, built by xtask and named by
    CUDA_MEM_RAW_PAIRS), bound to the driver's entry points; None when it is not there."""
    path = os.environ.get("CUDA_MEM_RAW_PAIRS")
    if not path:
        return None
    helper = ctypes.CDLL(path)
    helper.raw_pairs.restype = ctypes.c_int
    helper.raw_pairs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_size_t]
    # The library cuda.bindings loaded: dlopen of the same name returns it.
    libcuda = ctypes.CDLL("libcuda.so.1")
    alloc = ctypes.cast(libcuda.cuMemAllocFromPoolAsync, ctypes.c_void_p).value
    free = ctypes.cast(libcuda.cuMemFreeAsync, ctypes.c_void_p).value

    def pairs(size, pool, stream, n):
        result = helper.raw_pairs(alloc, free, size, pool, stream, n)
        if result != 0:
            raise RuntimeError(f"native raw pairs failed: CUresult {result}")

    return pairs


def timed_alternating(fns, repeats, inner, between):
    """`timed` for several ways of doing the same thing, sampled in turn (each sample of each
    right after one of the others, so that they share the machine's load): a dict of summaries.
    Each fn(n) does n operations; a sample is the mean over `inner` of them, in ns."""
    for fn in fns.values():
        fn(inner)
    samples = {name: [] for name in fns}
    for rep in range(repeats):
        order = list(fns.items())
        if rep % 2:
            order.reverse()  # neither always follows the other
        for name, fn in order:
            between()
            start = time.perf_counter_ns()
            fn(inner)
            samples[name].append((time.perf_counter_ns() - start) / inner)
    return {name: summary(s) for name, s in samples.items()}


def pool_pairs(results, quick):
    """Allocate+free pairs on one stream: through cuda.core, through raw cuda.bindings calls (in
    Python) and, when xtask built it, through the native loop of raw calls, the floor both
    overheads are taken from, sampled in turn in this process. The stream is synchronized
    between samples, outside the clock, as in our benchmarks: on the simulator a pool's memory
    comes back when the stream reaches the free, and thousands of pending 4 MiB frees could
    otherwise run a loaded machine out of simulated memory."""
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    mr = DeviceMemoryResource(device, DeviceMemoryResourceOptions())
    pool = mr.handle
    check(cu.cuMemPoolSetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                   cu.cuuint64_t(2**64 - 1)))
    raw_stream = stream.handle
    native = native_raw_pairs()
    repeats, inner = (15, 200) if quick else (31, 1000)
    for size in (256, 64 << 10, 4 << 20):
        def through_core(n):
            for _ in range(n):
                mr.allocate(size, stream=stream).close()

        def raw(n):
            for _ in range(n):
                (ptr,) = check(cu.cuMemAllocFromPoolAsync(size, pool, raw_stream))
                check(cu.cuMemFreeAsync(ptr, raw_stream))

        fns = {"cuda.core": through_core, "cuda.bindings raw": raw}
        if native is not None:
            fns["native raw"] = lambda n: native(size, int(pool), int(raw_stream), n)  # noqa: B023
        for api, stats in timed_alternating(fns, repeats, inner, stream.sync).items():
            results.append({"case": "pool_pair", "size": size, "api": api, **stats})
    stream.sync()


# -------------------------------------------------------------------------------------------------
# 2. Sharing buffers with a child process.
# -------------------------------------------------------------------------------------------------

SHARE_BUFFER = 64 << 10
SHARE_BATCHES = (1, 64, 1024)
# (warm-up, timed) repetitions per batch: our benchmarks' counts, fewer with --quick.
SHARE_REPEATS = {1: (50, 1000), 64: (10, 300), 1024: (3, 60)}
SHARE_REPEATS_QUICK = {1: (5, 100), 64: (2, 30), 1024: (1, 6)}
# An explicit bound for the IPC pool, twice what the largest batch holds; the pool is the same
# for every path, so it changes nothing in the comparison.
SHARE_POOL_MAX = 2 * max(SHARE_BATCHES) * SHARE_BUFFER
# How long the parent waits for any one reply of the child before giving up, in seconds.
SHARE_REPLY_TIMEOUT = 120
# The 64 bytes of a CUmemPoolPtrExportData (cuda.bindings does not expose its `reserved` field;
# the raw path reads and writes them through the struct's address).
EXPORT_DATA_SIZE = 64

# The paths, as the child's commands name them.
CORE = "cuda.core"  # the pool sent once (multiprocessing); buffers as pickle bytes
CORE_SEND = "cuda.core Connection.send"  # buffers through Connection.send (the pool's fd each time)
RAW = "cuda.bindings raw"  # cuMemPoolExportPointer / cuMemPoolImportPointer, 64 bytes each


def sharing(results, quick):
    """Case (2): per buffer, the parent's export+encode+send plus the child's recv+decode+import,
    for batches of 1, 64 and 1,024 buffers of 64 KiB from one IPC-enabled pool.

    The child is started with multiprocessing's spawn method (the one cuda.core supports), and
    the memory resource is sent to it once, before any timing, through a multiprocessing
    Connection: cuda.core's reducer sends the pool's allocation handle (a dup'ed file descriptor)
    and the child maps the pool and registers it by UUID. Then, per repetition, three paths:

    - "cuda.core", the way cuda.core's documentation gives for many buffers once the pool is
      sent: the parent pickles the list of Buffers (each reduces to its memory resource, which
      plain pickle writes as a registry lookup by UUID, and its IPCBufferDescriptor) and sends
      the bytes with Connection.send_bytes; the child receives them and unpickles, which finds
      the pool in the registry and imports every buffer (Buffer.from_ipc_descriptor). cuda.core
      caches a buffer's descriptor the first time it is asked for, so after the warm-up the
      parent makes no driver call: cuMemPoolExportPointer runs once per buffer, not per send.
    - "cuda.core Connection.send", for reference: the list of Buffers through Connection.send,
      what `conn.send(buffers)` does: multiprocessing's pickler also reduces the memory resource
      deeply, so each message carries the pool's handle again: a descriptor dup'ed by the
      parent, which the child, while unpickling, fetches from a thread of the parent
      (multiprocessing's resource sharer), so that round trip is in the child's clock; the child
      then finds the pool already registered and closes the descriptor.
    - "cuda.bindings raw": the parent calls cuMemPoolExportPointer per buffer and sends the
      64-byte export data as plain bytes; the child receives them and calls
      cuMemPoolImportPointer per buffer on the imported pool.

    Data and commands travel on two different pipes (Unix socket pairs), so that neither clock
    contains the other side's wait, as in our benchmarks. The parent's clock covers the path's
    export, encoding and send on the data pipe, and stops when the send returns; only then does
    the parent send the command on the control pipe. The child blocks on the control pipe and
    starts its clock once it has the command, when the whole message is already queued in its
    data socket (a Unix socket queues a write directly on the peer; the data socket's send
    buffer is checked beforehand to hold the largest message, so the send never waits for the
    child). The child's clock stops once the buffers are imported; it then closes or frees them
    on its stream and synchronizes it, untimed, and replies with its time. Per buffer and
    repetition: (parent + child) / batch. The three paths alternate within each repetition.
    """
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    mr = DeviceMemoryResource(device, DeviceMemoryResourceOptions(ipc_enabled=True, max_size=SHARE_POOL_MAX))
    check(cu.cuMemPoolSetAttribute(mr.handle, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                   cu.cuuint64_t(2**64 - 1)))
    buffers = [mr.allocate(SHARE_BUFFER, stream=stream) for _ in range(max(SHARE_BATCHES))]
    stream.sync()
    pointers = [int(buffer.handle) for buffer in buffers]

    data, data_there = multiprocessing.Pipe()
    control, control_there = multiprocessing.Pipe()
    child = multiprocessing.Process(target=share_child, args=(data_there, control_there), daemon=True)
    child.start()
    data_there.close()
    control_there.close()
    try:
        # The raw message is 64 bytes a buffer; the pickled one a little more; the handle that
        # Connection.send adds to each message is a few hundred bytes more.
        largest = max(len(pickle.dumps(buffers)), EXPORT_DATA_SIZE * len(buffers)) + 4096
        make_room(data, largest)
        data.send(mr)
        ask(control, child, "resource", 0)

        def send_core(chosen, _pointers):
            data.send_bytes(pickle.dumps(chosen))

        def send_core_connection(chosen, _pointers):
            data.send(chosen)

        def send_raw(_chosen, chosen_pointers):
            parts = []
            for ptr in chosen_pointers:
                (export,) = check(cu.cuMemPoolExportPointer(ptr))
                parts.append(ctypes.string_at(export.getPtr(), EXPORT_DATA_SIZE))
            data.send_bytes(b"".join(parts))

        paths = ((CORE, send_core), (CORE_SEND, send_core_connection), (RAW, send_raw))
        for batch in SHARE_BATCHES:
            chosen, chosen_pointers = buffers[:batch], pointers[:batch]
            warmup, repeats = (SHARE_REPEATS_QUICK if quick else SHARE_REPEATS)[batch]
            samples = {api: ([], [], []) for api, _ in paths}
            for rep in range(warmup + repeats):
                for api, send in paths:
                    start = time.perf_counter_ns()
                    send(chosen, chosen_pointers)
                    parent = time.perf_counter_ns() - start
                    child_ns = ask(control, child, api, batch)
                    if rep >= warmup:
                        parents, children, totals = samples[api]
                        parents.append(parent / batch)
                        children.append(child_ns / batch)
                        totals.append((parent + child_ns) / batch)
            for api, (parents, children, totals) in samples.items():
                results.append({"case": "sharing", "batch": batch, "api": api, "buffer_size": SHARE_BUFFER,
                                "warmup": warmup, "parent": summary(parents), "child": summary(children),
                                **summary(totals)})
        control.send(("exit", 0))
        child.join(SHARE_REPLY_TIMEOUT)
        if child.exitcode != 0:
            raise RuntimeError(f"the sharing child exited with {child.exitcode}")
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        data.close()
        control.close()
    for buffer in buffers:
        buffer.close(stream)
    stream.sync()


def make_room(conn, largest):
    """Makes the send buffer of `conn`'s socket hold `largest` bytes twice over (asking for
    4 MiB, which the kernel caps at net.core.wmem_max), so that a send on it completes without
    the peer reading; raises if it cannot."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        room = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    finally:
        sock.close()
    if room < 2 * largest:
        raise RuntimeError(f"the data socket's send buffer ({room} bytes) cannot hold a {largest}-byte message "
                           "twice: a send could wait for the child and the clocks would overlap")


def ask(control, child, command, batch):
    """Sends `command` for `batch` buffers to the child and returns its reply's value (the
    child's time in ns, for the timed commands); raises if the child failed or went silent."""
    control.send((command, batch))
    if not control.poll(SHARE_REPLY_TIMEOUT):
        raise RuntimeError(f"the sharing child did not answer {command!r} within {SHARE_REPLY_TIMEOUT} s "
                           f"(exit code {child.exitcode})")
    try:
        status, value = control.recv()
    except EOFError:
        child.join(SHARE_REPLY_TIMEOUT)
        raise RuntimeError(f"the sharing child closed its control pipe (exit code {child.exitcode})") from None
    if status != "ok":
        raise RuntimeError(f"the sharing child failed on {command!r}: {value}")
    return value


def share_child(data, control):
    """The child of `sharing` (spawned): serves the parent's commands until "exit", replying to
    each on the control pipe; a failure is sent back as its text before the child exits."""
    try:
        serve_sharing(data, control)
    except BaseException as error:
        control.send(("error", f"{type(error).__name__}: {error}"))
        raise


def serve_sharing(data, control):
    """The child's loop: "resource" receives the memory resource (untimed); each path's command
    times the receipt and import of `batch` buffers, then frees them, untimed."""
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    mr = None
    while True:
        command, batch = control.recv()
        if command == "exit":
            return
        if command == "resource":
            mr = data.recv()
            if not mr.is_mapped:
                raise RuntimeError("the memory resource did not arrive as a mapped resource")
            control.send(("ok", 0))
            continue
        if mr is None:
            raise RuntimeError(f"{command!r} before the memory resource")
        pool = mr.handle
        start = time.perf_counter_ns()
        if command == CORE:
            imported = pickle.loads(data.recv_bytes())
        elif command == CORE_SEND:
            imported = data.recv()
        elif command == RAW:
            payload = data.recv_bytes()
            imported = []
            for offset in range(0, len(payload), EXPORT_DATA_SIZE):
                export = cu.CUmemPoolPtrExportData()
                ctypes.memmove(export.getPtr(), payload[offset:offset + EXPORT_DATA_SIZE], EXPORT_DATA_SIZE)
                (ptr,) = check(cu.cuMemPoolImportPointer(pool, export))
                imported.append(ptr)
        else:
            raise RuntimeError(f"unknown command {command!r}")
        took = time.perf_counter_ns() - start
        if len(imported) != batch:
            raise RuntimeError(f"{command}: expected {batch} buffers, got {len(imported)}")
        for item in imported:
            if command == RAW:
                check(cu.cuMemFreeAsync(item, stream.handle))
            else:
                if not (item.is_mapped and item.size == SHARE_BUFFER and item.memory_resource is mr):
                    raise RuntimeError(f"{command}: an imported buffer is not a {SHARE_BUFFER}-byte mapping of the pool")
                item.close(stream)
        del imported
        stream.sync()
        control.send(("ok", took))


# -------------------------------------------------------------------------------------------------
# 3. VMM growth.
# -------------------------------------------------------------------------------------------------


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
    results.append({"case": "vmm_grow_step", "api": "cuda.core", "steps": steps, **summary(times)})


def vmm_first_grow(results, quick):
    """One growth of a fresh 2 MiB buffer to 4 MiB through modify_allocation, repeated: the one
    growth cuda.core 1.2.2 completes (the series above fails at the second, see BENCHMARKS.md).
    Its in-place path is unreachable (it compares the reserved `CUdeviceptr` with an `int`, never
    equal), so every growth moves, whatever room the driver left. Timed: the call, which also
    frees the old range, as our timing includes dropping the buffer grown from. The new buffer is
    closed outside the clock. Each growth leaks two handle references (the retained old chunk's
    and the new chunk's, never released), which the driver keeps until the process ends: the
    repetitions are few enough for that to fit."""
    from cuda.core import VirtualMemoryResource, VirtualMemoryResourceOptions

    device = Device(0)
    device.set_current()
    vmr = VirtualMemoryResource(device, VirtualMemoryResourceOptions())
    step = 2 << 20
    reps = 30 if quick else 100
    times, moved = [], 0
    for rep in range(reps + reps // 10):
        buffer = vmr.allocate(step)
        before = int(buffer.handle)
        start = time.perf_counter_ns()
        grown = vmr.modify_allocation(buffer, 2 * step)
        took = time.perf_counter_ns() - start
        moved += int(grown.handle) != before
        grown.close()
        if rep >= reps // 10:  # the first tenth warms up
            times.append(took)
    results.append(
        {"case": "vmm_first_grow", "api": "cuda.core", "moved": moved, "of": reps + reps // 10, **summary(times)}
    )


def main():
    quick = "--quick" in sys.argv
    if "--pool-pairs" in sys.argv:
        # Case (1) alone: xtask alternates it with ours, so both run under the same load.
        results = []
        pool_pairs(results, quick)
        print(json.dumps({"results": results, "drivers": loaded_drivers()}))
        return
    # cuda.core supports spawned children only (and warns on sharing under "fork").
    multiprocessing.set_start_method("spawn")
    results = []
    pool_pairs(results, quick)
    try:
        sharing(results, quick)
    except Exception as error:  # reported, not fatal, like the VMM case
        results.append({"case": "sharing", "error": f"{type(error).__name__}: {error}"})
    try:
        vmm_first_grow(results, quick)
    except Exception as error:  # reported, not fatal, like the whole series below
        results.append({"case": "vmm_first_grow", "api": "cuda.core", "error": f"{type(error).__name__}: {error}"})
    try:
        vmm_grow(results, quick)
    except Exception as error:  # reported, not fatal: the pool comparison still stands
        results.append({"case": "vmm_grow_step", "api": "cuda.core", "error": str(error)})
    (version,) = check(cu.cuDriverGetVersion())
    print(json.dumps({"driver_version": version, "results": results, "drivers": loaded_drivers()}))


if __name__ == "__main__":
    main()
