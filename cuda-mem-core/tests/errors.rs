//! Errors a caller can match: each cause its own variant, with fields, produced here through the
//! public API; a cause from elsewhere (a system call, a driver call inside another resource's
//! error) stays the source, and `cuda_code` finds a driver code anywhere in the chain.

mod common;

use std::error::Error as _;
use std::sync::Arc;

use cuda_mem_core::sys::types::{CUdevice_attribute as A, CUresult};
use cuda_mem_core::{
    Device, DeviceCapability, DeviceMemoryResource, DeviceMemoryResourceOptions, DevicePtr, Error, HandleTypes,
    MemoryResource, MemoryResourceExt, SharingError, Stream, SynchronousMemoryResource,
};
use cuda_sim::testing::{in_simulated_machine, inject_failure};

/// `CUDA_SIM_DEVICE_ATTRIBUTES` making every device report `value` for `attribute`.
fn reporting(attribute: A, value: i32) -> String {
    format!("{}={value}", attribute.0)
}

#[test]
fn a_device_without_memory_pools_is_named_with_what_it_lacks() {
    let env = reporting(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0);
    in_simulated_machine(
        "a_device_without_memory_pools_is_named_with_what_it_lacks",
        &[("CUDA_SIM_DEVICE_ATTRIBUTES", &env)],
        || {
            if !cuda_sim::testing::simulator_only("a device that reports no memory pools") {
                return;
            }
            let device = common::device();
            let error = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap_err();
            assert!(
                matches!(error, Error::Unsupported { device: d, capability: DeviceCapability::MemoryPools } if d == device),
                "{error}"
            );
            assert!(error.to_string().contains("use SynchronousMemoryResource instead"), "{error}");
        },
    );
}

#[test]
fn a_device_whose_pools_cannot_be_shared_by_fd_refuses_ipc() {
    let env = reporting(A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0);
    in_simulated_machine(
        "a_device_whose_pools_cannot_be_shared_by_fd_refuses_ipc",
        &[("CUDA_SIM_DEVICE_ATTRIBUTES", &env)],
        || {
            if !cuda_sim::testing::simulator_only("a device whose pools support no handle type") {
                return;
            }
            let device = common::device();
            let options = DeviceMemoryResourceOptions::default().ipc_enabled(true);
            let error = DeviceMemoryResource::new(device, options).unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::Unsupported { capability: DeviceCapability::PoolFileDescriptors { supported }, .. }
                        if supported == HandleTypes::empty()
                ),
                "{error}"
            );
            assert!(error.to_string().contains("create the resource with ipc_enabled(false)"), "{error}");
            // Without IPC the device's pools are fine.
            assert!(DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).is_ok());
        },
    );
}

#[test]
fn a_device_without_a_host_numa_node_names_none_to_place_memory_near_it() {
    let env = reporting(A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1);
    in_simulated_machine(
        "a_device_without_a_host_numa_node_names_none_to_place_memory_near_it",
        &[("CUDA_SIM_DEVICE_ATTRIBUTES", &env)],
        || {
            if !cuda_sim::testing::simulator_only("a device that reports no host NUMA node") {
                return;
            }
            let device = common::device();
            let error = device.host_numa_node().unwrap_err();
            assert!(
                matches!(error, Error::Unsupported { device: d, capability: DeviceCapability::HostNumaNode } if d == device),
                "{error}"
            );
            assert!(error.to_string().contains("give the node with NumaNode(n)"), "{error}");
        },
    );
}

#[test]
fn a_pool_that_is_not_ipc_enabled_has_no_shareable_handle() {
    let device = common::device();
    let plain = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
    let error = plain.pool().shareable_handle().unwrap_err();
    assert!(matches!(error, Error::Sharing(SharingError::PoolNotIpcEnabled)), "{error}");
    assert!(error.to_string().contains("create it with ipc_enabled(true)"), "{error}");
}

#[test]
fn an_address_that_is_no_import_of_the_pool_is_named() {
    let device = common::device();
    let stream = common::stream(device);
    let exporter = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = exporter.allocate(4096, &stream).unwrap();
    let handle = exporter.pool().shareable_handle().unwrap();
    let imported = cuda_mem_core::MemoryPool::import(handle.try_clone_fd().unwrap(), handle.id()).unwrap();
    // The exporter's own address was never imported through the imported pool.
    let error = imported.export_pointer(buffer.ptr()).unwrap_err();
    assert!(matches!(error, Error::Sharing(SharingError::NotAnImport { ptr }) if ptr == buffer.ptr()), "{error}");
    // SAFETY: refused before any driver call: the address is no import of this pool.
    let error = unsafe { imported.release_import(buffer.ptr(), &stream) }.unwrap_err();
    assert!(matches!(error, Error::Sharing(SharingError::NotAnImport { ptr }) if ptr == buffer.ptr()), "{error}");
}

#[test]
fn duplicating_a_pool_descriptor_out_of_descriptors_is_an_io_error_with_its_source() {
    in_simulated_machine(
        "duplicating_a_pool_descriptor_out_of_descriptors_is_an_io_error_with_its_source",
        &[],
        || {
            use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
            let device = common::device();
            let pool =
                DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
            let handle = pool.pool().shareable_handle().unwrap();
            // Use up every descriptor number below a lowered limit.
            let original = getrlimit(Resource::Nofile);
            let highest = std::os::fd::AsRawFd::as_raw_fd(&handle.fd()) as u64;
            setrlimit(Resource::Nofile, Rlimit { current: Some(highest + 16), maximum: original.maximum }).unwrap();
            let mut held = Vec::new();
            while let Ok(fd) = handle.fd().try_clone_to_owned() {
                held.push(fd);
            }
            let error = handle.try_clone_fd().unwrap_err();
            drop(held);
            setrlimit(Resource::Nofile, original).unwrap();
            let Error::Io { context, source } = &error else { panic!("expected an Io error, got {error:?}") };
            assert_eq!(*context, "duplicating the pool's file descriptor");
            assert_eq!(source.raw_os_error(), Some(rustix::io::Errno::MFILE.raw_os_error()));
            assert!(error.source().is_some_and(|s| s.is::<std::io::Error>()), "the system's error is the source");
            assert!(error.to_string().starts_with("duplicating the pool's file descriptor: "), "{error}");
            assert!(handle.try_clone_fd().is_ok(), "with descriptors free again, it duplicates");
        },
    );
}

/// A memory resource of the application's, over plain device memory, that reports a failure in
/// an error of its own (which keeps the driver's as its source).
#[derive(Debug)]
struct Quota {
    inner: Arc<SynchronousMemoryResource>,
}

/// The application's error: which quota, and the driver's refusal.
#[derive(Debug, thiserror::Error)]
#[error("the quota's device memory ran out: {source}")]
struct QuotaExhausted {
    #[source]
    source: Error,
}

// SAFETY: forwards to `SynchronousMemoryResource`, which keeps the promises.
unsafe impl MemoryResource for Quota {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> cuda_mem_core::Result<DevicePtr> {
        self.inner.allocate_raw(size, stream).map_err(|source| Error::resource(QuotaExhausted { source }))
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> cuda_mem_core::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.deallocate_raw(ptr, size, stream) }
    }

    fn is_device_accessible(&self) -> bool {
        self.inner.is_device_accessible()
    }

    fn is_host_accessible(&self) -> bool {
        self.inner.is_host_accessible()
    }

    fn device(&self) -> Option<Device> {
        self.inner.device()
    }
}

#[test]
fn another_resources_error_keeps_its_cause_and_the_drivers_code() {
    in_simulated_machine("another_resources_error_keeps_its_cause_and_the_drivers_code", &[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let device = common::device();
        let stream = common::stream(device);
        let quota = Arc::new(Quota { inner: SynchronousMemoryResource::new(device) });
        inject_failure(cuda_sim::testing::driver().unwrap(), c"cuMemAlloc_v2", 1).unwrap();
        let error = quota.allocate(4096, &stream).unwrap_err();
        let Error::Resource(source) = &error else { panic!("expected the resource's error, got {error:?}") };
        let exhausted = source.downcast_ref::<QuotaExhausted>().expect("the resource's own error is the source");
        assert_eq!(exhausted.source.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "found through the chain");
        assert_eq!(cuda_mem_core::cuda_code_of(&error), error.cuda_code());
        let text = error.to_string();
        assert!(
            text.starts_with("the quota's device memory ran out: out of memory: 4096 bytes were asked for"),
            "{text}"
        );
        assert!(text.contains(": cuMemAlloc_v2 failed"), "the driver's error is kept: {text}");
        // And plain text, for a resource with nothing more to say, is an error of its own.
        let text = Error::resource("no quota left");
        assert_eq!(text.to_string(), "no quota left");
        assert_eq!(text.cuda_code(), None);
    });
}
