//! Where `cuda.h` is silent, the reading the simulator takes, and why.
//!
//! The simulator returns the documented error wherever `cuda.h` documents one. Where the real
//! driver's behaviour is not documented, it picks the reading most likely to expose a bug in the
//! caller. Each choice ends with what would settle it: a question of the GPU probe (`cargo xtask
//! probe`, part `probe` of the GPU bundle, which sets each GPU answer beside the simulator's), or
//! why no GPU run can, or what is still open. Every divergence a GPU shows is a simulator bug to
//! model. Each choice:
//!
//! - **`cuMemFree(0)`, `cuMemFreeHost(NULL)`** return `CUDA_ERROR_INVALID_VALUE` (the runtime's
//!   `cudaFree(NULL)` is a no-op; the driver call's behaviour is not documented).
//!   Settled by the probe's question `call-edges`.
//! - **`cuMemAllocHost` of 0 bytes** returns `CUDA_ERROR_INVALID_VALUE`, like `cuMemAlloc`.
//!   Settled by the probe's question `call-edges`.
//! - **A stale handle** (a destroyed stream, event or context) is always detected: handle values
//!   are never reused, so `CUDA_ERROR_INVALID_HANDLE` (streams, events) or
//!   `CUDA_ERROR_INVALID_CONTEXT` / `CUDA_ERROR_CONTEXT_IS_DESTROYED` (contexts) results instead
//!   of undefined behaviour.
//!   Not a question for a GPU: `cuda.h` leaves the use of a destroyed handle undefined, so no
//!   driver's answer binds another, and the simulator keeps detecting it.
//! - **A released primary context** gets a new handle when it is retained again; the old handle
//!   stays invalid. Its allocations, streams and events are gone with it.
//!   Settled by the probe's question `context-edges` (the handle a retain after the last release
//!   gives).
//! - **`cuDevicePrimaryCtxRelease` without a retain** returns `CUDA_ERROR_INVALID_CONTEXT`.
//!   Settled by the probe's question `context-edges`.
//! - **Work whose stream is gone is still the device's work**: `cuCtxSynchronize` waits for the
//!   work left on a stream destroyed with work pending (`cuStreamDestroy`: its resources "will be
//!   released automatically once the device has completed all work" in it) and on the per-thread
//!   default stream of a thread that exited ("Blocks until the current context has completed all
//!   preceding requested tasks"), and the legacy default stream's implicit synchronization waits
//!   for such blocking streams' work too. Destroying a context (its last release, or a reset) does
//!   not wait for its work, which still runs; `cuCtxSynchronize` of any later context of the device
//!   waits for it. Until 2026-12-07 the simulator forgot a stream's work once the stream had no
//!   handle. Settled by the probe's questions `gone-stream-work` (a thread's per-thread stream and
//!   a destroyed stream held by a host function, then `cuCtxSynchronize` timed against it) and
//!   `context-edges` (whether the last release waits).
//! - **A destroyed context's stream-ordered frees settle as they run**: `cuDevicePrimaryCtxReset`
//!   says "Destroy all allocations" of the context, so pool memory whose `cuMemFreeAsync` on one of
//!   its streams ran before the destruction without being synchronized, or runs after it, no
//!   longer counts as outstanding (no synchronization can observe a destroyed context): the next
//!   synchronization or `cuMemPoolTrimTo` releases it. Before 2026-12-07 it stayed reserved for
//!   good. Settled by the probe's question `context-edges` (`cuMemGetInfo` after the last release
//!   with a free pending, a new retain, `cuCtxSynchronize` and a trim of the default pool).
//! - **Created contexts** (`cuCtxCreate_v4`, `cuCtxDestroy_v2`): execution affinity ("only
//!   supported under Volta+ MPS") and CIG parameters are `CUDA_ERROR_NOT_SUPPORTED` (no MPS, no
//!   graphics API here), both at once ("undefined behavior") `CUDA_ERROR_INVALID_VALUE`.
//!   `cuCtxDestroy` of a primary context, of null, and of an unknown or destroyed context returns
//!   `CUDA_ERROR_INVALID_CONTEXT` (`cuda.h` lists it and `CUDA_ERROR_INVALID_VALUE` without
//!   saying which is whose). It does not wait for the context's work (what is enqueued still
//!   runs, as after a primary context's last release), and takes the context's streams, events,
//!   `cuMemAlloc`, `cuMemAllocHost`/`cuMemHostAlloc` (portable too), `cuMemAllocManaged` memory
//!   and host registrations with it, as `cuda.h` lists them; pool memory stays (its note).
//!   Settled by the probe's question `context-edges` (an affinity parameter, `cuCtxDestroy` of the
//!   primary context).
//! - **Context events** (`cuCtxRecordEvent`, `cuCtxWaitEvent`): a null context is
//!   `CUDA_ERROR_INVALID_CONTEXT`, not read as the current one (`cuda.h` does not say it is). A
//!   context-wide wait holds the work submitted after it to every stream of the context, streams
//!   created later and per-thread ones included, but not a `cuStreamSynchronize` or query of a
//!   stream given no new work. A context event's completion shows the host no stream's progress:
//!   pool frees stay outstanding until a stream, event or context synchronization shows them.
//!   Settled by the probe's question `call-edges` (`cuCtxRecordEvent` with a null context); the
//!   wait's reach is `cuda.h`'s ("all future work submitted to the context").
//! - **Context limits** (`cuCtxGetLimit`, `cuCtxSetLimit`) start at an H100's values (stack
//!   1 KiB, printf FIFO 1 MiB, heap 8 MiB, 2048 pending launches, L2 fetch granularity 64 B,
//!   persisting L2 0) and are kept as set, but for the two `cuda.h` says are clamped (the fetch
//!   granularity to 128 B, the persisting L2 size to the device's maximum, 0 here). The device
//!   runtime's sync depth is `CUDA_ERROR_UNSUPPORTED_LIMIT` when read as well as when set (only
//!   applicable below compute capability 9.0); so are the limits of CIG contexts, which no context
//!   here is (`CU_LIMIT_SHMEM_SIZE`, `CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED`). `CU_LIMIT_CIG_ENABLED`
//!   reads 0 and setting it ("can only be queried") is `CUDA_ERROR_INVALID_VALUE`, as is an
//!   unknown limit. The printf FIFO and heap sizes can always be set: no kernel is ever launched.
//!   Settled by the probe's question `call-edges` (a GPU's limits, read).
//! - **`cuMemHostAlloc`'s flags** are checked and otherwise change nothing: the memory is
//!   `cuMemAllocHost`'s, with its pointer attributes. With `CU_MEMHOSTALLOC_WRITECOMBINED` the host
//!   pointer is still the device pointer (`cuda.h` says only `cuMemHostGetDevicePointer`, which the
//!   simulator does not export, gives that one), and portable memory goes with the context that
//!   allocated it.
//!   Not a question the probe can ask: what the flags change (caching, write combining, mapping)
//!   shows in speed and in kernels' access, neither of which the simulator has.
//! - **`cuStreamAttachMemAsync`**: `cuda.h` documents no `CUDA_ERROR_INVALID_VALUE` but says "An
//!   error will be returned" for `CU_MEM_ATTACH_SINGLE` on the NULL stream. The simulator returns
//!   `CUDA_ERROR_INVALID_VALUE` for that, for the per-thread default stream too, for flags other
//!   than one of `CUmemAttach_flags`, for a managed allocation attached in part or from inside it
//!   (a length neither 0 nor its size; "not possible to change stream association for a portion"),
//!   and for memory that is not managed, managed pool memory included (`cuda.h` names
//!   `__managed__` and `cuMemAllocManaged` memory). Pageable memory with a length is
//!   `CUDA_ERROR_NOT_SUPPORTED` (the devices lack `PAGEABLE_MEMORY_ACCESS`). On a capturing stream
//!   it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and the capture is invalidated (`cuda.h` is
//!   silent). The association itself is not modelled: managed memory is reachable everywhere here.
//!   Settled by the probe's question `call-edges` (a single-stream attach on the legacy stream,
//!   non-managed memory, part of an allocation).
//! - **The location-based pool functions** (`cuMemGetDefaultMemPool`, `cuMemGetMemPool`,
//!   `cuMemSetMemPool`): a device the process does not have is `CUDA_ERROR_INVALID_DEVICE` only
//!   for `cuMemGetDefaultMemPool`, which alone lists it, and `CUDA_ERROR_INVALID_VALUE` for the
//!   others; a pool imported from another process cannot be made current (it allocates nothing).
//!   Settled by the probe's question `call-edges` (a device ordinal the machine lacks).
//! - **`cuStreamDestroy` of a default stream** (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`)
//!   returns `CUDA_ERROR_INVALID_HANDLE`.
//!   Settled by the probe's question `context-edges`.
//! - **`cuEventRecord` with an event and a stream of different contexts** returns
//!   `CUDA_ERROR_INVALID_HANDLE`, as `cuCtxRecordEvent` documents for its context.
//!   Settled by the probe's question `context-edges`.
//! - **Device memory is not host-accessible**: it lives in an inaccessible reservation, so host
//!   code reading a device pointer faults. A pointer into that reservation that is not inside a
//!   live allocation (freed, or past the end) is `CUDA_ERROR_INVALID_VALUE` in every copy, even
//!   in `cuMemcpy`, which otherwise treats unknown pointers as pageable host memory.
//!   Settled for copies by the probe's question `unsafe-edges` (a freed pointer, asked in a child
//!   process); a host read of device memory is not asked (it faults the probe on a GPU without HMM,
//!   and code must not count on either answer).
//! - **`cuMemsetD16`/`D32` to a misaligned address** returns `CUDA_ERROR_INVALID_VALUE`.
//!   Settled by the probe's question `call-edges`.
//! - **`cuMemcpyHtoD` with a device pointer as the source, `cuMemcpyDtoH` with one as the
//!   destination** return `CUDA_ERROR_INVALID_VALUE` (the direction must match the memory).
//!   Settled by the probe's question `unsafe-edges` (each in a child process: a driver that took
//!   the device pointer for host memory would read it from the CPU).
//! - **Host synchronization** of copies and memsets is exactly what the CUDA documentation's
//!   "API synchronization behavior" promises and no more (see `api::memory`): a
//!   `cuMemcpyDtoD` or a `cuMemsetD8` on device memory returns before it completes.
//!   Settled by that page: nothing to probe.
//! - **Boolean pointer attributes** (`IS_MANAGED`, `MAPPED`, …) are written as one byte (C
//!   `bool`), the narrowest reading of "a boolean".
//!   Settled by the probe's question `call-edges` (the bytes `IS_MANAGED` writes).
//! - **Pointer attributes the simulator does not model** (P2P tokens, RDMA capability, access
//!   flags, mapping size and base, block id, decompression) return `CUDA_ERROR_NOT_SUPPORTED`.
//!   Not a reading but a gap in the model: a GPU answers them, and code that needs them is tested
//!   on one.
//! - **Device attributes the simulator does not model** read as 0, "capability absent".
//!   A gap in the model, as above: `CUDA_SIM_DEVICE_ATTRIBUTES` sets any of them to a GPU's value.
//! - **Older ABI variants** of a function (`cuGetProcAddress_v2("cuMemAlloc", 3000, …)`, which
//!   the driver answers with the 32-bit `cuMemAlloc`) are reported as
//!   `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`, never with an entry point of another
//!   signature.
//!   Nothing to settle: the driver's answer is known (the older function), and the simulator
//!   refuses on purpose, so that no caller is handed an entry point of another signature.
//! - **Calls from a host function** (`cuLaunchHostFunc`) return `CUDA_ERROR_NOT_PERMITTED`, as
//!   the documentation forbids them.
//!   Not probed: `cuda.h` forbids them, and a driver may deadlock or corrupt its state, which binds
//!   no other.
//! - **Graphs** (see the `graph` module): a captured graph is its nodes in capture order, and a
//!   launch replays them as one piece of work on the launch stream, after the executable graph's
//!   previous launch. Launching or uploading into a capturing stream returns
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and leaves the capture valid (a GPU would add a child
//!   graph node: the probe's question `graph-launch-into-capture`). `cuStreamEndCapture` accepts a
//!   NULL graph pointer and keeps the graph for whoever took its handle from
//!   `cuStreamGetCaptureInfo`: `cuda.h` says the graph is "transferred or destroyed" at the end,
//!   but cuda.core's graph builder ends its captures so and then instantiates the graph, which
//!   works on GPUs. A second instantiation of a graph with allocation or free nodes, and
//!   `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH` for a graph with memory or event nodes, return
//!   `CUDA_ERROR_INVALID_VALUE` (`cuda.h`: "an error"; the second instantiation is the probe's
//!   question `capture-edges`).
//! - **A capture's nodes and dependencies** (see the `capture` module): `cuStreamGetCaptureInfo`
//!   reports the stream's dependency set as `cuda.h` defines it, with nodes that `cuGraphGetNodes`,
//!   `cuGraphNodeGetType` and `cuGraphNodeGetDependencies` know. Where `cuda.h` is silent: an event
//!   recorded in a capture (without `CU_EVENT_RECORD_EXTERNAL`, which the simulator does not
//!   export) makes no node, it only notes the set (a launch still records the event, which until
//!   then keeps its earlier completion state); a captured wait for an event recorded outside any
//!   capture is a `WAIT_EVENT` node, with or without `CU_EVENT_WAIT_EXTERNAL`; captured managed
//!   prefetches and discards are `EMPTY` nodes (no node type names them).
//!   `cuStreamUpdateCaptureDependencies` refuses with `CUDA_ERROR_INVALID_VALUE` a node named twice
//!   (`cuGraphAddMemAllocNode`'s rule: "may not have any duplicate entries") and edge data other
//!   than the default (ports and programmatic edges are for kernel nodes, which the simulator has
//!   none of); on an invalidated capture it returns `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`. Nodes
//!   it gives a stream from another stream of the capture count as a rejoin, and a stream whose set
//!   it replaces owes its origin only what the new set holds of its own work ("nodes that are
//!   removed from the dependency set via this API do not result in
//!   `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`"). What a GPU does is the probe's question
//!   `capture-dependencies`.
//! - **Graph memory**: `cuMemAllocAsync` on a capturing stream makes an allocation node whose
//!   address is live from the capture until the capture ends (so that captured work can use it),
//!   then from each launch until a free node, `cuMemFreeAsync`/`cuMemFree` or another graph's free
//!   node; its bytes are the same at every launch (a GPU gives no guarantee about them) and its
//!   address is never handed out again, so a stale graph pointer is always reported.
//!   `cuMemAllocFromPoolAsync` on a capturing stream makes an allocation node too, as `cuda.h`
//!   notes ("the allocation is owned by the graph instead of the memory pool. The memory pool's
//!   properties are used to set the node's creation parameters"): on the pool's device, the pool's
//!   usage unchanged. A pool whose properties no allocation node can take is refused with
//!   `CUDA_ERROR_NOT_SUPPORTED`, the capture left valid: a pool with shareable handle types
//!   (`CUDA_MEM_ALLOC_NODE_PARAMS`: "IPC is not supported"), a pinned host pool or a managed pool
//!   (the node's location is taken to be a device's). What a GPU does is the probe's question
//!   `pool-alloc-in-capture`. cuda.core allocates graph memory with `cuMemAllocAsync` and documents
//!   allocating from a `DeviceMemoryResource` during capture as an error, as `cuda-mem-core`
//!   refuses it. A captured `cuMemFreeAsync` of memory no allocation node made, or of a graph
//!   allocation of another graph that is not live at capture time, returns
//!   `CUDA_ERROR_INVALID_VALUE` (`cuGraphAddMemFreeNode`'s rule). A zero-byte `cuMemAllocAsync` or
//!   `cuMemAllocFromPoolAsync` on a capturing stream makes an allocation node too, with a unique
//!   non-null address that addresses no bytes and counts for no graph memory, freed as any other
//!   (as a zero-byte pool allocation outside a capture): cuda.core's `test_graph_mem_alloc_zero`
//!   allocates 0 bytes while building a graph, launches it, and passes on GPUs (it accepts a null
//!   pointer as well); whether a GPU's pointer is null, and the node, is the probe's question
//!   `zero-byte-allocation-in-capture`.
//! - **Graph memory accounting**: graph memory counts in 2 MiB granules (`USED_MEM_*` and
//!   `RESERVED_MEM_*`). A launch maps memory for each allocation of its graph that has none, and
//!   that memory stays used (`USED_MEM_CURRENT`, "memory … currently associated with graphs")
//!   after the allocation is freed, in the graph or outside it, until the executable graph is
//!   destroyed (an allocation still live then stays used until it is freed), a trim unmaps it,
//!   or its context is destroyed; relaunching reuses it. cuda.core's
//!   `test_graph_mem_set_attributes`, which passes on GPUs, frees a launched graph's allocation,
//!   synchronizes, and expects `USED_MEM_CURRENT` above 0 ("Free memory, but usage is not
//!   reduced yet"); `cuda.h` has `cuDeviceGraphMemTrim` free the blocks "not in use by a graph
//!   that is either currently executing or scheduled to execute", so a trim unmaps the memory
//!   of every freed allocation no launch still to run needs, and gives back the reserve not
//!   used; the reserve only grows otherwise (destroying a graph keeps it), and counts as device
//!   memory in use. Resetting a high-water mark (to 0, the only value allowed) sets it to the
//!   current value, as cuda.core documents. When a GPU's `USED_MEM_CURRENT` drops (after a free
//!   outside the graph or in it, a relaunch, destroying the executable graph, a trim) is the
//!   probe's questions `graph-memory-accounting` and `graph-memory-release`.
//! - **Calls that need captured work to have run invalidate the capture.** `cuda.h` documents
//!   this for `cuCtxRecordEvent` and `cuCtxWaitEvent` and documents the statuses and errors, but
//!   not the list of calls; the simulator takes the CUDA programming guide's ("it is invalid to
//!   synchronize or query the execution status of a stream which is being captured or a captured
//!   event … or a broader handle which encompasses an active stream capture"):
//!   `cuStreamSynchronize` and `cuStreamQuery` on the capturing stream return
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`; `cuEventSynchronize`, `cuEventQuery` and
//!   `cuEventElapsedTime` (which asks what `cuEventQuery` asks, of both its events) on an event
//!   last recorded in a capture return `CUDA_ERROR_CAPTURED_EVENT` (also after the capture
//!   ended, until the event is recorded outside one: it was "last recorded in a capturing
//!   stream") and invalidate that capture if it is still active; `cuCtxSynchronize` while any
//!   stream of the context captures returns `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and
//!   invalidates every such capture; any use of the legacy stream (work, a wait, a query, a
//!   synchronous copy or memset) while a blocking stream of its context captures returns
//!   `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and invalidates those captures (`cuStreamIsCapturing`
//!   on it returns the error without invalidating, as documented). Once a capture is
//!   invalidated, its work is discarded; work, waits and queries on its stream return
//!   `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (the error's own description) until
//!   `cuStreamEndCapture`, which ends it with that error and a NULL graph (`cuda.h` documents the
//!   NULL graph).
//!   Settled by the probe's question `capture-conflicts`.
//! - **Capture modes' "potentially unsafe" calls** (see the `capture` module for when a thread is
//!   prohibited from them): `cuda.h` gives `cudaMalloc` as an example, not a list. The simulator
//!   refuses the calls that allocate or free memory synchronously: `cuMemAlloc`, `cuMemFree`,
//!   `cuMemAllocHost`, `cuMemFreeHost`, `cuMemAllocManaged` (`cuda.h`'s example, `cudaMalloc`, is
//!   unsafe because the allocation is "not enqueued asynchronously to a stream", which holds for
//!   each of these) and `cuMemPoolCreate` (on an H100 a global-mode capture refused other threads'
//!   `cuMemPoolCreate`). The error is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (its description:
//!   "not permitted when the stream is capturing"), and the captures that prohibited the call are
//!   invalidated, the stricter reading (a GPU may leave them valid: the probe's question
//!   `unsafe-call-invalidates`). The VMM calls, pool destruction and host registration are not
//!   refused (no evidence yet).
//! - **User objects** (see the `user_object` module): `cuUserObjectCreate` with a null destructor
//!   or an initial count of 0 returns `CUDA_ERROR_INVALID_VALUE` (the count must be "nonzero" in
//!   the other calls). Releasing more references than user code owns (`cuUserObjectRelease`, or
//!   moving them with `CU_GRAPH_USER_OBJECT_MOVE`) or than a graph holds
//!   (`cuGraphReleaseUserObject`), and using a handle once its object is destroyed, return
//!   `CUDA_ERROR_INVALID_VALUE` (`cuda.h`: undefined behaviour); the references of all user
//!   code's threads are counted together. An executable graph holds references of its own to
//!   what its graph held when it was instantiated, released when it is destroyed and its launches
//!   have completed (as the CUDA programming guide describes). `cuGraphExecUpdate` is not
//!   exported (cuda.core uses it only for `Graph.update`): cuda.bindings reports
//!   `CUDA_ERROR_NOT_FOUND` for it. Where a driver runs destructors, and whether they can call
//!   it, is the probe's question `user-object-destructor-thread`.
//! - **Memory gone before work touches it is an illegal address.** A GPU faults when work
//!   touches memory no longer mapped (`CUDA_ERROR_ILLEGAL_ADDRESS`, sticky: "the context cannot
//!   be used"). The simulator checks a graph launch's copies and memsets at the launch: memory a
//!   captured node touches must still be the memory it was at capture time (the same live
//!   allocation, a VMM range still mapped, or a graph allocation of the graph itself). A node
//!   whose memory is gone does not run; the fault becomes the context's sticky error. Stream work
//!   on VMM memory unmapped after the work was enqueued faults the same way when it runs:
//!   `cuMemUnmap` and the work exclude each other (an unmapping waits for work touching VMM
//!   memory, and work after it sees the mapping gone), so the check cannot race with the
//!   unmapping. Stream work on a `cuMemAlloc` or pool allocation freed after it was enqueued
//!   still completes, as described under `cuMemFree` below. The sticky error is returned by
//!   `cuStreamSynchronize`, `cuStreamQuery` and `cuCtxSynchronize` once the faulting work ran,
//!   and by every later call that names the context's streams or needs its current context, or
//!   names an event created in it (`cuEventQuery`, `cuEventSynchronize`, `cuEventElapsedTime`,
//!   `cuEventDestroy`: `cuda.h` says each "may also return error codes from previous,
//!   asynchronous launches"), until the context is destroyed (a primary context reset or
//!   released). `cuEventDestroy` destroys the event all the same (`cuda.h` does not say; a
//!   handle destroyed with an error is not used again).
//!   Not probed: the fault ends the context, and `CUDA_ERROR_ILLEGAL_ADDRESS`'s own description is
//!   the evidence for it; when the check is made (at the launch, in the simulator) is the stricter
//!   reading.
//! - **A copy from pageable host memory captured into a graph** reads its source when a launch
//!   runs it, as a memcpy node does, not when it is captured (nothing is staged or waited for
//!   at the capture); `cuda.h` does not refuse pageable memory in a capture. The application
//!   must keep the source valid for every launch.
//!   Settled by the probe's question `capture-edges`.
//! - **A stream destroyed during a capture** (`cuda.h` says nothing of it) ends the capture
//!   without a graph, as an invalidated capture ends: its work is discarded, the handle of its
//!   graph (from `cuStreamGetCaptureInfo`) becomes invalid, the user object references the graph
//!   was given are released, and its graph allocations' addresses stop being live. Destroying a
//!   context ends its streams' captures so too.
//!   Settled by the probe's question `capture-edges`.
//! - **Cross-stream capture** (a stream joins a capture by waiting for an event recorded in it;
//!   `capture`'s notes) keeps `cuda.h`'s errors (`CUDA_ERROR_STREAM_CAPTURE_UNJOINED`,
//!   `_UNMATCHED`, `_MERGE`) where the documentation leaves the details open: a stream that
//!   joined must rejoin its origin even if it enqueued nothing after joining (the join counts as
//!   its work); an unjoined capture ends as an invalidated one does, its work discarded and no
//!   graph; the joined streams' work goes into the graph in the order it was enqueued (one order
//!   that keeps every dependency, not the parallel branches a GPU graph would have); a stream
//!   destroyed while joined leaves its work in the capture, which then cannot rejoin it; the
//!   default streams cannot join (the legacy stream's wait is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`,
//!   the per-thread stream's `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, as its capture is). The
//!   rehearsal of a GPU run (`CUDA_SIM_HIDE_CONTROLS=1`) found that the simulator did not model
//!   joins before 2026-11-28, where a real driver does.
//!   Settled by the probe's question `capture-dependencies` (joins and their dependency sets) and
//!   the rehearsal; the errors are `cuda.h`'s.
//! - **Not modelled in capture**: capturing the per-thread default stream (refused with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: the probe's question
//!   `per-thread-stream-during-capture`). A capturing stream's wait for an event recorded outside
//!   any capture, which `cuda.h`'s `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` may be read to forbid,
//!   is a `WAIT_EVENT` node (see the capture's nodes above): settled by the probe's questions
//!   `capture-edges` and `capture-dependencies`.
//! - **A stream-ordered free on an idle stream takes effect at once**: `cuMemFreeAsync` on a
//!   stream with no pending work, no capture and no implicit wait returns its memory to the pool
//!   before the call returns, as the stream's worker would do next; with work pending it waits
//!   its turn. The documentation promises only stream order; a GPU reaches the free as soon as
//!   it reaches the stream's end, so memory freed on an idle stream may be reused at once there
//!   too, and code that counted on a free taking time is wrong on either.
//!   Settled by the probe's question `call-edges` (an allocation right after a free on an idle
//!   stream: the same address or another).
//! - **Pool allocations of 0 bytes** (`cuMemAllocFromPoolAsync`, `cuMemAllocAsync`) succeed, as
//!   on GPUs (cuda.core's newer releases pass 0 to the driver and free what comes back with
//!   `cuMemFreeAsync`, and its zero-size tests pass on GPUs; they check only the buffer's size
//!   and device). The pointer is unique and non-null, addresses no byte (a copy or memset of one
//!   byte at a device pool's is `CUDA_ERROR_INVALID_VALUE`), counts 0 bytes in the pool's
//!   attributes, and must be freed as any other (`cuMemFreeAsync` or `cuMemFree`; twice is
//!   `CUDA_ERROR_INVALID_VALUE`): a destroyed pool waits for it, so code that skips the free of
//!   an empty allocation leaks here. It takes nothing from a shareable pool's file. Whether a
//!   GPU returns null or a pointer is the probe's question `zero-byte-pool-allocation`.
//! - **A pinned host pool's memory** (created or imported) gives no device access until
//!   `cuMemPoolSetAccess` grants it (`cuda.h`: "their default accessibility will be from the host
//!   CPU"; `cuMemPoolGetAccess` reads `NONE`); a memset into it is then
//!   `CUDA_ERROR_INVALID_VALUE`, as an H100 with driver 580 answers. Copies (`cuMemcpy*`, which
//!   the copy engine carries out) into and out of it work without a grant: cuda.core's
//!   `PinnedMemoryResource` never grants access and its tests copy into and out of its memory
//!   (its `PatternGen` helper) on GPUs. What a GPU answers for each is the probe's question
//!   `host-pool-before-access`.
//! - **Freed pool memory's bytes are reused as they were**: a pool allocation may get the host
//!   backing of one freed earlier (of any pool in the process: same length, or for device pool
//!   allocations up to 1 MiB, same power-of-two class; see `crate::blocks`), old contents
//!   included, as reused pool memory is not cleared on a GPU; code must not count on fresh pool
//!   memory being zero. Device addresses are still not reused until the arena wraps, so stale
//!   device pointers are still reported.
//!   Not a question: a GPU promises nothing about the bytes, and old bytes are the reading that
//!   catches code expecting zeros.
//! - **An unknown or destroyed pool handle** returns `CUDA_ERROR_INVALID_VALUE` (the driver's
//!   pool functions document only that code for bad arguments).
//!   Not probed: a destroyed pool's handle is undefined to use (nvbug 5698116 shows drivers
//!   recycling the values), so no answer binds.
//! - **`cuMemFreeAsync` of `cuMemAlloc` memory** returns `CUDA_ERROR_INVALID_VALUE`.
//!   Settled by the probe's question `call-edges`.
//! - **A copy or memset whose stream's device lacks access to another device's pool memory**
//!   returns `CUDA_ERROR_INVALID_VALUE` at the call (hardware would fault later). So does one
//!   touching another device's graph memory (the simulated allocation nodes give no peer access,
//!   where a GPU's captured node takes its pool's access at capture time), and a memset into
//!   another device's `cuMemAlloc` memory: a GPU needs context peer access for it
//!   (`cuCtxEnablePeerAccess`), which the simulator does not model. Copies of `cuMemAlloc` memory
//!   between devices need none, as the driver stages them.
//!   Not probed: on a GPU the copy faults when it runs, which would end the probe's context; the
//!   simulator reports the mistake earlier than a GPU, at the call.
//! - **A peer copy** (`cuMemcpyPeer`, `cuMemcpyPeerAsync`) reaches each side as the device of the
//!   context named for it, not as the stream's device: pool memory needs no access grant when
//!   named with a context of its own device, and another device's pool memory named with a
//!   context whose device has no grant is `CUDA_ERROR_INVALID_VALUE`, as in `cuMemcpyAsync`.
//!   `cuda.h` is silent. Evidence: fwyzard/nvidia_bug_3446335, a reproducer of NVIDIA bug 3446335
//!   run on GPUs, copies `cudaMallocAsync` memory between two devices with
//!   `cudaMemcpyPeer(Async)` and no access granted, where `cudaMemcpy(Async)` fails; cuda.core,
//!   whose tests pass on GPUs, copies between devices with `cuMemcpyAsync` only and expects the
//!   grant there (`test_peer_access_basic`). Neither kind of copy needs peer access between the
//!   devices. The probe's question `peer-copy-pool-access` asks two GPUs.
//! - **A managed pool with a shareable handle type** is `CUDA_ERROR_NOT_SUPPORTED` at
//!   `cuMemPoolCreate`, which `cuda.h` does not address (for a host pool it documents
//!   `CUDA_ERROR_INVALID_VALUE`, which the simulator returns, for a managed host pool too).
//!   Settled by the probe's question `call-edges`.
//! - **A pool's reserve** grows in 2 MiB chunks and shrinks only at synchronization points or on
//!   `cuMemPoolTrimTo` (see the `pool` module); `used` counts exact bytes. A failed allocation
//!   changes no attribute of the pool, the high-water marks included. Bytes freed in stream
//!   order count as outstanding for both until the host has observed their stream
//!   (`cuMemPoolTrimTo`: such frees "can count as outstanding"; the simulator takes the reading
//!   that keeps the most): a synchronization or successful query of that stream, of an event
//!   last recorded on it, or of its context (which also covers its destroyed streams); another
//!   stream's synchronization does not count.
//!   Waiting for an event counts the frees its stream ran before the recording, not those
//!   after it (each free notes how many recordings on its stream had completed; the simulator
//!   keeps up to 16 such counts per stream and pool, and beyond that merges the oldest two under
//!   the later count, which only keeps memory outstanding longer). An event recorded by a graph
//!   launch, or last recorded by another process, shows no stream's frees. A destroyed pool
//!   gives back its reserve once its last free has run, observed or not (`cuMemPoolDestroy`).
//!   Before 2026-11-29 frees counted as settled as soon as the stream ran them; the first model
//!   of that day also let waiting for an event settle the frees enqueued after its recording.
//! - **Sizes whose rounding or accounting does not fit in 64 bits** (a pool allocation of
//!   `SIZE_MAX` bytes, a shareable pool's `maxSize`, `cuMemCreate`, `cuMemAddressReserve`) are
//!   `CUDA_ERROR_OUT_OF_MEMORY`, which each of these functions documents, and change nothing.
//!   Settled by the probe's question `call-edges` (a pool allocation of `SIZE_MAX` bytes).
//! - **nvbug 5698116 is modelled where it arises, a recycled pool handle**: by default every
//!   pool gets a handle value never used before (so a destroyed pool's handle is always
//!   detected) and starts with no peer access. With `CUDA_SIM_POOL_HANDLES=recycle`, a device
//!   pool that is gone (destroyed, its last allocation freed) gives its handle value to the next
//!   pool created on its device, or imported there (since 2026-11-29: a library that keeps a
//!   table of pool handles must not take an import's recycled handle for the gone pool's), with
//!   the peer access it still had when destroyed, as the bug
//!   report describes ("the driver may hand a recycled pool handle to a new pool with the
//!   previous pool's peer-access state"); a pool destroyed while allocations are outstanding is
//!   not gone, and the next pool gets a new value. Code that must revoke access before
//!   destroying a pool is tested under `recycle`. Until 2026-11-25 the simulator passed the
//!   access on to a pool with a new handle too, which no report describes.
//!   Settled by the probe's question `peer-access-after-destroy`.
//! - **PCI bus ids**: `cuDeviceGetPCIBusId` writes
//!   `domain:bus:device.function` in lowercase hexadecimal with a 4-digit domain
//!   (`0000:01:00.0`), from the physical device's `PCI_DOMAIN_ID` (0), `PCI_BUS_ID` (physical
//!   index + 1) and `PCI_DEVICE_ID` (0) attributes, function 0. A buffer of fewer than the 13
//!   characters `cuda.h` asks for (NUL included), a negative length or a null buffer is
//!   `CUDA_ERROR_INVALID_VALUE`: the string is never cut short. `cuDeviceGetByPCIBusId` takes
//!   the three forms `cuda.h` lists, hexadecimal in either case; anything else (spaces, empty
//!   parts, a fourth part) is `CUDA_ERROR_INVALID_VALUE`, and a well-formed id of no visible
//!   device `CUDA_ERROR_INVALID_DEVICE`.
//!   Settled by the probe's question `pci-bus-id`.
//! - **`cuMemFree` never waits for work still using the memory.** `cuda.h`: it "will not
//!   perform any implicit synchronization" for stream-ordered memory, and "may" for other
//!   pointers; the API synchronization behavior page says nothing more. The simulator reads
//!   "may" as "does not": `cuMemFree` returns at once, work already enqueued on the memory
//!   still completes (on memory no longer the caller's), and every later use of the pointer is
//!   `CUDA_ERROR_INVALID_VALUE`. Code must synchronize before freeing. Whether a GPU waits is the
//!   probe's question `free-with-pending-work`.
//! - **No current context is needed** by `cuEventQuery`, `cuEventSynchronize`, `cuEventDestroy`,
//!   `cuEventElapsedTime` and `cuStreamDestroy`, although `cuda.h` lists
//!   `CUDA_ERROR_INVALID_CONTEXT` for each (generically, as for most calls): the handle names its
//!   context, and real drivers do not require one current (`cuda-mem-core`'s event and stream
//!   drops bind the handle's context all the same). The event calls still report the sticky error
//!   of the event's context. `cuMemFree` and `cuMemFreeHost` (both listing
//!   `CUDA_ERROR_INVALID_CONTEXT` too) need none either: the pointer names its allocation, freed
//!   whatever context is current, another device's or none, and no context's sticky error is
//!   reported; `cuMemAlloc` memory of a context destroyed since is gone with it
//!   (`CUDA_ERROR_INVALID_VALUE`).
//!   Settled by the probe's question `call-edges` (event calls and `cuMemFree` on a thread with no
//!   current context).
//! - **Address hints** (`cuMemAddressReserve`) are honoured whenever the range is free and
//!   aligned, unless `CUDA_SIM_ADDRESS_HINTS` says otherwise: `refuse-all` honours none,
//!   `refuse-every-N` refuses every N-th call that gives a hint. The driver need not honour a
//!   hint (an H100 moved 32 of 511 in-place growth steps of `cuda-mem-vmm`), so code that asks
//!   for an address must work at another one; a refused hint's reservation starts elsewhere
//!   even when the hinted range is free.
//!   Settled by the probe's question `address-hint`.
//! - **A zero-length copy or memset at a one-past-the-end device pointer** returns
//!   `CUDA_ERROR_INVALID_VALUE` (the pointer is not inside a live allocation).
//!   Settled by the probe's question `call-edges`.
//! - **Pool sharing**: importing a pointer into the pool that exported it (rather than into an
//!   imported pool) returns `CUDA_ERROR_INVALID_VALUE`; exported pointer data carries a checksum,
//!   so any altered byte is refused; a duplicate import in one process returns the same pointer
//!   without counting (as the driver does), so the second free fails.
//!   Settled by the probe's questions `pointer-import-two-pools` and `pool-import-twice`.
//! - **An exporter that frees before its importers** (`cuda.h`, `cuMemPoolImportPointer`: "The
//!   imported memory must be freed from all importing processes before being freed in the
//!   exporting process"; what happens otherwise is not documented): when the exporter's free
//!   runs while an imported pool, in any process, still maps the allocation, its bytes are
//!   overwritten with `0xdb`, the free is reported on stderr, and the range is kept out of the
//!   pool's next allocations until no importer maps it. A GPU's pool would hand the memory to
//!   the next allocation and the importer would read it, silently; the poison shows the mistake
//!   at once in whatever the importer reads, the quarantine keeps the exporter's next buffers
//!   whole. Export data of an allocation its exporter freed no longer imports
//!   (`CUDA_ERROR_INVALID_VALUE`), even where it is still mapped, nor does any export data of a
//!   pool whose exporting process is gone. The processes see each other's holds through
//!   byte-range locks on the pool's file (`holds.rs`), which the kernel drops with a process
//!   that dies, as the driver forgets a dead process's imports, and the exporter's live
//!   allocations through a tag per allocation in the file (`shared.rs`). What a GPU does is the
//!   probe's question `exporter-frees-first`.
//! - **Fabric handles without an IMEX channel**: `cuda.h` says that fabric sharing needs an IMEX
//!   channel the user can access, and documents `CUDA_ERROR_NOT_PERMITTED` for an importer not
//!   granted the exporter's channel; what creating fabric-shareable memory without any channel
//!   returns it does not say. Libraries that met it report `CUDA_ERROR_NOT_PERMITTED` from
//!   `cuMemCreate` in a container without a channel while
//!   `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` reads 1 (MoonshotAI/MoonEP#28,
//!   microsoft/mscclpp#467), so the simulator does the same: a process has no channel unless
//!   `CUDA_SIM_IMEX_CHANNEL` grants one, its `cuMemCreate` with the fabric handle type is
//!   `CUDA_ERROR_NOT_PERMITTED`, and a fabric handle carries its exporter's channel, which the
//!   importer must have. Until 2026-11-29 fabric handles worked without any channel.
//!   Settled by the probe's question `fabric-channel`.
//! - **A second import of one pool** (`cuMemPoolImportFromShareableHandle` of a pool this
//!   process has imported already) gets a handle of its own; the documentation does not say
//!   either way. `CUDA_SIM_POOL_IMPORT=same-handle` models the other reading: the first import's
//!   handle comes back, uncounted, so one `cuMemPoolDestroy` destroys the pool for both; code
//!   that imports a pool twice is tested against both.
//!   Settled by the probe's question `pool-import-twice`.
//! - **VMM**: reservation sizes and hints must be multiples of the host page; mappings and
//!   physical sizes must be multiples of the granularity (2 MiB on every simulated device); a
//!   `cuMemSetAccess` range must start and end on the granularity and be made of whole mappings
//!   (`cuda.h`: "a fully mapped address range containing all allocations"; access is kept per
//!   mapping, so a grant never reaches past the range it names), else `CUDA_ERROR_INVALID_VALUE`;
//!   `cuMemGetAllocationGranularity` refuses plain host memory with a handle type
//!   (`CUDA_ERROR_INVALID_VALUE`, as `cuMemCreate` documents; its own documentation says
//!   nothing of it); `cuMemMap` needs offset 0 (cuda.h: "currently must be zero") and a range
//!   inside one reservation; `cuMemUnmap` takes whole mappings only; `cuMemAddressFree` takes
//!   a whole reservation with nothing mapped in it; access must be granted, even to the owning
//!   device, before a copy or memset touches the memory (`CUDA_ERROR_INVALID_VALUE` otherwise);
//!   a device that cannot reach the memory's device cannot be given access
//!   (`CUDA_ERROR_INVALID_DEVICE`); GPUDirect RDMA, compression and usage flags are
//!   `CUDA_ERROR_NOT_SUPPORTED`; VMM memory is never host-accessible here, even host-located
//!   memory (the simulator reaches it through its own alias); pointer attributes do not describe
//!   VMM addresses.
//!   Settled in part by the probe's questions `address-hint`, `address-range` and `vmm-map-past-
//!   the-allocation`; the rest follows `cuMemMap`'s and `cuMemSetAccess`'s stated requirements.
//! - **The files behind shared memory** (a POSIX-fd shareable pool's `memfd`, a VMM
//!   allocation's) are sealed at their size (`F_SEAL_SHRINK`, `F_SEAL_GROW`, `F_SEAL_SEAL`), so an
//!   importer's `ftruncate` fails with `EPERM` instead of killing every process that maps the
//!   file with `SIGBUS`. An import (`cuMemPoolImportFromShareableHandle`,
//!   `cuMemImportFromShareableHandle`) refuses a file that is not sealed so, whose size is not
//!   the one its header states, or whose header fails its checksum: `CUDA_ERROR_INVALID_VALUE`,
//!   the code both document for a bad handle. So is a descriptor of another kind of file
//!   (`/dev/null`, a socket, an unsealed memfd, a regular file: the probe
//!   `pool-import-not-a-pool` asks a GPU's driver the same).
//! - **Fabric handles** name the exporting process and its descriptor for the memory, so an
//!   import works only while the exporter holds the allocation.
//!   Settled by the probe's question `fabric-channel` (on a machine with an IMEX channel).
//! - **Interprocess events** (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): exporting an event
//!   created without `CU_EVENT_INTERPROCESS` is `CUDA_ERROR_INVALID_HANDLE` (the event is the
//!   argument at fault; the runtime's counterpart answers `cudaErrorInvalidResourceHandle`). A
//!   handle names the exporting process and its descriptor for the event's shared progress, so it
//!   opens only while the exporter holds the event (cuda.h: using it after the exporter destroyed
//!   the event is undefined). Opening a handle in the process that exported it, which cuda.h
//!   neither allows nor forbids, is refused with `CUDA_ERROR_INVALID_VALUE`, as are forged and
//!   stale handles: code that works here never depends on it. Both processes may record the
//!   event; its latest recording, from either, is what queries and waits see. A stream waiting
//!   for another process's recording polls its progress (20 µs to 1 ms apart), so such a wait
//!   may end up to a millisecond late, never early.
//!   Settled by the probe's question `ipc-event`.
//! - **`CUDA_VISIBLE_DEVICES` entries** are read as narrowly as the CUDA documentation's
//!   examples: a decimal index (no sign, no spaces), or `GPU-` and the UUID's lowercase hex as
//!   `nvidia-smi` prints it, whole or a prefix that matches exactly one device. Anything else
//!   (spaces around an entry, uppercase hex, a UUID without `GPU-`, a bare `GPU-`, `MIG-…`: no
//!   simulated device is in MIG mode) is an invalid entry, which, as documented, hides it and
//!   every entry after it; so is a second mention of one device. An empty value hides every
//!   device (`cuInit` returns `CUDA_ERROR_NO_DEVICE`), as with the real driver.
//!   Settled by the probe's question `visible-devices` (a child started with each form counts the
//!   devices it sees).
//! - **An imported pool or VMM allocation on a device this process does not see** (hidden by
//!   `CUDA_VISIBLE_DEVICES`) is refused: `cuMemPoolImportFromShareableHandle` and
//!   `cuMemImportFromShareableHandle` (file descriptor or fabric handle) return
//!   `CUDA_ERROR_INVALID_VALUE`, which `cuda.h` documents for both; what the real driver does is
//!   not documented. Such records name the device by its physical index, so processes that
//!   number the devices differently agree on which one it is.
//!   Settled by the probe's question `hidden-device-import` (the pool import; it needs two GPUs),
//!   which a VMM import would follow.
//! - **Managed memory operations** (`cuMemAdvise`, `cuMemPrefetchAsync`, the batched prefetches
//!   and discards, `cuMemRangeGetAttribute(s)`; see `api::managed`) accept managed memory only,
//!   `cuMemAllocManaged`'s or a managed pool's (cuda.core advises pool memory; the pointer
//!   attribute `IS_MANAGED` is still false for it, as on the driver); system-allocated pageable
//!   memory, which `cuda.h` allows only with `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS` (0 on
//!   every simulated device), is `CUDA_ERROR_INVALID_VALUE`, as are a zero count and a range that
//!   leaves its allocation's last page (the documentation says neither). Each needs a current
//!   context (`cuMemRangeGetAttributes` documents `CUDA_ERROR_INVALID_CONTEXT`; the others are
//!   read the same way).
//!   Settled by the probe's question `managed-range-errors`.
//! - **Advice and prefetch locations**: a device that lacks concurrent managed access, or an
//!   ordinal that names none, is `CUDA_ERROR_INVALID_DEVICE`; a host NUMA node other than 0 (the
//!   simulated host's only node, also the calling thread's) and a location type an advice does
//!   not take are `CUDA_ERROR_INVALID_VALUE`. When `CUDA_SIM_DEVICE_ATTRIBUTES` reports
//!   `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` (89) as 0, the managed operations behave as
//!   on such devices, and the batched calls, which need it on every device ("otherwise the API
//!   will return an error", code unnamed), return `CUDA_ERROR_NOT_SUPPORTED`.
//!   Settled by the probe's questions `managed-range-errors` and `managed-ignored-location-ids` (a
//!   device without concurrent managed access needs such a GPU).
//! - **Batched prefetches and discards** on the legacy NULL stream ("must not be") and with an
//!   empty or malformed location table (no entry, more entries than operations, a first index
//!   other than 0, indices not increasing or past the last operation) return
//!   `CUDA_ERROR_INVALID_VALUE`; every operation is checked before any is recorded or enqueued.
//!   Settled in part by the probe's question `managed-discard`; the location table's rules follow
//!   `cuda.h`'s description of it.
//! - **A discard** overwrites the discarded pages with `0xDB` in stream order, so code that
//!   reads discarded memory without writing or prefetching it first sees wrong values ("an
//!   indeterminate value"); a prefetch moves nothing (the memory is host memory here) but runs in
//!   stream order, and the last prefetch location is recorded when the call is made (what the
//!   application requested, as documented).
//!   Settled by the probe's question `managed-discard`.
//! - **Range attributes' ids where the type says to ignore them** (`PREFERRED_LOCATION_ID` and
//!   `LAST_PREFETCH_LOCATION_ID` for the host or no location) read `CU_DEVICE_INVALID`; the
//!   legacy `PREFERRED_LOCATION` and `LAST_PREFETCH_LOCATION` report a host NUMA node as
//!   `CU_DEVICE_CPU` (it is the CPU); `ACCESSED_BY` lists devices in ordinal order, then the
//!   host as `CU_DEVICE_CPU`.
//!   Settled by the probe's question `managed-ignored-location-ids`.
//! - **Copies with attributes** (`cuMemcpyBatchAsync`, `cuMemcpyWithAttributesAsync`; see
//!   `api::copy_batch`): on a capturing stream they return `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
//!   and leave the capture valid (no graph node represents them; RAPIDS reported exactly this of
//!   `cudaMemcpyBatchAsync` on CUDA 13, rapidsai/rmm#2518, and cuda.core refuses both under
//!   capture); `cuda.h` says nothing of capture. A zero-byte copy is `CUDA_ERROR_INVALID_VALUE`
//!   (the batch's sizes are not documented to allow 0). Copies of one batch that depend on each
//!   other (one writes a byte another reads or writes: "undefined behavior", as `cuda.h` puts
//!   it) are refused with `CUDA_ERROR_INVALID_VALUE` before anything is enqueued, so the
//!   mistake shows here instead of as wrong bytes on a GPU; a copy's own source and destination
//!   may overlap. A malformed location hint (an unknown type, a device ordinal the process does
//!   not have, a host NUMA node other than 0) is `CUDA_ERROR_INVALID_VALUE`, although the
//!   hints are otherwise ignored (the simulator's managed memory never moves). The source of a
//!   `CU_MEMCPY_SRC_ACCESS_ORDER_ANY` copy is read at the call, as `DURING_API_CALL`'s is: of
//!   the times the order allows ("out of stream order and the accesses can happen even after
//!   the API call returns") the one that shows a source still written by earlier work, which
//!   the caller must not let happen; until 2026-11-29 it was read in stream order, the one time
//!   that hides it. The attribute flags take
//!   only `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`. What a GPU does with a zero-byte copy,
//!   dependent copies, a capture and a malformed hint is the probe's question
//!   `batch-copy-edges`.
//! - **An older driver** (`CUDA_SIM_DRIVER_VERSION`) is pretended to by `cuDriverGetVersion` and
//!   `cuGetProcAddress` alone: the simulator still exports every symbol it implements, so `dlsym`
//!   finds functions the pretended driver did not have, and they behave as CUDA 13.0's. A
//!   library's version checks, which come before such calls, are what the setting tests. Before
//!   CUDA 12.0 `cuGetProcAddress_v2` answers every request `CUDA_ERROR_NOT_FOUND` with
//!   `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` (a driver of that age has no such entry point).
//!   A version up to 13020 (CUDA 13.2) makes `cuMemcpyWithAttributesAsync`, which `cuda.h` 13.0
//!   does not declare, available; called through `dlsym` on a simulator reporting less than 13.2
//!   it returns `CUDA_ERROR_NOT_SUPPORTED`.
//!   Enum values an older driver did not know are refused where the simulator checks them: the
//!   typed location attributes of `cuMemRangeGetAttribute(s)` (`PREFERRED_LOCATION_TYPE` to
//!   `LAST_PREFETCH_LOCATION_ID`, CUDA 12.2) are `CUDA_ERROR_INVALID_VALUE` below 12.2, as an
//!   unknown attribute is (`cuda.h` documents no other code for it); so is every
//!   `cuDeviceGetAttribute` attribute newer than the pretended driver (`HOST_NUMA_ID` below 12.2,
//!   `HANDLE_TYPE_FABRIC_SUPPORTED` below 12.3, `MEMPOOL_SUPPORTED_HANDLE_TYPES` below 11.3, as
//!   NVIDIA's programming guide says of the last), even with a `CUDA_SIM_DEVICE_ATTRIBUTES`
//!   value for it. `cuda.h` does not say when an attribute came; the table (`device.rs`,
//!   `ATTRIBUTE_VERSIONS`) takes each release's `cuda.h` enum from 11.4 on, and before that is
//!   partly a reading: 116 to 118 (GPUDirect RDMA) are put at 11.3 with
//!   `cuFlushGPUDirectRDMAWrites` (`PFN_…_v11030`), 112 and 113 (sparse arrays, read-only host
//!   registration) at 11.1 and 114 (timeline semaphores) at 11.2, the releases of what they
//!   describe. Attributes not in the table are taken as known to CUDA 11.0, the oldest version
//!   the setting takes.
//!   Not a question for a GPU: it describes the simulator's pretence, which the tests of each
//!   library's version checks rely on.
