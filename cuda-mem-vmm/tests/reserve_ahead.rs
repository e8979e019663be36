//! Address space reserved ahead (`ReserveAhead`): growth inside the reservation keeps the
//! pointer with address hints refused, with the same driver calls at every step; growth past it
//! takes the usual path (a move when hints are refused, the addresses after it when granted);
//! a buffer grown from an old one never maps over a newer one's chunk; growths let go of (one
//! alone, or several sharing chunks at once on several threads) give every address back, so the
//! buffer they grew from grows in place again; the reservation is sized as asked and freed with
//! the last buffer; an export names the mapped chunks only.

mod common;

use std::sync::Arc;

use common::*;
use cuda_mem_core::Stream;
use cuda_mem_vmm::{ReserveAhead, VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError};
use cuda_sim::testing::CallCounts;

fn setup(ahead: impl Into<Option<ReserveAhead>>) -> (Stream, Arc<VirtualMemoryResource>) {
    let d0 = device(0);
    let s = stream(d0);
    let options = VirtualMemoryResourceOptions::default().reserve_ahead(ahead);
    (s, VirtualMemoryResource::new(d0, options).unwrap())
}

/// Granule `g` of every buffer a [`series`] grows: `pattern(g)`.
fn granules(n: usize) -> Vec<u8> {
    (0..n).flat_map(|g| pattern(g as u8, G)).collect()
}

/// Grows a one-granule buffer of `resource` to `n` granules, one granule a step, writing each
/// new granule and checking every byte after each step; per step whether it kept the pointer
/// and the growth's driver calls.
fn series(resource: &Arc<VirtualMemoryResource>, s: &Stream, n: usize) -> Vec<(bool, CallCounts)> {
    let d = cuda_sim::testing::driver().unwrap();
    let expected = granules(n);
    let mut buffer = resource.allocate(G, s).unwrap();
    write(&buffer, 0, &expected[..G], s);
    let mut steps = Vec::new();
    for g in 1..n {
        let (grown, calls) = cuda_sim::testing::count_calls(d, || buffer.grow((g + 1) * G).unwrap()).unwrap();
        write(&grown, g * G, &expected[g * G..(g + 1) * G], s);
        let what = format!("after growing to {} granules", g + 1);
        assert_bytes(&read(&grown, 0, grown.size(), s), &expected[..(g + 1) * G], &what);
        steps.push((grown.ptr() == buffer.ptr(), calls));
        buffer = grown;
    }
    steps
}

#[test]
fn growth_inside_the_reservation_never_moves_with_hints_refused() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS and call counts are the simulator's") {
            return;
        }
        // 2 MiB to 64 MiB, all of it reserved ahead.
        let (s, resource) = setup(ReserveAhead::Bytes(32 * G));
        let baseline = vmm_live();
        let steps = series(&resource, &s, 32);
        assert_eq!(steps.len(), 31);
        let moved: Vec<usize> = (0..steps.len()).filter(|&i| !steps[i].0).collect();
        assert_eq!(moved, [] as [usize; 0], "no step moves");
        let first = &steps[0].1;
        for (i, (_, calls)) in steps.iter().enumerate() {
            assert_eq!(calls, first, "step {i} makes the same calls as the first");
        }
        assert_eq!(first.of("cuMemAddressReserve"), 0, "no address asked for: {first:?}");
        assert_eq!((first.of("cuMemCreate"), first.of("cuMemMap")), (1, 1), "one chunk created and mapped: {first:?}");
        assert_eq!(vmm_live(), baseline, "everything freed with the last buffer");

        // Without the option every step moves, and maps every chunk again.
        let (s, resource) = setup(None);
        let steps = series(&resource, &s, 8);
        assert!(steps.iter().all(|(in_place, _)| !in_place), "every hint refused: every step moves");
        let maps: Vec<u32> = steps.iter().map(|(_, calls)| calls.of("cuMemMap")).collect();
        assert_eq!(maps, (2..=8).collect::<Vec<u32>>(), "a moving step maps every chunk");
    });
}

#[test]
fn growth_past_the_reservation_moves_with_hints_refused() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS is the simulator's") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(3 * G));
        let baseline = vmm_live();
        let steps = series(&resource, &s, 5);
        let in_place: Vec<bool> = steps.iter().map(|(in_place, _)| *in_place).collect();
        // 2 and 3 granules inside the first reservation; 4 past it (a move into a reservation of
        // 4 granules, the buffer's size being larger than 3), 5 past that one.
        assert_eq!(in_place, [true, true, false, false]);
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn growth_past_the_reservation_takes_the_granted_addresses_and_reserves_ahead_again() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("the simulator's address placement and call counts") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(2 * G));
        let baseline = vmm_live();
        let steps = series(&resource, &s, 6);
        let reserves: Vec<(bool, u32)> =
            steps.iter().map(|(in_place, calls)| (*in_place, calls.of("cuMemAddressReserve"))).collect();
        // Inside the first reservation; then the addresses after it (a reservation of 2 granules,
        // granted), then inside that one; and again.
        assert_eq!(reserves, [(true, 0), (true, 1), (true, 0), (true, 1), (true, 0)]);
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn a_buffer_grown_again_from_an_old_one_never_maps_over_a_newer_one() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS and live-object counts are the simulator's") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(8 * G));
        let baseline = vmm_live();
        let a = resource.allocate(G, &s).unwrap();
        write(&a, 0, &pattern(1, G), &s);
        let b = a.grow(2 * G).unwrap();
        assert_eq!(b.ptr(), a.ptr());
        write(&b, G, &pattern(2, G), &s);
        assert_eq!(vmm_live(), plus(baseline, 1, 2, 2), "one reservation for both");

        // The addresses after `a` are `b`'s: growing `a` again must go elsewhere.
        let c = a.grow(2 * G).unwrap();
        assert_ne!(c.ptr(), a.ptr(), "moved: the addresses after `a` are mapped");
        write(&c, G, &pattern(3, G), &s);
        assert_bytes(&read(&b, G, G, &s), &pattern(2, G), "`b`'s second chunk is its own");
        assert_bytes(&read(&c, 0, G, &s), &pattern(1, G), "`c` shares the first chunk");
        assert_bytes(&read(&c, G, G, &s), &pattern(3, G), "`c`'s second chunk");

        // `b` grows on inside the reservation.
        let d = b.grow(3 * G).unwrap();
        assert_eq!(d.ptr(), a.ptr());
        drop((c, d));
        // Once `b` (and what grew from it) is gone, the addresses after `a` are free again.
        drop(b);
        let e = a.grow(2 * G).unwrap();
        assert_eq!(e.ptr(), a.ptr(), "in place again");
        assert_bytes(&read(&e, 0, G, &s), &pattern(1, G), "the first chunk");

        // The reservation lives while any buffer maps part of it.
        drop(a);
        assert_eq!(vmm_live(), plus(baseline, 1, 2, 2));
        drop(e);
        assert_eq!(vmm_live(), baseline, "the whole reservation freed with the last buffer");
    });
}

#[test]
fn device_memory_reserves_as_much_address_space_as_the_device_has_memory() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("the simulator's address placement") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::DeviceMemory);
        let total = resource.device().total_memory().unwrap();
        let buffer = resource.allocate(G, &s).unwrap();
        let inside = RawReservation::try_new(G, buffer.ptr() + (total - G) as u64).unwrap();
        assert_ne!(inside.ptr, buffer.ptr() + (total - G) as u64, "the last granule is reserved");
        // (Dropped first: placed elsewhere, it may have taken the addresses after the buffer's.)
        drop(inside);
        let after = RawReservation::try_new(G, buffer.ptr() + total as u64).unwrap();
        assert_eq!(after.ptr, buffer.ptr() + total as u64, "the addresses after it are free");
        drop(after);
        let grown = buffer.grow(16 * G).unwrap();
        assert_eq!((grown.ptr(), grown.mapped_size()), (buffer.ptr(), 16 * G));
    });
}

#[test]
fn an_export_names_the_mapped_chunks_only() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS and live-object counts are the simulator's") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(8 * G));
        let one = resource.allocate(G, &s).unwrap();
        let two = one.grow(2 * G).unwrap();
        assert_eq!(two.ptr(), one.ptr());
        write(&two, 0, &pattern(5, 2 * G), &s);
        let baseline = vmm_live();
        let descriptor = two.export().unwrap();
        assert_eq!(descriptor.chunk_sizes, [G as u64, G as u64]);
        assert_eq!(descriptor.size, 2 * G as u64);
        // Imported by a resource without the option: one reservation of the mapped part (the
        // imported handles count as physical allocations of their own).
        let importer = VirtualMemoryResource::new(resource.device(), Default::default()).unwrap();
        let imported = importer.import(descriptor, &s).unwrap();
        assert_eq!((imported.size(), imported.mapped_size()), (2 * G, 2 * G));
        assert_eq!(vmm_live(), plus(baseline, 1, 2, 2));
        assert_bytes(&read(&imported, 0, 2 * G, &s), &pattern(5, 2 * G), "the same bytes");
        // The exporter grows on in its reservation; the importer's mapping stays as it was.
        let three = two.grow(3 * G).unwrap();
        assert_eq!(three.ptr(), one.ptr());
        assert_eq!(imported.mapped_size(), 2 * G);
    });
}

#[test]
fn a_reservation_too_large_to_round_is_refused() {
    let d0 = device(0);
    let options = VirtualMemoryResourceOptions::default().reserve_ahead(ReserveAhead::Bytes(usize::MAX));
    let error = VirtualMemoryResource::new(d0, options).unwrap_err();
    assert!(matches!(error, VmmError::SizeOverflow { size: usize::MAX, .. }), "{error:?}");
}

/// A reservation the driver cannot give is refused by `new`, naming the size asked for, instead
/// of a resource whose every allocation would fail with `cuMemAddressReserve`'s
/// `CUDA_ERROR_OUT_OF_MEMORY`; a reasonable size is accepted and allocates.
#[test]
fn a_reservation_the_driver_cannot_give_is_refused_at_construction() {
    let d0 = device(0);
    for bytes in [1usize << 50, 1 << 63] {
        let options = VirtualMemoryResourceOptions::default().reserve_ahead(ReserveAhead::Bytes(bytes));
        let error = VirtualMemoryResource::new(d0, options).unwrap_err();
        assert!(
            matches!(
                error,
                VmmError::ReserveAheadRefused { requested: ReserveAhead::Bytes(b), size, .. } if b == bytes && size == bytes
            ),
            "{bytes}: {error:?}"
        );
        assert!(error.cuda_code().is_some(), "the driver's refusal is the source: {error:?}");
        assert_mentions(&error.to_string(), &[&bytes.to_string(), "cuMemAddressReserve", "ReserveAhead"]);
    }
    let (s, resource) = setup(ReserveAhead::Bytes(64 << 20));
    let buffer = resource.allocate(G, &s).unwrap();
    write(&buffer, 0, &[1, 2, 3], &s);
    assert_eq!(read(&buffer, 0, 3, &s), [1, 2, 3]);
    assert_eq!(buffer.grow(2 * G).unwrap().ptr(), buffer.ptr(), "grown inside the reservation");
}

#[test]
fn a_failed_growth_inside_the_reservation_gives_its_addresses_back_once() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(8 * G));
        let buffer = resource.allocate(G, &s).unwrap();
        let bytes = pattern(3, G);
        write(&buffer, 0, &bytes, &s);
        // Mapped, then its access refused: unmapped again, and the claimed addresses given back
        // by the claim alone (the mapping that was unmapped never held them).
        for function in [c"cuMemMap", c"cuMemSetAccess"] {
            let before = vmm_live();
            inject(function, 1);
            let error = buffer.grow(2 * G).expect_err("the growth fails");
            assert!(error.to_string().contains(function.to_str().unwrap()), "{error}");
            assert_eq!(vmm_live(), before, "nothing left mapped");
        }
        // The addresses are free again: the growth stays inside the reservation.
        let grown = buffer.grow(2 * G).unwrap();
        assert_eq!(grown.ptr(), buffer.ptr(), "in place, with hints refused");
        assert_eq!(read(&grown, 0, G, &s), bytes);
        let again = grown.grow(3 * G).unwrap();
        assert_eq!(again.ptr(), buffer.ptr(), "and the next step after it");
    });
}

#[test]
fn a_buffer_grown_by_several_chunks_and_dropped_alone_gives_all_its_addresses_back() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS and live-object counts are the simulator's") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(8 * G));
        let baseline = vmm_live();
        let a = resource.allocate(G, &s).unwrap();
        write(&a, 0, &pattern(1, G), &s);
        // Three chunks in place; the two-chunk buffer in between is gone at once, so the last
        // two chunks are `d`'s alone.
        let d = a.grow(2 * G).unwrap().grow(3 * G).unwrap();
        assert_eq!((d.ptr(), d.chunk_count()), (a.ptr(), 3));
        assert_eq!(vmm_live(), plus(baseline, 1, 3, 3));
        drop(d);
        assert_eq!(vmm_live(), plus(baseline, 1, 1, 1), "`d`'s own two chunks are unmapped");

        // Every address after `a` is free again: it grows in place, and on from there.
        let e = a.grow(2 * G).unwrap();
        assert_eq!(e.ptr(), a.ptr(), "in place again, with hints refused");
        let f = e.grow(4 * G).unwrap();
        assert_eq!(f.ptr(), a.ptr(), "and on inside the reservation");
        assert_bytes(&read(&f, 0, G, &s), &pattern(1, G), "the first chunk is `a`'s");
        drop((e, f));
        drop(a);
        assert_eq!(vmm_live(), baseline, "everything freed with the last buffer");
    });
}

#[test]
fn siblings_sharing_chunks_dropped_at_once_give_all_their_addresses_back() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS and live-object counts are the simulator's") {
            return;
        }
        let (s, resource) = setup(ReserveAhead::Bytes(8 * G));
        let baseline = vmm_live();
        let a = resource.allocate(G, &s).unwrap();
        for round in 0..50 {
            // `a` < `b` < `c` < `d`, each one chunk more, all in place; `b`, `c` and `d` are let
            // go of at once on three threads, whichever unmaps each shared chunk last.
            let b = a.grow(2 * G).unwrap();
            let c = b.grow(3 * G).unwrap();
            let d = c.grow(5 * G).unwrap();
            assert_eq!([b.ptr(), c.ptr(), d.ptr()], [a.ptr(); 3], "round {round}: in place");
            let start = std::sync::Barrier::new(3);
            std::thread::scope(|scope| {
                for buffer in [b, c, d] {
                    let start = &start;
                    scope.spawn(move || {
                        start.wait();
                        drop(buffer);
                    });
                }
            });
            assert_eq!(vmm_live(), plus(baseline, 1, 1, 1), "round {round}: only `a`'s chunk is left");
        }
        let e = a.grow(8 * G).unwrap();
        assert_eq!(e.ptr(), a.ptr(), "the whole reservation after `a` is free");
    });
}
