//! The version gates, against the simulator pretending to be older drivers
//! (`CUDA_SIM_DRIVER_VERSION`): each capability works from the version the crate documentation's
//! table gives, and before it is refused with `Error::DriverTooOld` before anything is done.

mod common;

use cuda_mem_core::{
    DeviceMemoryResource, DriverCapability, Error, EventOptions, GraphMemoryResource, ManagedMemoryResource,
    ManagedMemoryResourceOptions, PinnedMemoryResource, PinnedMemoryResourceOptions, installed_version,
};
use cuda_sim::testing::{in_simulated_machine, live_objects, simulator_only};

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

/// Event timing works, whichever `cuEventElapsedTime` the driver has.
fn event_timing_works() {
    let device = common::device();
    let stream = common::stream(device);
    let start = cuda_mem_core::Event::new(device, EventOptions::default().timing()).unwrap();
    let end = cuda_mem_core::Event::new(device, EventOptions::default().timing()).unwrap();
    start.record(&stream).unwrap();
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    end.elapsed_since(&start).unwrap();
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
fn cuda_13_0_has_every_capability() {
    in_simulated_machine("cuda_13_0_has_every_capability", &[(ENV, "13000")], || {
        if !simulator_only("pretending to be CUDA 13.0") {
            return;
        }
        let device = common::device();
        for capability in DriverCapability::ALL {
            capability.require().unwrap();
        }
        let stream = common::stream(device);
        drop(PinnedMemoryResource::current().unwrap().allocate(4096, &stream).unwrap());
        drop(ManagedMemoryResource::current(None).unwrap().allocate(4096, &stream).unwrap());
        stream.synchronize().unwrap();
        event_timing_works();
    });
}
