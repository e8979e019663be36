//! The version gates, against the simulator pretending to be older drivers
//! (`CUDA_SIM_DRIVER_VERSION`): each capability works from the version the crate documentation's
//! table gives, and before it is refused with `Error::DriverTooOld` before anything is done.

mod common;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUdevice_attribute as A, CUresult, CUuuid};
use cuda_mem_core::{
    Advice, Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, DriverCapability, Error, EventOptions,
    ForeignMemory, GraphMemoryResource, HandleType, HandleTypes, Location, ManagedMemoryResource,
    ManagedMemoryResourceOptions, NumaNode, PinnedMemoryResource, PinnedMemoryResourceOptions, installed_version,
};
use cuda_sim::testing::{count_calls, in_simulated_machine, live_objects, simulator_only};

const ENV: &str = "CUDA_SIM_DRIVER_VERSION";

/// Asserts `result` is `DriverTooOld` for `capability` on a driver of version `installed`.
#[track_caller]
fn assert_too_old<T>(result: cuda_mem_core::Result<T>, capability: DriverCapability, installed: u32) {
    match result {
        Err(Error::DriverTooOld { capability: c, needs, installed: i }) => {
            assert_eq!((c, needs, i), (capability, capability.needs(), installed));
        }
        Err(other) => panic!("expected DriverTooOld for {capability:?}, got {other}"),
        Ok(_) => panic!("expected DriverTooOld for {capability:?}, got Ok"),
    }
}

/// A pool's allocation works: the capability is there.
fn pools_work() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let buffer = pool.allocate(1024, &stream).unwrap();
    drop(buffer);
    stream.synchronize().unwrap();
}

/// The time between two timing events recorded one after the other on a stream, through
/// whichever `cuEventElapsedTime` the driver has.
fn elapsed_between_two_events() -> cuda_mem_core::Result<std::time::Duration> {
    let device = common::device();
    let stream = common::stream(device);
    let start = cuda_mem_core::Event::new(device, EventOptions::default().timing()).unwrap();
    let end = cuda_mem_core::Event::new(device, EventOptions::default().timing()).unwrap();
    start.record(&stream).unwrap();
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    end.elapsed_since(&start)
}

/// Event timing works, whichever `cuEventElapsedTime` the driver has.
fn event_timing_works() {
    elapsed_between_two_events().unwrap();
}

#[test]
fn cuda_11_0_has_no_pools() {
    in_simulated_machine("cuda_11_0_has_no_pools", &[(ENV, "11000")], || {
        if !simulator_only("pretending to be CUDA 11.0") {
            return;
        }
        let device = common::device();
        assert_eq!(installed_version().unwrap(), 11000);
        assert_too_old(DeviceMemoryResource::new(device, Default::default()), DriverCapability::MemoryPools, 11000);
        assert_too_old(DeviceMemoryResource::current(device), DriverCapability::MemoryPools, 11000);
        let message = DeviceMemoryResource::new(device, Default::default()).unwrap_err().to_string();
        assert!(message.contains("stream-ordered pools need CUDA 11.2 or newer"), "{message}");
        assert!(message.contains("the installed driver is CUDA 11.0"), "{message}");
        event_timing_works();
    });
}

#[test]
fn cuda_11_2_has_pools_but_no_pinned_pools_graph_memory_or_current_pools() {
    in_simulated_machine(
        "cuda_11_2_has_pools_but_no_pinned_pools_graph_memory_or_current_pools",
        &[(ENV, "11020")],
        || {
            if !simulator_only("pretending to be CUDA 11.2") {
                return;
            }
            pools_work();
            event_timing_works();
            let d = cuda_mem_core::driver().unwrap();
            let before = live_objects(d).unwrap();
            let options = PinnedMemoryResourceOptions::default();
            assert_too_old(PinnedMemoryResource::new(options), DriverCapability::PinnedPools, 11020);
            assert_too_old(PinnedMemoryResource::current(), DriverCapability::CurrentPools, 11020);
            // Refused before anything was made.
            assert_eq!(live_objects(d).unwrap(), before);
            let graph_memory = GraphMemoryResource::new(common::device());
            assert_too_old(graph_memory.trim(), DriverCapability::GraphMemory, 11020);
            assert_too_old(graph_memory.attributes(), DriverCapability::GraphMemory, 11020);
        },
    );
}

#[test]
fn cuda_12_0_has_graph_memory_but_no_pinned_pools() {
    in_simulated_machine("cuda_12_0_has_graph_memory_but_no_pinned_pools", &[(ENV, "12000")], || {
        if !simulator_only("pretending to be CUDA 12.0") {
            return;
        }
        pools_work();
        event_timing_works();
        GraphMemoryResource::new(common::device()).trim().unwrap();
        assert!(DriverCapability::GraphMemory.is_available().unwrap());
        assert!(!DriverCapability::ManagedLocations.is_available().unwrap());
        assert_too_old(
            PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()),
            DriverCapability::PinnedPools,
            12000,
        );
    });
}

#[test]
fn cuda_12_8_has_pinned_pools_but_no_managed_or_current_pools() {
    in_simulated_machine("cuda_12_8_has_pinned_pools_but_no_managed_or_current_pools", &[(ENV, "12080")], || {
        if !simulator_only("pretending to be CUDA 12.8") {
            return;
        }
        let device = common::device();
        let stream = common::stream(device);
        let pinned = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
        drop(pinned.allocate(4096, &stream).unwrap());
        stream.synchronize().unwrap();
        event_timing_works();
        assert_too_old(PinnedMemoryResource::current(), DriverCapability::CurrentPools, 12080);
        assert_too_old(ManagedMemoryResource::current(None), DriverCapability::CurrentPools, 12080);
        assert_too_old(
            ManagedMemoryResource::new(ManagedMemoryResourceOptions::default()),
            DriverCapability::ManagedPools,
            12080,
        );
        let message = PinnedMemoryResource::current().unwrap_err().to_string();
        assert!(message.contains("need CUDA 13.0 or newer, but the installed driver is CUDA 12.8"), "{message}");
    });
}

#[test]
fn cuda_13_0_has_every_capability_but_single_copies_with_attributes() {
    in_simulated_machine("cuda_13_0_has_every_capability_but_single_copies_with_attributes", &[(ENV, "13000")], || {
        if !simulator_only("pretending to be CUDA 13.0") {
            return;
        }
        let device = common::device();
        for capability in DriverCapability::ALL {
            if capability == DriverCapability::CopiesWithAttributes {
                // CUDA 13.2's.
                assert_too_old(capability.require(), capability, 13000);
            } else {
                capability.require().unwrap();
            }
        }
        let stream = common::stream(device);
        drop(PinnedMemoryResource::current().unwrap().allocate(4096, &stream).unwrap());
        drop(ManagedMemoryResource::current(None).unwrap().allocate(4096, &stream).unwrap());
        stream.synchronize().unwrap();
        event_timing_works();
    });
}

/// Managed memory of `cuMemAllocManaged` (CUDA 6.0, so on every driver), freed on drop.
struct Managed(cuda_mem_core::DevicePtr);

impl Managed {
    const SIZE: usize = 2 << 20;

    fn new() -> Managed {
        let d = cuda_mem_core::driver().unwrap();
        let mut ptr = 0;
        // SAFETY: a valid out-pointer; CU_MEM_ATTACH_GLOBAL.
        unsafe { cu_call!(d, cuMemAllocManaged(&mut ptr, Managed::SIZE, 1)) }.unwrap();
        Managed(ptr)
    }

    /// A view of the memory, for the managed operations.
    fn view(&self) -> Buffer {
        // SAFETY: the memory stays allocated while `self` lives, which the test keeps longer.
        unsafe { Buffer::from_raw(self.0, Managed::SIZE, ForeignMemory::pinned()) }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let d = cuda_mem_core::driver().unwrap();
        // SAFETY: allocated in `new`; its views are gone.
        unsafe { cu_call!(d, cuMemFree_v2(self.0)) }.unwrap();
    }
}

#[test]
fn cuda_12_0_advises_and_prefetches_devices_and_the_host_with_cuda_8_0_s_calls() {
    in_simulated_machine(
        "cuda_12_0_advises_and_prefetches_devices_and_the_host_with_cuda_8_0_s_calls",
        &[(ENV, "12000")],
        || {
            if !simulator_only("pretending to be CUDA 12.0") {
                return;
            }
            let device = common::device();
            let stream = common::stream(device);
            let memory = Managed::new();
            let view = memory.view();
            let managed = view.managed().unwrap();
            managed.set_preferred_location(device).unwrap();
            assert_eq!(managed.preferred_location().unwrap(), Some(Location::Device(device)));
            managed.set_preferred_location(Location::Host).unwrap();
            assert_eq!(managed.preferred_location().unwrap(), Some(Location::Host));
            managed.unset_preferred_location().unwrap();
            assert_eq!(managed.preferred_location().unwrap(), None);
            managed.set_read_mostly(true).unwrap();
            assert!(managed.read_mostly().unwrap());
            managed.add_accessed_by(device).unwrap();
            managed.add_accessed_by(Location::Host).unwrap();
            assert_eq!(managed.accessed_by().unwrap(), [Location::Device(device), Location::Host]);
            managed.remove_accessed_by(Location::Host).unwrap();
            assert_eq!(managed.accessed_by().unwrap(), [Location::Device(device)]);
            managed.prefetch(device, &stream).unwrap();
            assert_eq!(managed.last_prefetch_location().unwrap(), Some(Location::Device(device)));
            managed.prefetch(Location::Host, &stream).unwrap();
            assert_eq!(managed.last_prefetch_location().unwrap(), Some(Location::Host));
            stream.synchronize().unwrap();

            // A host NUMA node has no CUDA 8.0 form: refused before the driver is asked.
            let d = cuda_mem_core::driver().unwrap();
            let before = live_objects(d).unwrap();
            assert_too_old(
                managed.prefetch(Location::HostNuma(NumaNode(0)), &stream),
                DriverCapability::ManagedLocations,
                12000,
            );
            assert_too_old(
                managed.set_preferred_location(Location::HostNumaCurrent),
                DriverCapability::ManagedLocations,
                12000,
            );
            assert_eq!(managed.last_prefetch_location().unwrap(), Some(Location::Host), "nothing was prefetched");
            assert_eq!(live_objects(d).unwrap(), before);
            // Advice that ignores the location takes any.
            managed.advise(Advice::UnsetReadMostly, Location::HostNuma(NumaNode(0))).unwrap();
            assert!(!managed.read_mostly().unwrap());
        },
    );
}

#[test]
fn cuda_12_2_prefetches_to_host_numa_nodes() {
    in_simulated_machine("cuda_12_2_prefetches_to_host_numa_nodes", &[(ENV, "12020")], || {
        if !simulator_only("pretending to be CUDA 12.2") {
            return;
        }
        let stream = common::stream(common::device());
        let memory = Managed::new();
        let view = memory.view();
        let managed = view.managed().unwrap();
        managed.prefetch(Location::HostNuma(NumaNode(0)), &stream).unwrap();
        assert_eq!(managed.last_prefetch_location().unwrap(), Some(Location::HostNuma(NumaNode(0))));
        managed.set_preferred_location(Location::HostNuma(NumaNode(0))).unwrap();
        assert_eq!(managed.preferred_location().unwrap(), Some(Location::HostNuma(NumaNode(0))));
        stream.synchronize().unwrap();
    });
}

/// The attributes `Device::properties` reads that are newer than CUDA 11.2, with the version that
/// added each.
const NEWER_ATTRIBUTES: [(A, u32); 4] = [
    (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 11030),
    (A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 11030),
    (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 12020),
    (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 12030),
];

/// The UUID CUDA 11.4's `cuDeviceGetUuid_v2` gives for `device`, called through its exported
/// symbol: the simulator exports every entry point whatever version it pretends to be, and each
/// behaves as CUDA 13.0's, so this is what a 13.0 driver gives for the same simulated device.
fn uuid_of_a_13_0_driver(device: Device) -> [u8; 16] {
    let d = cuda_mem_core::driver().unwrap();
    let symbol = d.library_symbol(c"cuDeviceGetUuid_v2").expect("the simulator exports cuDeviceGetUuid_v2");
    // SAFETY: the simulator's `cuDeviceGetUuid_v2`, whose signature is `cuda.h`'s
    // (`PFN_cuDeviceGetUuid_v11040`, the same as CUDA 9.2's variant).
    let f = unsafe { std::mem::transmute::<*const std::ffi::c_void, cuda_mem_core::sys::older::DeviceGetUuid>(symbol) };
    let mut uuid = CUuuid::default();
    // SAFETY: a valid out-pointer and a device of this process.
    assert_eq!(unsafe { f(&mut uuid, device.raw()) }, CUresult::CUDA_SUCCESS);
    uuid.bytes.map(|b| b as u8)
}

/// On a driver of `version`: `Device::properties` reads every property, the attributes newer
/// than the driver (which it refuses) as their defaults; `Device::uuid` gives each device's UUID
/// as a 13.0 driver does, through `cuDeviceGetUuid_v2` from 11.4 and CUDA 9.2's `cuDeviceGetUuid`
/// before, and `Device::with_uuid` finds the device by it; a pool shared by file descriptor is
/// made.
fn properties_and_uuids_on(version: u32) {
    let device = common::device();
    assert_eq!(installed_version().unwrap(), version);
    for (attribute, added) in NEWER_ATTRIBUTES {
        let read = device.attribute(attribute);
        if version < added {
            let code = read.as_ref().map_err(Error::cuda_code);
            assert_eq!(code, Err(Some(CUresult::CUDA_ERROR_INVALID_VALUE)), "{attribute:?} on {version}");
        } else {
            read.unwrap_or_else(|e| panic!("{attribute:?} on {version}: {e}"));
        }
    }
    let properties = device.properties().unwrap();
    assert_eq!(properties.compute_capability, (9, 0));
    assert!(properties.memory_pools_supported && properties.virtual_memory_management_supported);
    assert!(properties.posix_fd_handles_supported && properties.unified_addressing);
    assert!(properties.concurrent_managed_access);
    // The simulated device has no GPUDirect RDMA, whatever the driver.
    assert!(!properties.gpu_direct_rdma_supported && !properties.gpu_direct_rdma_with_vmm_supported);
    let (handle_types, numa, fabric) =
        (properties.mempool_supported_handle_types, properties.host_numa_node, properties.fabric_handles_supported);
    let pool_fds = if version >= 11030 { HandleTypes::from(HandleType::PosixFd) } else { HandleTypes::empty() };
    assert_eq!(handle_types, pool_fds, "on {version}");
    assert_eq!(numa, (version >= 12020).then_some(NumaNode(0)), "on {version}");
    assert_eq!(fabric, version >= 12030, "on {version}");

    // Pool sharing by file descriptor works from 11.2, whether or not the driver can say so.
    let stream = common::stream(device);
    let shared = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    drop(shared.allocate(1024, &stream).unwrap());
    stream.synchronize().unwrap();

    let d = cuda_mem_core::driver().unwrap();
    let devices = Device::all().unwrap();
    assert_eq!(devices.len(), 2);
    for &each in &devices {
        let (uuid, calls) = count_calls(d, || each.uuid().unwrap()).unwrap();
        assert_eq!(uuid, uuid_of_a_13_0_driver(each), "{each} on {version}");
        let (v1, v2) = if version >= 11040 { (0, 1) } else { (1, 0) };
        assert_eq!((calls.of("cuDeviceGetUuid"), calls.of("cuDeviceGetUuid_v2")), (v1, v2), "on {version}");
        assert_eq!(Device::with_uuid(uuid).unwrap(), Some(each));
    }
    assert_ne!(devices[0].uuid().unwrap(), devices[1].uuid().unwrap());
}

/// [`properties_and_uuids_on`] `version`, in a simulated machine of two devices pretending to
/// be that driver (`test` is the calling test's name).
fn properties_and_uuids_test(test: &str, version: u32) {
    let version_text = version.to_string();
    in_simulated_machine(test, &[(ENV, &version_text), ("CUDA_SIM_DEVICES", "2")], || {
        if simulator_only(&format!("pretending to be the driver of version {version}")) {
            properties_and_uuids_on(version);
        }
    });
}

#[test]
fn cuda_11_2_reads_properties_and_uuids_with_cuda_9_2_s_uuid_call() {
    properties_and_uuids_test("cuda_11_2_reads_properties_and_uuids_with_cuda_9_2_s_uuid_call", 11020);
}

#[test]
fn cuda_12_0_reads_properties_without_host_numa_nodes_or_fabric_handles() {
    properties_and_uuids_test("cuda_12_0_reads_properties_without_host_numa_nodes_or_fabric_handles", 12000);
}

#[test]
fn cuda_13_0_reads_every_property() {
    properties_and_uuids_test("cuda_13_0_reads_every_property", 13000);
}

#[test]
fn an_older_variant_fails_under_the_name_cuda_h_gives_it() {
    // Before 12.8 the elapsed time is CUDA 2.0's `cuEventElapsedTime`, called through an
    // accessor of another name: an error names the function as `cuda.h` does.
    in_simulated_machine(
        "an_older_variant_fails_under_the_name_cuda_h_gives_it",
        &[(ENV, "12000"), ("CUDA_SIM_FAIL", "cuEventElapsedTime:1")],
        || {
            if !simulator_only("fault injection") {
                return;
            }
            let error = elapsed_between_two_events().unwrap_err();
            let cuda_mem_core::Error::Cuda(cuda_mem_core::sys::CudaError::Driver(failed)) = &error else {
                panic!("a driver error: {error:?}")
            };
            assert_eq!(failed.function, "cuEventElapsedTime", "{error}");
        },
    );
}
