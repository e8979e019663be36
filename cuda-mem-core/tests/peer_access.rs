//! Peer access on device pools, on simulated 2- and 3-device machines (on a GPU machine, with
//! the devices it has, or declared skips).

mod common;

use std::collections::BTreeSet;

use cuda_mem_core::{Access, Buffer, Device, DeviceMemoryResource, Error, FillPattern, Stream, StreamOptions};
use cuda_sim::testing::in_simulated_machine;

/// Whether a copy run by `device` into `target` (memory of another device's pool) succeeds.
fn device_can_write(device: Device, target: &mut Buffer) -> bool {
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let source = DeviceMemoryResource::current(device).unwrap().allocate(target.size(), &stream).unwrap();
    let ok = target.copy_from(&source, &stream).is_ok();
    stream.synchronize().unwrap();
    ok
}

fn subsets(items: &[Device]) -> Vec<BTreeSet<Device>> {
    (0..1u32 << items.len())
        .map(|mask| items.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, d)| *d).collect())
        .collect()
}

#[test]
fn every_transition_between_peer_sets_on_three_devices() {
    in_simulated_machine("every_transition_between_peer_sets_on_three_devices", &[("CUDA_SIM_DEVICES", "3")], || {
        let Some(devices) = common::devices(3) else {
            return;
        };
        let owner = devices[0];
        owner.set_current().unwrap();
        let stream = common::stream(owner);
        let dmr = DeviceMemoryResource::new(owner, Default::default()).unwrap();
        let mut target = dmr.allocate(4096, &stream).unwrap();
        target.fill(FillPattern::U8(0), &stream).unwrap();
        stream.synchronize().unwrap();
        let others = &devices[1..];
        for from in subsets(others) {
            for to in subsets(others) {
                dmr.pool().set_peer_accessible_by(from.iter().copied()).unwrap();
                assert_eq!(dmr.pool().peer_accessible_by().unwrap(), from);
                dmr.pool().set_peer_accessible_by(to.iter().copied()).unwrap();
                assert_eq!(dmr.pool().peer_accessible_by().unwrap(), to, "{from:?} -> {to:?}");
                for &device in others {
                    let expected = to.contains(&device);
                    assert_eq!(device_can_write(device, &mut target), expected, "{device} after {from:?} -> {to:?}");
                    let access = dmr.pool().access(device).unwrap();
                    assert_eq!(access == Access::ReadWrite, expected);
                }
                assert!(device_can_write(owner, &mut target), "the owner always has access");
            }
        }
        // The owner is never part of the set, even when asked for.
        dmr.pool().set_peer_accessible_by([owner, devices[1]]).unwrap();
        assert_eq!(dmr.pool().peer_accessible_by().unwrap(), BTreeSet::from([devices[1]]));
        dmr.pool().add_peer(devices[2]).unwrap();
        dmr.pool().remove_peer(devices[1]).unwrap();
        dmr.pool().remove_peer(owner).unwrap();
        assert_eq!(dmr.pool().peer_accessible_by().unwrap(), BTreeSet::from([devices[2]]));
    });
}

#[test]
fn a_device_that_cannot_be_a_peer_is_named_and_nothing_changes() {
    in_simulated_machine(
        "a_device_that_cannot_be_a_peer_is_named_and_nothing_changes",
        &[("CUDA_SIM_DEVICES", "3"), ("CUDA_SIM_PEER_ACCESS", "0-1")],
        || {
            let Some(devices) = common::devices(3) else {
                return;
            };
            let owner = devices[0];
            if owner.can_access_peer(devices[2]).unwrap() {
                cuda_sim::testing::skip("needs a device that cannot access device 0");
                return;
            }
            let dmr = DeviceMemoryResource::new(owner, Default::default()).unwrap();
            dmr.pool().add_peer(devices[1]).unwrap();
            let err = dmr.pool().set_peer_accessible_by([devices[2]]).unwrap_err();
            assert!(matches!(&err, Error::PeerAccess { owner: 0, peers } if peers == &[2]), "{err}");
            assert_eq!(
                err.to_string(),
                "device(s) [2] cannot access memory of device 0; peer access was left unchanged"
            );
            assert_eq!(dmr.pool().peer_accessible_by().unwrap(), BTreeSet::from([devices[1]]));
            assert!(dmr.pool().add_peer(devices[2]).is_err());
        },
    );
}

#[test]
fn two_wrappers_of_the_current_pool_agree() {
    in_simulated_machine("two_wrappers_of_the_current_pool_agree", &[("CUDA_SIM_DEVICES", "2")], || {
        let Some(devices) = common::devices(2) else {
            return;
        };
        let a = DeviceMemoryResource::current(devices[0]).unwrap();
        let b = DeviceMemoryResource::current(devices[0]).unwrap();
        a.pool().add_peer(devices[1]).unwrap();
        assert_eq!(b.pool().peer_accessible_by().unwrap(), BTreeSet::from([devices[1]]));
        b.pool().set_peer_accessible_by([]).unwrap();
        assert!(a.pool().peer_accessible_by().unwrap().is_empty());
    });
}

#[test]
fn a_destroyed_pool_leaves_no_access_behind() {
    // Handle values recycled, as the driver may: the case nvbug 5698116 concerns.
    let settings = [("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_POOL_HANDLES", "recycle")];
    in_simulated_machine("a_destroyed_pool_leaves_no_access_behind", &settings, || {
        let Some(devices) = common::devices(2) else {
            return;
        };
        let first = DeviceMemoryResource::new(devices[0], Default::default()).unwrap();
        first.pool().add_peer(devices[1]).unwrap();
        drop(first);
        // The driver may give the next pool the old handle and, with it, the old access
        // (nvbug 5698116); the simulator models that, so this checks the revocation on drop.
        let second = DeviceMemoryResource::new(devices[0], Default::default()).unwrap();
        assert!(second.pool().peer_accessible_by().unwrap().is_empty());
        assert_eq!(second.pool().access(devices[1]).unwrap(), Access::None);
    });
}

#[test]
fn the_simulator_models_inherited_access_when_a_pool_is_destroyed_without_revoking() {
    if !cuda_sim::testing::simulator_only("the simulator's model of nvbug 5698116") {
        return;
    }
    in_simulated_machine(
        "the_simulator_models_inherited_access_when_a_pool_is_destroyed_without_revoking",
        &[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_POOL_HANDLES", "recycle")],
        || {
            let devices = common::devices(2).unwrap();
            let first = DeviceMemoryResource::new(devices[0], Default::default()).unwrap();
            first.pool().add_peer(devices[1]).unwrap();
            let d = cuda_mem_core::driver().unwrap();
            let raw = first.pool().handle();
            // SAFETY: destroys the pool behind the wrapper's back, then forgets the wrapper so it
            // is not destroyed twice.
            unsafe { cuda_mem_sys::cu_call!(d, cuMemPoolDestroy(raw)) }.unwrap();
            std::mem::forget(first);
            let second = DeviceMemoryResource::new(devices[0], Default::default()).unwrap();
            assert_eq!(second.pool().handle(), raw, "the destroyed pool's handle value, recycled");
            assert_eq!(second.pool().peer_accessible_by().unwrap(), BTreeSet::from([devices[1]]));
        },
    );
}

#[test]
fn peer_access_is_only_for_device_pools() {
    common::device();
    let pinned = cuda_mem_core::PinnedMemoryResource::current().unwrap();
    assert!(matches!(pinned.pool().peer_accessible_by(), Err(Error::PeerAccessNeedsDevicePool)));
}
