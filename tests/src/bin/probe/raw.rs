//! Driver calls as the probes record them: what a call returned, by name, and the queries the
//! probes share (capture status, pool attributes, pool access, free memory), each one raw call
//! through `cuda_mem_sys`.

use std::ffi::{c_int, c_void};

use cuda_mem_sys::types::{
    CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUgraph, CUgraphNode, CUgraphNodeType, CUmem_advise,
    CUmem_range_attribute, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType, CUmemAllocationType,
    CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUstream,
    CUstreamCaptureStatus,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

/// What one driver call returned.
pub(crate) type Call = Result<(), CudaError>;

/// `CU_STREAM_LEGACY`: the legacy default stream, whichever default the functions were resolved
/// with.
pub(crate) const LEGACY: CUstream = 0x1 as CUstream;
/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub(crate) const PER_THREAD: CUstream = 0x2 as CUstream;

/// The POSIX file descriptor handle type, the one cuda-mem shares pools with.
pub(crate) const POSIX_FD: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// A call's outcome as the report shows it: `CUDA_SUCCESS`, the error's name, or why the driver
/// could not provide the function.
pub(crate) fn code<T>(result: &Result<T, CudaError>) -> String {
    match result {
        Ok(_) => "CUDA_SUCCESS".to_string(),
        Err(CudaError::Driver(e)) => e.name.to_string(),
        Err(CudaError::Load(e)) => format!("unavailable ({e})"),
    }
}

/// The name of a failed call's error, for a result whose value is not shown.
pub(crate) fn error_code(error: CudaError) -> String {
    code::<()>(&Err(error))
}

/// The location of device `ordinal`.
pub(crate) fn device_location(ordinal: c_int) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal }
}

/// The host location (`CU_MEM_LOCATION_TYPE_HOST`).
pub(crate) fn host_location() -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 }
}

/// The host NUMA node `node`.
pub(crate) fn host_numa_location(node: c_int) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: node }
}

/// The properties of a pinned pool at `location`: shareable by POSIX file descriptor or not,
/// with a maximum size (0: none).
pub(crate) fn pool_props(location: CUmemLocation, shareable: bool, max_size: usize) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: if shareable { POSIX_FD } else { CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE },
        location,
        maxSize: max_size,
        ..CUmemPoolProps::default()
    }
}

/// The number of devices the driver reports.
pub(crate) fn device_count() -> Result<c_int, CudaError> {
    let d = driver()?;
    let mut count = 0;
    // SAFETY: `count` is a valid, writable int for the duration of the call.
    unsafe { cu_call!(d, cuDeviceGetCount(&mut count)) }?;
    Ok(count)
}

/// One attribute of device `ordinal`.
pub(crate) fn device_attribute(ordinal: c_int, attribute: CUdevice_attribute) -> Result<c_int, CudaError> {
    let d = driver()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGet(&mut device, ordinal)) }?;
    let mut value = 0;
    // SAFETY: `value` is a valid out-pointer; `device` came from the driver.
    unsafe { cu_call!(d, cuDeviceGetAttribute(&mut value, attribute, device)) }?;
    Ok(value)
}

/// `cuDeviceCanAccessPeer`: whether device `ordinal` can access device `peer`'s memory.
pub(crate) fn can_access_peer(ordinal: c_int, peer: c_int) -> Result<bool, CudaError> {
    let d = driver()?;
    let (mut device, mut peer_device): (CUdevice, CUdevice) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe { cu_call!(d, cuDeviceGet(&mut device, ordinal)) }?;
    // SAFETY: as above.
    unsafe { cu_call!(d, cuDeviceGet(&mut peer_device, peer)) }?;
    let mut can = 0;
    // SAFETY: `can` is a valid out-pointer; both devices came from the driver.
    unsafe { cu_call!(d, cuDeviceCanAccessPeer(&mut can, device, peer_device)) }?;
    Ok(can != 0)
}

/// The name of device `ordinal`.
pub(crate) fn device_name(ordinal: c_int) -> Result<String, CudaError> {
    let d = driver()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGet(&mut device, ordinal)) }?;
    let mut name = [0u8; 256];
    // SAFETY: `name` is writable for the length given; the driver NUL-terminates within it.
    unsafe { cu_call!(d, cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as c_int, device)) }?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// The capture status of `stream` as `cuStreamIsCapturing` reports it (`NONE`, `ACTIVE`,
/// `INVALIDATED`), or the error it returned.
pub(crate) fn capture_status(stream: CUstream) -> String {
    let status = (|| {
        let d = driver()?;
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `status` is a valid out-pointer; the stream is a live stream or a special handle.
        unsafe { cu_call!(d, cuStreamIsCapturing(stream, &mut status)) }?;
        Ok::<_, CudaError>(status)
    })();
    match status {
        Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) => "NONE".to_string(),
        Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE) => "ACTIVE".to_string(),
        Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED) => "INVALIDATED".to_string(),
        Ok(other) => format!("status {}", other.0),
        Err(e) => error_code(e),
    }
}

/// A pool attribute that is a 64-bit count (the usage and high-water marks).
pub(crate) fn pool_attribute(pool: CUmemoryPool, attribute: CUmemPool_attribute) -> Result<u64, CudaError> {
    let d = driver()?;
    let mut value: u64 = 0;
    // SAFETY: `value` is a valid out-pointer for the 64-bit attributes this is called with.
    unsafe { cu_call!(d, cuMemPoolGetAttribute(pool, attribute, (&raw mut value).cast::<c_void>())) }?;
    Ok(value)
}

/// The four usage counts of a pool (reserved and used, current and high), in one line; a
/// failed read shows its error.
pub(crate) fn pool_usage(pool: CUmemoryPool) -> String {
    use CUmemPool_attribute as A;
    let attributes = [
        ("reserved", A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        ("reserved_high", A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
        ("used", A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        ("used_high", A::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
    ];
    attributes
        .iter()
        .map(|(name, attribute)| match pool_attribute(pool, *attribute) {
            Ok(value) => format!("{name}={value}"),
            Err(e) => format!("{name}={}", error_code(e)),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The access `location` has to `pool` (`READWRITE`, `READ`, `NONE`), or the error the query
/// returned.
pub(crate) fn pool_access(pool: CUmemoryPool, location: CUmemLocation) -> String {
    let access = (|| {
        let d = driver()?;
        let mut location = location;
        let mut flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        // SAFETY: `flags` and `location` are valid for the call.
        unsafe { cu_call!(d, cuMemPoolGetAccess(&mut flags, pool, &mut location)) }?;
        Ok::<_, CudaError>(flags)
    })();
    match access {
        Ok(CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE) => "READWRITE".to_string(),
        Ok(CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ) => "READ".to_string(),
        Ok(CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE) => "NONE".to_string(),
        Ok(other) => format!("flags {}", other.0),
        Err(e) => error_code(e),
    }
}

/// Sets `location`'s access to `pool` (`cuMemPoolSetAccess` with one descriptor).
pub(crate) fn set_pool_access(pool: CUmemoryPool, location: CUmemLocation, flags: CUmemAccess_flags) -> Call {
    let d = driver()?;
    let desc = CUmemAccessDesc { location, flags };
    // SAFETY: one descriptor, valid for the read; the pool is the caller's, alive.
    unsafe { cu_call!(d, cuMemPoolSetAccess(pool, &desc, 1)) }
}

/// Free and total memory of the current context's device, in bytes.
pub(crate) fn memory_info() -> Result<(usize, usize), CudaError> {
    let d = driver()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(d, cuMemGetInfo_v2(&mut free, &mut total)) }?;
    Ok((free, total))
}

/// Imports a pool from a POSIX file descriptor: the call's outcome and the handle.
pub(crate) fn import_pool(fd: c_int) -> Result<CUmemoryPool, CudaError> {
    let d = driver()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // The driver takes the descriptor as a pointer-sized integer.
    let handle = fd as isize as *mut c_void;
    // SAFETY: `pool` is a valid out-pointer; the descriptor is only read by the driver.
    unsafe { cu_call!(d, cuMemPoolImportFromShareableHandle(&mut pool, handle, POSIX_FD, 0)) }?;
    Ok(pool)
}

/// `cuMemPoolDestroy` of a pool whose handle the caller gives up.
pub(crate) fn destroy_pool(pool: CUmemoryPool) -> Call {
    let d = driver()?;
    // SAFETY: the handle is one the driver returned; the caller no longer uses it after this.
    unsafe { cu_call!(d, cuMemPoolDestroy(pool)) }
}

/// `cuStreamQuery` on any stream (a special handle included).
pub(crate) fn stream_query(stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: the stream is a live stream of the caller's or a special handle.
    unsafe { cu_call!(d, cuStreamQuery(stream)) }
}

/// `cuStreamSynchronize` on any stream (a special handle included).
pub(crate) fn stream_synchronize(stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: the stream is a live stream of the caller's or a special handle.
    unsafe { cu_call!(d, cuStreamSynchronize(stream)) }
}

/// `cuStreamWaitEvent`: later work on `stream` waits for `event`.
pub(crate) fn stream_wait_event(stream: CUstream, event: CUevent) -> Call {
    let d = driver()?;
    // SAFETY: the stream and the event are the caller's, alive.
    unsafe { cu_call!(d, cuStreamWaitEvent(stream, event, 0)) }
}

/// `cuEventSynchronize`.
pub(crate) fn event_synchronize(event: CUevent) -> Call {
    let d = driver()?;
    // SAFETY: the event is the caller's, alive.
    unsafe { cu_call!(d, cuEventSynchronize(event)) }
}

/// `cuCtxSynchronize` of the current context.
pub(crate) fn context_synchronize() -> Call {
    let d = driver()?;
    // SAFETY: no arguments; the probe's context is current.
    unsafe { cu_call!(d, cuCtxSynchronize()) }
}

/// `cuMemsetD8Async` of `len` bytes at `ptr` on `stream`.
pub(crate) fn memset_async(ptr: CUdeviceptr, value: u8, len: usize, stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: `ptr..ptr + len` is device memory the caller owns; the stream is alive.
    unsafe { cu_call!(d, cuMemsetD8Async(ptr, value, len, stream)) }
}

/// `cuMemsetD8` (synchronous, on the legacy default stream) of `len` bytes at `ptr`.
pub(crate) fn memset_sync(ptr: CUdeviceptr, value: u8, len: usize) -> Call {
    let d = driver()?;
    // SAFETY: `ptr..ptr + len` is device memory the caller owns.
    unsafe { cu_call!(d, cuMemsetD8_v2(ptr, value, len)) }
}

/// The first byte at device address `ptr`, read with `cuMemcpyDtoH`.
pub(crate) fn read_byte(ptr: CUdeviceptr) -> Result<u8, CudaError> {
    let d = driver()?;
    let mut byte = 0u8;
    // SAFETY: `byte` is writable for the one byte copied; `ptr` is mapped device memory.
    unsafe { cu_call!(d, cuMemcpyDtoH_v2((&raw mut byte).cast(), ptr, 1)) }?;
    Ok(byte)
}

/// Why device 0 cannot answer the managed-memory questions (no managed memory, or no
/// concurrent managed access, which advice and prefetches to a device need), if it cannot.
pub(crate) fn managed_unsupported() -> Result<Option<String>, CudaError> {
    use CUdevice_attribute as A;
    if device_attribute(0, A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)? == 0 {
        return Ok(Some("not applicable: device 0 has no managed memory".to_string()));
    }
    if device_attribute(0, A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)? == 0 {
        return Ok(Some("not applicable: device 0 has no concurrent managed access".to_string()));
    }
    Ok(None)
}

/// `cuMemAdvise_v2` of `[ptr, ptr + count)`.
pub(crate) fn advise(ptr: CUdeviceptr, count: usize, advice: CUmem_advise, location: CUmemLocation) -> Call {
    let d = driver()?;
    // SAFETY: the driver only reads the range's address; it checks what memory it is.
    unsafe { cu_call!(d, cuMemAdvise_v2(ptr, count, advice, location)) }
}

/// `cuMemPrefetchAsync_v2` of `[ptr, ptr + count)` to `location` on `stream`, then the stream
/// synchronized (the first failure is the outcome).
pub(crate) fn prefetch(ptr: CUdeviceptr, count: usize, location: CUmemLocation, stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: the driver only reads the range's address and checks it; the stream is alive.
    unsafe { cu_call!(d, cuMemPrefetchAsync_v2(ptr, count, location, 0, stream)) }?;
    stream_synchronize(stream)
}

/// A 4-byte range attribute (`cuMemRangeGetAttribute`) of `[ptr, ptr + count)`, read into a
/// value preset to [`UNWRITTEN`] so that an attribute the driver leaves alone shows.
pub(crate) fn range_attribute(
    ptr: CUdeviceptr,
    count: usize,
    attribute: CUmem_range_attribute,
) -> Result<i32, CudaError> {
    let d = driver()?;
    let mut value: i32 = UNWRITTEN;
    // SAFETY: `value` is 4 writable bytes, the size given; the attributes asked are 4 bytes.
    unsafe { cu_call!(d, cuMemRangeGetAttribute((&raw mut value).cast::<c_void>(), 4, attribute, ptr, count)) }?;
    Ok(value)
}

/// What an out-value is preset to, to tell a value the driver did not write.
pub(crate) const UNWRITTEN: i32 = 0x7EAD_BEEF;

/// `cuMemcpyDtoH` of `len` bytes at device address `ptr`.
pub(crate) fn read_bytes(ptr: CUdeviceptr, len: usize) -> Result<Vec<u8>, CudaError> {
    let d = driver()?;
    let mut bytes = vec![0u8; len];
    // SAFETY: `bytes` is writable for `len` bytes; the driver checks `ptr..ptr + len`.
    unsafe { cu_call!(d, cuMemcpyDtoH_v2(bytes.as_mut_ptr().cast(), ptr, len)) }?;
    Ok(bytes)
}

/// The node types of `graph` in the order `cuGraphGetNodes` lists them (`MEMSET, GRAPH`), or
/// why they could not be listed.
pub(crate) fn graph_node_types(graph: CUgraph) -> String {
    let listed = (|| {
        let d = driver()?;
        let mut count = 0usize;
        // SAFETY: a NULL node array asks for the count only, written to `count`.
        unsafe { cu_call!(d, cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)) }?;
        let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
        // SAFETY: `nodes` has room for `count` handles, the count passed.
        unsafe { cu_call!(d, cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) }?;
        nodes.truncate(count);
        let mut types = Vec::new();
        for node in nodes {
            let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `kind` is a valid out-pointer; the node belongs to the live graph.
            unsafe { cu_call!(d, cuGraphNodeGetType(node, &mut kind)) }?;
            types.push(node_type_name(kind));
        }
        Ok::<_, CudaError>(types)
    })();
    match listed {
        Ok(types) if types.is_empty() => "none".to_string(),
        Ok(types) => types.join(", "),
        Err(CudaError::Load(_)) => "not listed (no cuGraphGetNodes)".to_string(),
        Err(e) => format!("not listed ({})", error_code(e)),
    }
}

/// A node type's name without its `CU_GRAPH_NODE_TYPE_` prefix.
pub(crate) fn node_type_name(kind: CUgraphNodeType) -> String {
    use CUgraphNodeType as T;
    let name = match kind {
        T::CU_GRAPH_NODE_TYPE_KERNEL => "KERNEL",
        T::CU_GRAPH_NODE_TYPE_MEMCPY => "MEMCPY",
        T::CU_GRAPH_NODE_TYPE_MEMSET => "MEMSET",
        T::CU_GRAPH_NODE_TYPE_HOST => "HOST",
        T::CU_GRAPH_NODE_TYPE_GRAPH => "GRAPH",
        T::CU_GRAPH_NODE_TYPE_EMPTY => "EMPTY",
        T::CU_GRAPH_NODE_TYPE_WAIT_EVENT => "WAIT_EVENT",
        T::CU_GRAPH_NODE_TYPE_EVENT_RECORD => "EVENT_RECORD",
        T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => "MEM_ALLOC",
        T::CU_GRAPH_NODE_TYPE_MEM_FREE => "MEM_FREE",
        T::CU_GRAPH_NODE_TYPE_BATCH_MEM_OP => "BATCH_MEM_OP",
        T::CU_GRAPH_NODE_TYPE_CONDITIONAL => "CONDITIONAL",
        other => return format!("type {}", other.0),
    };
    name.to_string()
}

/// `cuMemAllocAsync` of `size` bytes on `stream` (from the device's current pool, or a graph
/// allocation node when the stream captures).
pub(crate) fn alloc_async(size: usize, stream: CUstream) -> Result<CUdeviceptr, CudaError> {
    let d = driver()?;
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; the stream is the caller's, alive.
    unsafe { cu_call!(d, cuMemAllocAsync(&mut ptr, size, stream)) }?;
    Ok(ptr)
}

/// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
pub(crate) fn driver_version() -> Result<u32, CudaError> {
    driver()?.version()
}
