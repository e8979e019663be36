//! `VirtualMemoryResourceOptions`: cuda.core's defaults, the builder methods, every invalid
//! combination refused by `VirtualMemoryResource::new` with a message saying what to change, and
//! the valid combinations at work.

mod common;

use common::*;
use cuda_mem_core::{Access, Device, HandleType, Location, NumaNode};
use cuda_mem_vmm::{
    AllocationType, DeviceFeature, Granularity, InvalidOptions, VirtualMemoryResource, VirtualMemoryResourceOptions,
    VmmError,
};

#[test]
fn defaults_are_cuda_cores() {
    let options = VirtualMemoryResourceOptions::default();
    assert_eq!(options.allocation_type, AllocationType::Pinned);
    assert_eq!(options.location, None, "on the resource's device");
    assert_eq!(options.handle_type, Some(HandleType::PosixFd));
    assert_eq!(options.granularity, Granularity::Recommended);
    assert!(!options.gpu_direct_rdma);
    assert_eq!(options.address_hint, 0);
    assert_eq!(options.address_alignment, 0);
    assert!(options.peers.is_empty());
    assert_eq!(options.self_access, Access::ReadWrite);
    assert_eq!(options.peer_access, Access::ReadWrite);
    // Each enum's own default is the option's default.
    assert_eq!(AllocationType::default(), AllocationType::Pinned);
    assert_eq!(Granularity::default(), Granularity::Recommended);
}

#[test]
fn builders_set_every_field_and_nothing_else() {
    let d0 = device(0);
    let options = VirtualMemoryResourceOptions::default()
        .allocation_type(AllocationType::Managed)
        .location(Location::HostNuma(NumaNode(1)))
        .handle_type(HandleType::Fabric)
        .granularity(Granularity::Minimum)
        .gpu_direct_rdma(true)
        .address_hint(0x7000_0000_0000)
        .address_alignment(1 << 30)
        .peers([d0, d0])
        .self_access(Access::Read)
        .peer_access(Access::None);
    assert_eq!(options.allocation_type, AllocationType::Managed);
    assert_eq!(options.location, Some(Location::HostNuma(NumaNode(1))));
    assert_eq!(options.handle_type, Some(HandleType::Fabric));
    assert_eq!(options.granularity, Granularity::Minimum);
    assert!(options.gpu_direct_rdma);
    assert_eq!(options.address_hint, 0x7000_0000_0000);
    assert_eq!(options.address_alignment, 1 << 30);
    assert_eq!(options.peers, vec![d0, d0]);
    assert_eq!(options.self_access, Access::Read);
    assert_eq!(options.peer_access, Access::None);
    // `peers` replaces the list rather than appending to it.
    let replaced = options.clone().peers([]);
    assert!(replaced.peers.is_empty());
    let mut expected = options.clone();
    expected.peers.clear();
    assert_eq!(replaced, expected);
    // Each builder changes its own field only.
    let default = VirtualMemoryResourceOptions::default();
    assert_eq!(default.clone().gpu_direct_rdma(false), default);
    assert_ne!(default.clone().address_hint(1 << 21), default);
    assert_eq!(default.clone().address_hint(1 << 21).address_hint(0), default);
    // No handle type is `None`; one is given as itself.
    assert_eq!(default.clone().handle_type(None).handle_type, None);
    assert_eq!(default.clone().handle_type(None).handle_type(HandleType::PosixFd), default);
}

fn refused(options: VirtualMemoryResourceOptions) -> VmmError {
    let d0 = device(0);
    VirtualMemoryResource::new(d0, options).expect_err("the combination must be refused")
}

#[test]
fn an_alignment_that_is_not_a_power_of_two_is_refused() {
    for alignment in [3usize, 6, G + 4096, 3 * G, usize::MAX] {
        let error = refused(VirtualMemoryResourceOptions::default().address_alignment(alignment));
        assert!(
            matches!(error, VmmError::InvalidOptions(InvalidOptions::AlignmentNotPowerOfTwo(a)) if a == alignment),
            "{error:?}"
        );
        assert_mentions(&error.to_string(), &["address_alignment", "power of two", &alignment.to_string()]);
    }
}

#[test]
fn host_memory_with_an_exportable_handle_type_is_refused() {
    for handle_type in [HandleType::PosixFd, HandleType::Fabric] {
        let options = VirtualMemoryResourceOptions::default().location(Location::Host).handle_type(handle_type);
        let error = refused(options);
        assert!(matches!(error, VmmError::InvalidOptions(InvalidOptions::ExportableHostMemory)), "{error:?}");
        // Says both ways out: no handle type, or host NUMA memory.
        assert_mentions(&error.to_string(), &["Host", "handle_type(None)", "HostNuma"]);
    }
}

#[test]
fn locations_memory_cannot_be_placed_at_are_refused() {
    // Two devices: the second's memory is its own resource's.
    machine!(&[("CUDA_SIM_DEVICES", "2")], || {
        let d0 = device(0);
        let mut refused_at = vec![Location::HostNumaCurrent];
        // Another device where there is one (the simulated machine has two; a GPU machine may not).
        if Device::count().unwrap() > 1 {
            refused_at.push(Location::Device(Device::new(1).unwrap()));
        }
        for location in refused_at {
            let error = refused(VirtualMemoryResourceOptions::default().location(location));
            assert!(
                matches!(error, VmmError::InvalidOptions(InvalidOptions::Location { location: l, device }) if l == location && device == d0),
                "{error:?}"
            );
            assert_mentions(&error.to_string(), &[&location.to_string(), "device 0", "Location::HostNuma(node)"]);
        }
        // Its own device, named, is the default's place.
        let named =
            VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().location(Location::Device(d0)));
        assert_eq!(named.unwrap().location(), Location::Device(d0));
    });
}

#[test]
fn handle_types_other_than_posix_fd_and_fabric_are_refused() {
    for handle_type in [HandleType::Win32, HandleType::Win32Kmt] {
        let error = refused(VirtualMemoryResourceOptions::default().handle_type(handle_type));
        assert!(
            matches!(error, VmmError::InvalidOptions(InvalidOptions::UnsupportedHandleType(t)) if t == handle_type),
            "{error:?}"
        );
        assert_mentions(
            &error.to_string(),
            &[&handle_type.to_string(), "handle_type(HandleType::PosixFd)", "HandleType::Fabric", "None"],
        );
    }
}

#[test]
fn gpu_direct_rdma_is_refused_where_the_device_lacks_it() {
    let d0 = device(0);
    let options = VirtualMemoryResourceOptions::default().gpu_direct_rdma(true);
    if d0.properties().unwrap().gpu_direct_rdma_with_vmm_supported {
        cuda_sim::testing::skip("this device supports GPUDirect RDMA with VMM");
        return;
    }
    let error = VirtualMemoryResource::new(d0, options).expect_err("refused");
    assert!(
        matches!(error, VmmError::Unsupported { device, feature: DeviceFeature::GpuDirectRdma } if device == d0),
        "{error:?}"
    );
    assert_mentions(&error.to_string(), &["device 0", "GPUDirect RDMA", "gpu_direct_rdma(false)"]);
}

#[test]
fn the_owner_listed_as_a_peer_is_refused() {
    let d0 = device(0);
    let error = refused(VirtualMemoryResourceOptions::default().peers([d0]));
    assert!(matches!(error, VmmError::InvalidOptions(InvalidOptions::OwnerAsPeer(d)) if d == d0), "{error:?}");
    assert_mentions(&error.to_string(), &["device 0", "peers", "self_access"]);
}

#[test]
fn the_first_invalid_option_is_reported_even_among_valid_ones() {
    let d0 = device(0);
    // A valid resource becomes invalid by one change, and valid again by undoing it.
    let valid = VirtualMemoryResourceOptions::default().granularity(Granularity::Minimum).address_alignment(4 * G);
    VirtualMemoryResource::new(d0, valid.clone()).expect("valid");
    let error = VirtualMemoryResource::new(d0, valid.clone().location(Location::Host)).unwrap_err();
    assert!(error.to_string().contains("handle_type(None)"), "{error}");
    VirtualMemoryResource::new(d0, valid.location(Location::Host).handle_type(None)).expect("valid again");
}

#[test]
fn minimum_and_recommended_granularity() {
    let d0 = device(0);
    let minimum =
        VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().granularity(Granularity::Minimum))
            .unwrap();
    let recommended = VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default()).unwrap();
    assert_eq!(recommended.options().granularity, Granularity::Recommended);
    assert_eq!(minimum.options().granularity, Granularity::Minimum);
    assert!(minimum.granularity().is_power_of_two(), "{}", minimum.granularity());
    assert!(recommended.granularity().is_multiple_of(minimum.granularity()));
    if cuda_sim::testing::on_simulator() {
        assert_eq!((minimum.granularity(), recommended.granularity()), (G, G));
    }
    // Sizes round up to the resource's own granularity.
    let s = stream(d0);
    for resource in [&minimum, &recommended] {
        let g = resource.granularity();
        let buffer = resource.allocate(g + 1, &s).unwrap();
        assert_eq!(buffer.size(), 2 * g);
        assert_eq!(buffer.mapped_size(), 2 * g);
    }
}

#[test]
fn resource_accessors_report_what_it_was_made_with() {
    let d0 = device(0);
    let options = VirtualMemoryResourceOptions::default().handle_type(None).address_alignment(8 * G);
    let resource = VirtualMemoryResource::new(d0, options.clone()).unwrap();
    assert_eq!(resource.device(), d0);
    assert_eq!(resource.options(), &options);
}

#[test]
fn host_location_without_a_handle_type_holds_data() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let options = VirtualMemoryResourceOptions::default().location(Location::Host).handle_type(None);
        let resource = VirtualMemoryResource::new(d0, options).unwrap();
        let buffer = resource.allocate(G / 2, &s).unwrap();
        assert_eq!(buffer.size(), G);
        assert_eq!(buffer.device(), None, "host memory belongs to no device");
        let bytes = pattern(5, 4096);
        write(&buffer, G - 4096, &bytes, &s);
        assert_eq!(read(&buffer, G - 4096, 4096, &s), bytes);
        // Not exportable, and it says how to make it so.
        let error = buffer.export().unwrap_err();
        assert!(matches!(error, VmmError::NotExportable), "{error:?}");
        assert_mentions(&error.to_string(), &["HandleType::PosixFd"]);
    });
}

#[test]
fn host_numa_location_with_posix_fd_holds_data_and_exports() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let options =
            VirtualMemoryResourceOptions::default().location(Location::HostNuma(d0.host_numa_node().unwrap()));
        let resource = VirtualMemoryResource::new(d0, options).unwrap();
        let buffer = resource.allocate(1, &s).unwrap();
        assert_eq!(buffer.size(), resource.granularity());
        let bytes = pattern(9, 100);
        write(&buffer, 0, &bytes, &s);
        assert_eq!(read(&buffer, 0, 100, &s), bytes);
        let descriptor = buffer.export().unwrap();
        assert_eq!(descriptor.handle_type, HandleType::PosixFd);
        assert_eq!(descriptor.handles.len(), 1);
        // Another host-NUMA resource maps the same bytes.
        let importer = VirtualMemoryResource::new(d0, resource.options().clone()).unwrap();
        let imported = importer.import(descriptor, &s).unwrap();
        assert_eq!(read(&imported, 0, 100, &s), bytes);
    });
}

#[test]
fn address_alignment_is_honoured() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        for alignment in [64 << 20, 1 << 30] {
            let options = VirtualMemoryResourceOptions::default().address_alignment(alignment);
            let resource = VirtualMemoryResource::new(d0, options).unwrap();
            // Several in a row, so that a lucky first address proves nothing.
            let buffers: Vec<_> = (0..3).map(|_| resource.allocate(G, &s).unwrap()).collect();
            for buffer in &buffers {
                assert_eq!(buffer.ptr() % alignment as u64, 0, "{:#x} aligned to {alignment:#x}", buffer.ptr());
            }
        }
        // An alignment below the granularity is a valid power of two: the granularity wins.
        let options = VirtualMemoryResourceOptions::default().address_alignment(4096);
        let resource = VirtualMemoryResource::new(d0, options).unwrap();
        let buffer = resource.allocate(G, &s).unwrap();
        assert_eq!(buffer.ptr() % G as u64, 0);
    });
}

#[test]
fn a_free_address_hint_is_honoured() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        // Find free addresses: reserve them, then give them back.
        let free = RawReservation::try_new(8 * G, 0).unwrap();
        let hint = free.ptr + 2 * G as u64;
        drop(free);
        let options = VirtualMemoryResourceOptions::default().address_hint(hint);
        let resource = VirtualMemoryResource::new(d0, options).unwrap();
        let first = resource.allocate(G, &s).unwrap();
        assert_eq!(first.ptr(), hint);
        // Taken now: the next allocation goes elsewhere, and still works.
        let second = resource.allocate(G, &s).unwrap();
        assert_ne!(second.ptr(), hint);
        write(&second, 0, &[1, 2, 3], &s);
        assert_eq!(read(&second, 0, 3, &s), [1, 2, 3]);
    });
}

#[test]
fn self_access_read_only_and_none() {
    machine!(&[], || {
        // Hardware faults, asynchronously, where the simulator refuses the copy at the call.
        if !cuda_sim::testing::simulator_only("copies without access") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let read_only =
            VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().self_access(Access::Read)).unwrap();
        let buffer = read_only.allocate(G, &s).unwrap();
        assert_eq!(read(&buffer, 0, 16, &s).len(), 16, "reads are allowed");
        let error = try_write(&buffer, 0, &[1; 16], &s).unwrap_err();
        assert_eq!(error.cuda_code(), Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_INVALID_VALUE), "{error}");
        let no_access =
            VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().self_access(Access::None)).unwrap();
        let buffer = no_access.allocate(G, &s).unwrap();
        assert!(try_read(&buffer, 0, 16, &s).is_err(), "no access: no reads");
        assert!(try_write(&buffer, 0, &[1; 16], &s).is_err(), "no access: no writes");
    });
}
