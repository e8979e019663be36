//! The fabric-handle gate, against the simulator pretending to be older drivers
//! (`CUDA_SIM_DRIVER_VERSION`): a resource exporting fabric handles is refused with
//! `DriverTooOld` before CUDA 12.3, before any driver call would refuse the handle type itself,
//! and made from 12.3 on.

mod common;

use cuda_mem_core::{DriverCapability, Error, HandleType, installed_version};
use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError};
use cuda_sim::testing::simulator_only;

const ENV: &str = "CUDA_SIM_DRIVER_VERSION";

fn fabric() -> VirtualMemoryResourceOptions {
    VirtualMemoryResourceOptions::default().handle_type(HandleType::Fabric)
}

#[test]
fn cuda_12_2_refuses_fabric_handles_up_front() {
    common::machine!(&[(ENV, "12020")], || {
        if !simulator_only("pretending to be CUDA 12.2") {
            return;
        }
        let device = common::device(0);
        assert_eq!(installed_version().unwrap(), 12020);
        let error = VirtualMemoryResource::new(device, fabric()).unwrap_err();
        let VmmError::Core(Error::DriverTooOld { capability, needs, installed }) = &error else {
            panic!("expected DriverTooOld, got {error:?}")
        };
        assert_eq!((*capability, *needs, *installed), (DriverCapability::FabricHandles, 12030, 12020));
        let message = error.to_string();
        assert!(message.contains("fabric handles need CUDA 12.3 or newer"), "{message}");
        assert!(message.contains("the installed driver is CUDA 12.2"), "{message}");
        // File descriptors need no newer driver.
        let fd = VirtualMemoryResourceOptions::default().handle_type(HandleType::PosixFd);
        VirtualMemoryResource::new(device, fd).unwrap();
    });
}

#[test]
fn cuda_12_3_makes_fabric_resources() {
    // The IMEX channel fabric memory needs (`share.rs` tests the refusal without one).
    common::machine!(&[(ENV, "12030"), ("CUDA_SIM_IMEX_CHANNEL", "0")], || {
        if !simulator_only("pretending to be CUDA 12.3") {
            return;
        }
        let device = common::device(0);
        assert!(DriverCapability::FabricHandles.is_available().unwrap());
        VirtualMemoryResource::new(device, fabric()).unwrap();
    });
}
