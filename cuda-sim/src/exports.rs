//! The C ABI: every driver symbol the simulator exports, with the signature `cuda.h` declares.
//!
//! Each entry names the symbol `cuda.h` maps to (`cuMemcpyHtoD_v2`), optionally its
//! per-thread-default-stream twin (`cuMemcpyHtoD_v2_ptds`), and the call into [`crate::api`]
//! that implements both; `mode` tells the implementation which default stream handle 0 means.
//! [`table`] lists every symbol for `cuGetProcAddress`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use cuda_mem_sys::types::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUcontext, CUctxCreateParams, CUdevice, CUdevice_attribute, CUdeviceptr,
    CUdriverProcAddressQueryResult, CUevent, CUfunc_cache, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphMem_attribute,
    CUgraphNode, CUgraphNodeType, CUhostFn, CUipcEventHandle, CUlimit, CUmem_advise, CUmem_range_attribute,
    CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationHandleType,
    CUmemAllocationProp, CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation, CUmemPool_attribute,
    CUmemPoolProps, CUmemPoolPtrExportData, CUmemcpyAttributes, CUmemoryPool, CUpointer_attribute, CUresult, CUstream,
    CUstreamCaptureMode, CUstreamCaptureStatus, CUuserObject, CUuuid, cuuint64_t,
};

use crate::api::memory::Direction;
use crate::api::stream::Property;
use crate::api::{self, DefaultStream};
use crate::error::SimResult;

/// Runs one exported call: refuses calls from host functions, turns the result into a code, and
/// keeps a panic (a simulator bug) from unwinding into C.
fn call(f: impl FnOnce() -> SimResult) -> CUresult {
    if api::in_host_function() {
        return CUresult::CUDA_ERROR_NOT_PERMITTED;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUresult::CUDA_ERROR_UNKNOWN,
    }
}

/// Defines one exported function; `-` in place of a name defines nothing.
macro_rules! export_fn {
    (-, $($rest:tt)*) => {};
    ($name:ident, $default:expr, ($($arg:ident : $ty:ty),* $(,)?), |$mode:ident| $body:expr) => {
        #[doc = concat!("The driver's `", stringify!($name), "`, simulated.")]
        #[unsafe(no_mangle)]
        #[allow(unused_unsafe)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            if crate::fault::should_fail(stringify!($name)) {
                return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            }
            let $mode = $default;
            // SAFETY: the C caller guarantees the pointer arguments meet cuda.h's contract for
            // this function, which is what the implementation relies on.
            call(|| unsafe { $body })
        }
    };
}

/// Adds an exported function to the symbol table; `-` adds nothing.
macro_rules! table_entry {
    ($table:ident, -) => {};
    ($table:ident, $name:ident) => {
        $table.push((stringify!($name), $name as *const () as usize));
    };
}

/// Defines every export (`legacy / per_thread_or_- (args) => |mode| body;`) and [`table`].
macro_rules! exports {
    ($( $name:ident / $per_thread:tt $args:tt => |$mode:ident| $body:expr; )*) => {
        $(
            export_fn!($name, DefaultStream::Legacy, $args, |$mode| $body);
            export_fn!($per_thread, DefaultStream::PerThread, $args, |$mode| $body);
        )*

        /// Every exported symbol and its address.
        #[allow(clippy::vec_init_then_push)]
        pub(crate) fn table() -> Vec<(&'static str, usize)> {
            let mut table = Vec::new();
            $(
                table_entry!(table, $name);
                table_entry!(table, $per_thread);
            )*
            table
        }
    };
}

exports! {
    // Initialization, version, errors, entry points.
    cuInit / -(flags: c_uint) => |_mode| api::init::init(flags);
    cuDriverGetVersion / -(version: *mut c_int) => |_mode| api::init::driver_version(version);
    cuGetErrorName / -(error: CUresult, text: *mut *const c_char) => |_mode| api::init::error_text(error, text, true);
    cuGetErrorString / -(error: CUresult, text: *mut *const c_char) => |_mode| api::init::error_text(error, text, false);
    cuGetProcAddress_v2 / -(
        symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t,
        status: *mut CUdriverProcAddressQueryResult,
    ) => |_mode| crate::proc_address::get_proc_address(symbol, pfn, version, flags, status);
    cuGetProcAddress / -(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t)
        => |_mode| crate::proc_address::get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut());

    // Devices.
    cuDeviceGet / -(device: *mut CUdevice, ordinal: c_int) => |_mode| api::device::get(device, ordinal);
    cuDeviceGetCount / -(count: *mut c_int) => |_mode| api::device::count(count);
    cuDeviceGetName / -(name: *mut c_char, len: c_int, device: CUdevice) => |_mode| api::device::name(name, len, device);
    cuDeviceGetUuid_v2 / -(uuid: *mut CUuuid, device: CUdevice) => |_mode| api::device::get_uuid(uuid, device);
    // CUDA 9.2's variant, same signature, for callers of drivers before 11.4.
    cuDeviceGetUuid / -(uuid: *mut CUuuid, device: CUdevice) => |_mode| api::device::get_uuid(uuid, device);
    cuDeviceGetPCIBusId / -(bus_id: *mut c_char, len: c_int, device: CUdevice)
        => |_mode| api::device::pci_bus_id(bus_id, len, device);
    cuDeviceGetByPCIBusId / -(device: *mut CUdevice, bus_id: *const c_char)
        => |_mode| api::device::by_pci_bus_id(device, bus_id);
    cuDeviceTotalMem_v2 / -(bytes: *mut usize, device: CUdevice) => |_mode| api::device::total_mem(bytes, device);
    cuDeviceGetAttribute / -(value: *mut c_int, attribute: CUdevice_attribute, device: CUdevice)
        => |_mode| api::device::get_attribute(value, attribute, device);
    cuDeviceCanAccessPeer / -(can: *mut c_int, device: CUdevice, peer: CUdevice)
        => |_mode| api::device::can_access_peer(can, device, peer);

    // Contexts.
    cuDevicePrimaryCtxRetain / -(context: *mut CUcontext, device: CUdevice)
        => |_mode| api::context::primary_retain(context, device);
    cuDevicePrimaryCtxRelease_v2 / -(device: CUdevice) => |_mode| api::context::primary_release(device);
    cuDevicePrimaryCtxReset_v2 / -(device: CUdevice) => |_mode| api::context::primary_reset(device);
    cuDevicePrimaryCtxGetState / -(device: CUdevice, flags: *mut c_uint, active: *mut c_int)
        => |_mode| api::context::primary_state(device, flags, active);
    cuDevicePrimaryCtxSetFlags_v2 / -(device: CUdevice, flags: c_uint) => |_mode| api::context::primary_set_flags(device, flags);
    cuCtxSetCurrent / -(context: CUcontext) => |_mode| api::context::set_current(context);
    cuCtxGetCurrent / -(context: *mut CUcontext) => |_mode| api::context::get_current(context);
    cuCtxPushCurrent_v2 / -(context: CUcontext) => |_mode| api::context::push_current(context);
    cuCtxPopCurrent_v2 / -(context: *mut CUcontext) => |_mode| api::context::pop_current(context);
    cuCtxGetDevice / -(device: *mut CUdevice) => |_mode| api::context::get_device(device, std::ptr::null_mut());
    cuCtxGetDevice_v2 / -(device: *mut CUdevice, context: CUcontext) => |_mode| api::context::get_device(device, context);
    cuCtxSynchronize / -() => |_mode| api::context::synchronize(std::ptr::null_mut());
    cuCtxSynchronize_v2 / -(context: CUcontext) => |_mode| api::context::synchronize(context);
    cuCtxGetStreamPriorityRange / -(least: *mut c_int, greatest: *mut c_int)
        => |_mode| api::context::stream_priority_range(least, greatest);
    cuCtxCreate_v4 / -(context: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, device: CUdevice)
        => |_mode| api::context::create(context, params, flags, device);
    cuCtxDestroy_v2 / -(context: CUcontext) => |_mode| api::context::destroy(context);
    cuCtxRecordEvent / -(context: CUcontext, event: CUevent) => |_mode| api::event::record_context(context, event);
    cuCtxWaitEvent / -(context: CUcontext, event: CUevent) => |_mode| api::event::wait_context(context, event);
    cuCtxGetLimit / -(value: *mut usize, limit: CUlimit) => |_mode| api::limits::get_limit(value, limit);
    cuCtxSetLimit / -(limit: CUlimit, value: usize) => |_mode| api::limits::set_limit(limit, value);
    cuCtxGetCacheConfig / -(config: *mut CUfunc_cache) => |_mode| api::limits::get_cache_config(config);
    cuCtxSetCacheConfig / -(config: CUfunc_cache) => |_mode| api::limits::set_cache_config(config);

    // Streams.
    cuStreamCreate / -(stream: *mut CUstream, flags: c_uint) => |_mode| api::stream::create(stream, flags, 0);
    cuStreamCreateWithPriority / -(stream: *mut CUstream, flags: c_uint, priority: c_int)
        => |_mode| api::stream::create(stream, flags, priority);
    cuStreamDestroy_v2 / -(stream: CUstream) => |_mode| api::stream::destroy(stream);
    cuStreamQuery / cuStreamQuery_ptsz(stream: CUstream) => |mode| api::stream::query(stream, mode);
    cuStreamSynchronize / cuStreamSynchronize_ptsz(stream: CUstream) => |mode| api::stream::synchronize(stream, mode);
    cuStreamGetFlags / cuStreamGetFlags_ptsz(stream: CUstream, flags: *mut c_uint)
        => |mode| api::stream::get(stream, mode, Property::Flags(flags));
    cuStreamGetPriority / cuStreamGetPriority_ptsz(stream: CUstream, priority: *mut c_int)
        => |mode| api::stream::get(stream, mode, Property::Priority(priority));
    cuStreamGetDevice / cuStreamGetDevice_ptsz(stream: CUstream, device: *mut CUdevice)
        => |mode| api::stream::get(stream, mode, Property::Device(device));
    cuStreamGetCtx / cuStreamGetCtx_ptsz(stream: CUstream, context: *mut CUcontext)
        => |mode| api::stream::get(stream, mode, Property::Context(context));
    cuStreamWaitEvent / cuStreamWaitEvent_ptsz(stream: CUstream, event: CUevent, flags: c_uint)
        => |mode| api::stream::wait_event(stream, event, flags, mode);
    cuStreamIsCapturing / cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut CUstreamCaptureStatus)
        => |mode| api::stream::is_capturing(stream, status, mode);
    cuLaunchHostFunc / cuLaunchHostFunc_ptsz(stream: CUstream, function: CUhostFn, data: *mut c_void)
        => |mode| api::stream::launch_host_func(stream, function, data, mode);

    // Events.
    cuEventCreate / -(event: *mut CUevent, flags: c_uint) => |_mode| api::event::create(event, flags);
    cuEventRecord / cuEventRecord_ptsz(event: CUevent, stream: CUstream) => |mode| api::event::record(event, stream, mode);
    cuEventQuery / -(event: CUevent) => |_mode| api::event::query(event);
    cuEventSynchronize / -(event: CUevent) => |_mode| api::event::synchronize(event);
    cuEventDestroy_v2 / -(event: CUevent) => |_mode| api::event::destroy(event);
    cuEventElapsedTime_v2 / -(ms: *mut f32, start: CUevent, end: CUevent) => |_mode| api::event::elapsed_time(ms, start, end);
    // CUDA 2.0's variant, same signature, for callers of drivers before 12.8.
    cuEventElapsedTime / -(ms: *mut f32, start: CUevent, end: CUevent) => |_mode| api::event::elapsed_time(ms, start, end);
    cuIpcGetEventHandle / -(handle: *mut CUipcEventHandle, event: CUevent) => |_mode| api::event::ipc_get_handle(handle, event);
    cuIpcOpenEventHandle / -(event: *mut CUevent, handle: CUipcEventHandle) => |_mode| api::event::ipc_open_handle(event, handle);

    // Memory.
    cuMemAlloc_v2 / -(pointer: *mut CUdeviceptr, size: usize) => |_mode| api::memory::alloc(pointer, size);
    cuMemFree_v2 / -(pointer: CUdeviceptr) => |_mode| api::memory::free(pointer);
    cuMemAllocHost_v2 / -(pointer: *mut *mut c_void, size: usize) => |_mode| api::memory::alloc_host(pointer, size);
    cuMemFreeHost / -(pointer: *mut c_void) => |_mode| api::memory::free_host(pointer);
    cuMemHostAlloc / -(pointer: *mut *mut c_void, size: usize, flags: c_uint)
        => |_mode| api::memory::host_alloc(pointer, size, flags);
    cuMemGetInfo_v2 / -(free: *mut usize, total: *mut usize) => |_mode| api::memory::get_info(free, total);
    cuMemGetAddressRange_v2 / -(base: *mut CUdeviceptr, size: *mut usize, pointer: CUdeviceptr)
        => |_mode| api::memory::address_range(base, size, pointer);
    cuPointerGetAttribute / -(data: *mut c_void, attribute: CUpointer_attribute, pointer: CUdeviceptr)
        => |_mode| api::pointer::get_attribute(data, attribute, pointer);
    cuPointerGetAttributes / -(count: c_uint, attributes: *mut CUpointer_attribute, data: *mut *mut c_void, pointer: CUdeviceptr)
        => |_mode| api::pointer::get_attributes(count, attributes, data, pointer);

    // Copies.
    cuMemcpy / cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, len: usize)
        => |mode| api::memory::copy(dst, src, len, Direction::Any, std::ptr::null_mut(), mode, false);
    cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, len: usize)
        => |mode| api::memory::copy(dst, src as u64, len, Direction::HostToDevice, std::ptr::null_mut(), mode, false);
    cuMemcpyDtoH_v2 / cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, len: usize)
        => |mode| api::memory::copy(dst as u64, src, len, Direction::DeviceToHost, std::ptr::null_mut(), mode, false);
    cuMemcpyDtoD_v2 / cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, len: usize)
        => |mode| api::memory::copy(dst, src, len, Direction::DeviceToDevice, std::ptr::null_mut(), mode, false);
    cuMemcpyAsync / cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: CUstream)
        => |mode| api::memory::copy(dst, src, len, Direction::Any, stream, mode, true);
    cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, len: usize, stream: CUstream)
        => |mode| api::memory::copy(dst, src as u64, len, Direction::HostToDevice, stream, mode, true);
    cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, len: usize, stream: CUstream)
        => |mode| api::memory::copy(dst as u64, src, len, Direction::DeviceToHost, stream, mode, true);
    cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: CUstream)
        => |mode| api::memory::copy(dst, src, len, Direction::DeviceToDevice, stream, mode, true);
    cuMemcpyPeer / cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, len: usize)
        => |mode| api::memory::copy_peer(dst, dst_context, src, src_context, len, std::ptr::null_mut(), mode, false);
    cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz(
        dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, len: usize, stream: CUstream,
    ) => |mode| api::memory::copy_peer(dst, dst_context, src, src_context, len, stream, mode, true);

    // Copies with attributes.
    cuMemcpyBatchAsync_v2 / cuMemcpyBatchAsync_v2_ptsz(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut CUmemcpyAttributes, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream,
    ) => |mode| api::copy_batch::batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream, mode);
    cuMemcpyWithAttributesAsync / cuMemcpyWithAttributesAsync_ptsz(
        dst: CUdeviceptr, src: CUdeviceptr, size: usize, attr: *mut CUmemcpyAttributes, stream: CUstream,
    ) => |mode| api::copy_batch::with_attributes(dst, src, size, attr, stream, mode);

    // Memsets.
    cuMemsetD8_v2 / cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, count: usize)
        => |mode| api::memory::memset(dst, u32::from(value), 1, count, std::ptr::null_mut(), mode, false);
    cuMemsetD16_v2 / cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, count: usize)
        => |mode| api::memory::memset(dst, u32::from(value), 2, count, std::ptr::null_mut(), mode, false);
    cuMemsetD32_v2 / cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: c_uint, count: usize)
        => |mode| api::memory::memset(dst, value, 4, count, std::ptr::null_mut(), mode, false);
    cuMemsetD8Async / cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream)
        => |mode| api::memory::memset(dst, u32::from(value), 1, count, stream, mode, true);
    cuMemsetD16Async / cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, count: usize, stream: CUstream)
        => |mode| api::memory::memset(dst, u32::from(value), 2, count, stream, mode, true);
    cuMemsetD32Async / cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream)
        => |mode| api::memory::memset(dst, value, 4, count, stream, mode, true);

    // Graph capture and graphs.
    cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz(stream: CUstream, capture_mode: CUstreamCaptureMode)
        => |mode| api::stream::begin_capture(stream, capture_mode, mode);
    cuStreamEndCapture / cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph)
        => |mode| api::stream::end_capture(stream, graph, mode);
    cuThreadExchangeStreamCaptureMode / -(capture_mode: *mut CUstreamCaptureMode)
        => |_mode| api::stream::exchange_capture_mode(capture_mode);
    cuStreamGetCaptureInfo_v3 / cuStreamGetCaptureInfo_v3_ptsz(
        stream: CUstream, status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t, graph: *mut CUgraph,
        dependencies: *mut *const CUgraphNode, edges: *mut *const CUgraphEdgeData, count: *mut usize,
    ) => |mode| api::graph::capture_info(stream, status, id, graph, dependencies, edges, count, mode);
    cuStreamUpdateCaptureDependencies_v2 / cuStreamUpdateCaptureDependencies_v2_ptsz(
        stream: CUstream, dependencies: *mut CUgraphNode, data: *const CUgraphEdgeData, count: usize, flags: c_uint,
    ) => |mode| api::graph::update_capture_dependencies(stream, dependencies, data, count, flags, mode);
    cuGraphGetNodes / -(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize)
        => |_mode| api::graph::get_nodes(graph, nodes, count);
    cuGraphNodeGetType / -(node: CUgraphNode, kind: *mut CUgraphNodeType) => |_mode| api::graph::node_type(node, kind);
    cuGraphNodeGetDependencies_v2 / -(
        node: CUgraphNode, dependencies: *mut CUgraphNode, edges: *mut CUgraphEdgeData, count: *mut usize,
    ) => |_mode| api::graph::node_dependencies(node, dependencies, edges, count);
    cuGraphDestroy / -(graph: CUgraph) => |_mode| api::graph::destroy(graph);
    cuGraphInstantiateWithFlags / -(exec: *mut CUgraphExec, graph: CUgraph, flags: u64)
        => |_mode| api::graph::instantiate(exec, graph, flags);
    cuGraphInstantiateWithParams / cuGraphInstantiateWithParams_ptsz(
        exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) => |mode| api::graph::instantiate_with_params(exec, graph, params, mode);
    cuGraphLaunch / cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) => |mode| api::graph::launch(exec, stream, mode);
    cuGraphUpload / cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) => |mode| api::graph::upload(exec, stream, mode);
    cuGraphExecDestroy / -(exec: CUgraphExec) => |_mode| api::graph::exec_destroy(exec);
    cuDeviceGetGraphMemAttribute / -(device: CUdevice, attribute: CUgraphMem_attribute, value: *mut c_void)
        => |_mode| api::graph::get_mem_attribute(device, attribute, value);
    cuDeviceSetGraphMemAttribute / -(device: CUdevice, attribute: CUgraphMem_attribute, value: *mut c_void)
        => |_mode| api::graph::set_mem_attribute(device, attribute, value);
    cuDeviceGraphMemTrim / -(device: CUdevice) => |_mode| api::graph::trim(device);

    // User objects.
    cuUserObjectCreate / -(object: *mut CUuserObject, ptr: *mut c_void, destroy: CUhostFn, initial: c_uint, flags: c_uint)
        => |_mode| api::user_object::create(object, ptr, destroy, initial, flags);
    cuUserObjectRetain / -(object: CUuserObject, count: c_uint) => |_mode| api::user_object::retain(object, count);
    cuUserObjectRelease / -(object: CUuserObject, count: c_uint) => |_mode| api::user_object::release(object, count);
    cuGraphRetainUserObject / -(graph: CUgraph, object: CUuserObject, count: c_uint, flags: c_uint)
        => |_mode| api::user_object::graph_retain(graph, object, count, flags);
    cuGraphReleaseUserObject / -(graph: CUgraph, object: CUuserObject, count: c_uint)
        => |_mode| api::user_object::graph_release(graph, object, count);

    // Pools.
    cuMemPoolCreate / -(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) => |_mode| api::pool::create(pool, props);
    cuMemPoolDestroy / -(pool: CUmemoryPool) => |_mode| api::pool::destroy(pool);
    cuDeviceGetDefaultMemPool / -(pool: *mut CUmemoryPool, device: CUdevice)
        => |_mode| api::pool::device_pool(pool, device, false);
    cuDeviceGetMemPool / -(pool: *mut CUmemoryPool, device: CUdevice) => |_mode| api::pool::device_pool(pool, device, true);
    cuDeviceSetMemPool / -(device: CUdevice, pool: CUmemoryPool) => |_mode| api::pool::set_device_pool(device, pool);
    cuMemGetMemPool / -(pool: *mut CUmemoryPool, location: *mut CUmemLocation, kind: CUmemAllocationType)
        => |_mode| api::pool::current_pool(pool, location, kind);
    cuMemGetDefaultMemPool / -(pool: *mut CUmemoryPool, location: *mut CUmemLocation, kind: CUmemAllocationType)
        => |_mode| api::pool::default_mem_pool(pool, location, kind);
    cuMemSetMemPool / -(location: *mut CUmemLocation, kind: CUmemAllocationType, pool: CUmemoryPool)
        => |_mode| api::pool::set_mem_pool(location, kind, pool);
    cuMemPoolGetAttribute / -(pool: CUmemoryPool, attribute: CUmemPool_attribute, value: *mut c_void)
        => |_mode| api::pool::get_attribute(pool, attribute, value);
    cuMemPoolSetAttribute / -(pool: CUmemoryPool, attribute: CUmemPool_attribute, value: *mut c_void)
        => |_mode| api::pool::set_attribute(pool, attribute, value);
    cuMemPoolTrimTo / -(pool: CUmemoryPool, keep: usize) => |_mode| api::pool::trim_to(pool, keep);
    cuMemPoolSetAccess / -(pool: CUmemoryPool, descs: *const CUmemAccessDesc, count: usize)
        => |_mode| api::pool::set_access(pool, descs, count);
    cuMemPoolGetAccess / -(flags: *mut CUmemAccess_flags, pool: CUmemoryPool, location: *mut CUmemLocation)
        => |_mode| api::pool::get_access(flags, pool, location);
    cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz(pointer: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream)
        => |mode| api::pool::alloc_from_pool(pointer, size, pool, stream, mode);
    cuMemAllocAsync / cuMemAllocAsync_ptsz(pointer: *mut CUdeviceptr, size: usize, stream: CUstream)
        => |mode| api::pool::alloc_async(pointer, size, stream, mode);
    cuMemFreeAsync / cuMemFreeAsync_ptsz(pointer: CUdeviceptr, stream: CUstream) => |mode| api::pool::free_async(pointer, stream, mode);

    // Managed and registered memory.
    cuMemAllocManaged / -(pointer: *mut CUdeviceptr, size: usize, flags: c_uint) => |_mode| api::pool::alloc_managed(pointer, size, flags);
    cuMemHostRegister_v2 / -(pointer: *mut c_void, size: usize, flags: c_uint) => |_mode| api::pool::host_register(pointer, size, flags);
    cuMemHostUnregister / -(pointer: *mut c_void) => |_mode| api::pool::host_unregister(pointer);

    // Managed memory operations.
    cuMemAdvise_v2 / -(pointer: CUdeviceptr, count: usize, advice: CUmem_advise, location: CUmemLocation)
        => |_mode| api::managed::advise(pointer, count, advice, location);
    cuMemPrefetchAsync_v2 / cuMemPrefetchAsync_v2_ptsz(
        pointer: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint, stream: CUstream,
    ) => |mode| api::managed::prefetch(pointer, count, location, flags, stream, mode);
    // CUDA 8.0's variants (a device ordinal or CU_DEVICE_CPU), for callers of drivers before 12.2.
    cuMemAdvise / -(pointer: CUdeviceptr, count: usize, advice: CUmem_advise, device: CUdevice)
        => |_mode| api::managed::advise_v1(pointer, count, advice, device);
    cuMemPrefetchAsync / cuMemPrefetchAsync_ptsz(pointer: CUdeviceptr, count: usize, device: CUdevice, stream: CUstream)
        => |mode| api::managed::prefetch_v1(pointer, count, device, stream, mode);
    cuMemPrefetchBatchAsync / cuMemPrefetchBatchAsync_ptsz(
        dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locations: *mut CUmemLocation,
        first_indices: *mut usize, num_locations: usize, flags: u64, stream: CUstream,
    ) => |mode| api::managed::batch(dptrs, sizes, count, Some((locations, first_indices, num_locations)), false, flags, stream, mode);
    cuMemDiscardBatchAsync / cuMemDiscardBatchAsync_ptsz(
        dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, flags: u64, stream: CUstream,
    ) => |mode| api::managed::batch(dptrs, sizes, count, None, true, flags, stream, mode);
    cuMemDiscardAndPrefetchBatchAsync / cuMemDiscardAndPrefetchBatchAsync_ptsz(
        dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locations: *mut CUmemLocation,
        first_indices: *mut usize, num_locations: usize, flags: u64, stream: CUstream,
    ) => |mode| api::managed::batch(dptrs, sizes, count, Some((locations, first_indices, num_locations)), true, flags, stream, mode);
    cuStreamAttachMemAsync / cuStreamAttachMemAsync_ptsz(stream: CUstream, pointer: CUdeviceptr, length: usize, flags: c_uint)
        => |mode| api::attach::attach(stream, pointer, length, flags, mode);
    cuMemRangeGetAttribute / -(data: *mut c_void, size: usize, attribute: CUmem_range_attribute, pointer: CUdeviceptr, count: usize)
        => |_mode| api::managed::range_attribute(data, size, attribute, pointer, count);
    cuMemRangeGetAttributes / -(
        data: *mut *mut c_void, sizes: *mut usize, attributes: *mut CUmem_range_attribute, n: usize,
        pointer: CUdeviceptr, count: usize,
    ) => |_mode| api::managed::range_attributes(data, sizes, attributes, n, pointer, count);

    // Sharing pools between processes.
    cuMemPoolExportToShareableHandle / -(
        handle: *mut c_void, pool: CUmemoryPool, handle_type: CUmemAllocationHandleType, flags: u64,
    ) => |_mode| api::ipc::export_pool(handle, pool, handle_type, flags);
    cuMemPoolImportFromShareableHandle / -(
        pool: *mut CUmemoryPool, handle: *mut c_void, handle_type: CUmemAllocationHandleType, flags: u64,
    ) => |_mode| api::ipc::import_pool(pool, handle, handle_type, flags);
    cuMemPoolExportPointer / -(data: *mut CUmemPoolPtrExportData, pointer: CUdeviceptr)
        => |_mode| api::ipc::export_pointer(data, pointer);
    cuMemPoolImportPointer / -(pointer: *mut CUdeviceptr, pool: CUmemoryPool, data: *mut CUmemPoolPtrExportData)
        => |_mode| api::ipc::import_pointer(pointer, pool, data);

    // Virtual memory management.
    cuMemAddressReserve / -(pointer: *mut CUdeviceptr, size: usize, alignment: usize, hint: CUdeviceptr, flags: u64)
        => |_mode| api::vmm::reserve(pointer, size, alignment, hint, flags);
    cuMemAddressFree / -(pointer: CUdeviceptr, size: usize) => |_mode| api::vmm::address_free(pointer, size);
    cuMemCreate / -(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64)
        => |_mode| api::vmm::create(handle, size, prop, flags);
    cuMemRelease / -(handle: CUmemGenericAllocationHandle) => |_mode| api::vmm::release(handle);
    cuMemMap / -(pointer: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64)
        => |_mode| api::vmm::map(pointer, size, offset, handle, flags);
    cuMemUnmap / -(pointer: CUdeviceptr, size: usize) => |_mode| api::vmm::unmap(pointer, size);
    cuMemSetAccess / -(pointer: CUdeviceptr, size: usize, descs: *const CUmemAccessDesc, count: usize)
        => |_mode| api::vmm::set_access(pointer, size, descs, count);
    cuMemGetAccess / -(flags: *mut u64, location: *const CUmemLocation, pointer: CUdeviceptr)
        => |_mode| api::vmm::get_access(flags, location, pointer);
    cuMemGetAllocationGranularity / -(granularity: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags)
        => |_mode| api::vmm::granularity(granularity, prop, option);
    cuMemRetainAllocationHandle / -(handle: *mut CUmemGenericAllocationHandle, address: *mut c_void)
        => |_mode| api::vmm::retain(handle, address);
    cuMemGetAllocationPropertiesFromHandle / -(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle)
        => |_mode| api::vmm::properties(prop, handle);
    cuMemExportToShareableHandle / -(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: CUmemAllocationHandleType, flags: u64)
        => |_mode| api::vmm::export(shareable, handle, handle_type, flags);
    cuMemImportFromShareableHandle / -(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: CUmemAllocationHandleType)
        => |_mode| api::vmm::import(handle, os_handle, handle_type);

    // The simulator's own controls (not driver functions).
    cuSimBuildId / -(out: *mut *const c_char) => |_mode| crate::api::sim::build_id(out);
    cuSimLiveObjects / -(out: *mut crate::api::sim::LiveObjects) => |_mode| crate::api::sim::live_objects(out);
    cuSimInjectFailure / -(function: *const c_char, nth: c_uint) => |_mode| crate::api::sim::inject_failure(function, nth);
    cuSimCountCalls / -(on: c_uint) => |_mode| crate::api::sim::count_calls(on);
    cuSimCallCount / -(function: *const c_char, count: *mut c_uint) => |_mode| crate::api::sim::call_count(function, count);
}
