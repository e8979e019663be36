//! Growth: in place (same pointer, one more chunk), by moving (a new pointer over the same
//! chunks and a new one), to a size already covered (no driver call), with peers keeping their
//! access, and a property test over random sequences of allocations, writes, growths and drops
//! against a host model.

mod common;

use common::*;
use cuda_mem_core::{FillPattern, Stream};
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};

#[test]
fn in_place_growth_keeps_the_pointer_and_the_bytes() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("live-object counts and the simulator's address placement") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        let small = resource.allocate(G, &s).unwrap();
        let first = pattern(1, G);
        write(&small, 0, &first, &s);

        let grown = small.grow(G + 1).unwrap();
        assert_eq!(grown.ptr(), small.ptr(), "in place: the same pointer");
        assert_eq!(grown.chunk_count(), small.chunk_count() + 1);
        assert_eq!((grown.size(), grown.mapped_size()), (2 * G, 2 * G));
        assert_eq!((small.size(), small.chunk_count()), (G, 1), "the old buffer is unchanged");
        assert_eq!(vmm_live(), plus(baseline, 2, 2, 2), "one more reservation, mapping and chunk");
        assert_bytes(&read(&grown, 0, G, &s), &first, "the bytes written before growth are there");
        assert_bytes(&read(&small, 0, G, &s), &first, "the old buffer's chunk");

        // A copy across the chunk boundary, and aliasing both ways.
        let across = pattern(2, 8192);
        write(&grown, G - 4096, &across, &s);
        assert_eq!(read(&grown, G - 4096, 8192, &s), across);
        assert_eq!(read(&small, G - 4096, 4096, &s), across[..4096]);
        write(&small, 0, &[0xAB; 100], &s);
        assert_eq!(read(&grown, 0, 100, &s), [0xAB; 100]);

        // Again, from the grown buffer, by more than one granule.
        let bigger = grown.grow(5 * G).unwrap();
        assert_eq!(bigger.ptr(), small.ptr());
        assert_eq!((bigger.chunk_count(), bigger.size()), (3, 5 * G));
        assert_eq!(vmm_live(), plus(baseline, 3, 3, 3));
        write(&bigger, 5 * G - 10, &[3; 10], &s);
        assert_eq!(read(&bigger, 0, 100, &s), [0xAB; 100]);

        // The first buffer's chunk stays mapped while a grown buffer uses it.
        drop(small);
        assert_eq!(vmm_live(), plus(baseline, 3, 3, 3));
        assert_bytes(
            &read(&grown, 100, G - 4196, &s),
            &first[100..G - 4096],
            "the first chunk, after the first buffer went",
        );
        drop(grown);
        assert_eq!(read(&bigger, G - 4096, 8192, &s), across);
        drop(bigger);
        assert_eq!(vmm_live(), baseline, "nothing outlives the last buffer");
    });
}

#[test]
fn growth_moves_when_the_next_addresses_are_taken() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("live-object counts and the simulator's address placement") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        let a = resource.allocate(G, &s).unwrap();
        let b = a.grow(2 * G).unwrap();
        assert_eq!(b.ptr(), a.ptr());
        let (pa, pb) = (pattern(10, G), pattern(20, G));
        write(&a, 0, &pa, &s);
        write(&b, G, &pb, &s);

        let blocker = block_after(&b, G);
        let before = vmm_live();
        let c = b.grow(3 * G).unwrap();
        assert_ne!(c.ptr(), b.ptr(), "moved: a new pointer");
        assert_eq!((c.size(), c.chunk_count(), c.mapped_size()), (3 * G, 3, 3 * G));
        assert_eq!(vmm_live(), plus(before, 1, 3, 1), "a new reservation, every chunk mapped again, one new chunk");
        assert_bytes(&read(&c, 0, G, &s), &pa, "no copy, yet the bytes are there");
        assert_bytes(&read(&c, G, G, &s), &pb, "the in-place chunk through the moved buffer");
        assert_bytes(&read(&b, 0, G, &s), &pa, "the old buffers still work");
        assert_bytes(&read(&a, 0, G, &s), &pa, "the first buffer");

        // The new and old addresses alias the same memory.
        write(&c, 0, &[1; 64], &s);
        assert_eq!(read(&a, 0, 64, &s), [1; 64]);
        write(&b, 2 * G - 64, &[2; 64], &s);
        assert_eq!(read(&c, 2 * G - 64, 64, &s), [2; 64]);
        write(&c, 2 * G - 32, &pattern(4, 4096), &s);
        assert_eq!(read(&b, 2 * G - 32, 32, &s), pattern(4, 32));
        drop(blocker);

        // The old buffers go; the moved one keeps the chunks.
        drop((a, b));
        assert_eq!(vmm_live(), plus(baseline, 1, 3, 3));
        assert_bytes(&read(&c, 64, G - 64, &s), &pa[64..], "the first chunk, after the old buffers went");
        drop(c);
        assert_eq!(vmm_live(), baseline);
    });
}

/// Grows one buffer `steps` times by a granule, writing each new granule, and checks every
/// byte after each step; returns which steps kept the pointer.
fn grow_step_by_step(steps: usize) -> Vec<bool> {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
    let mut buffer = resource.allocate(G, &s).unwrap();
    write(&buffer, 0, &pattern(0, G), &s);
    let mut in_place = Vec::new();
    for step in 1..=steps {
        let grown = buffer.grow((step + 1) * G).unwrap();
        in_place.push(grown.ptr() == buffer.ptr());
        drop(std::mem::replace(&mut buffer, grown));
        write(&buffer, step * G, &pattern(step as u8, G), &s);
        for granule in 0..=step {
            let what = format!("granule {granule} after growth step {step}");
            assert_bytes(&read(&buffer, granule * G, G, &s), &pattern(granule as u8, G), &what);
        }
    }
    in_place
}

#[test]
fn growth_keeps_the_data_when_the_driver_refuses_address_hints() {
    // The driver need not honour cuMemAddressReserve's hint (an H100 moved 32 of 511 in-place
    // growth steps); the simulator refuses hints under CUDA_SIM_ADDRESS_HINTS, so the moving
    // path runs where hardware would take it.
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS is the simulator's") {
            return;
        }
        assert_eq!(grow_step_by_step(4), [false; 4], "every hint refused: every step moves");
    });
}

#[test]
fn growth_keeps_the_data_when_the_driver_refuses_some_address_hints() {
    machine!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-every-2")], || {
        if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS is the simulator's") {
            return;
        }
        let in_place = grow_step_by_step(6);
        assert!(in_place.contains(&true) && in_place.contains(&false), "both paths taken: {in_place:?}");
    });
}

#[test]
fn growing_to_a_covered_size_makes_no_driver_call() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection and live-object counts") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        let buffer = resource.allocate(G + 1, &s).unwrap();
        write(&buffer, 0, &[9; 9], &s);
        let before = vmm_live();
        for function in [c"cuMemAddressReserve", c"cuMemCreate", c"cuMemMap", c"cuMemSetAccess"] {
            inject(function, 1);
        }
        let smaller = buffer.grow(1).unwrap();
        let same = buffer.grow(2 * G).unwrap();
        for covered in [&smaller, &same] {
            assert_eq!(covered.ptr(), buffer.ptr());
            assert_eq!((covered.size(), covered.chunk_count(), covered.mapped_size()), (2 * G, 1, 2 * G));
        }
        assert_eq!(vmm_live(), before, "nothing reserved, created or mapped");
        assert_eq!(read(&same, 0, 9, &s), [9; 9]);
        write(&smaller, 2 * G - 1, &[4], &s);
        assert_eq!(read(&buffer, 2 * G - 1, 1, &s), [4]);
        // Every armed failure is still pending: the next call of each meets it.
        let error = RawReservation::try_new(G, 0).unwrap_err();
        assert_eq!(error.cuda_code(), Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        for step in ["cuMemCreate", "cuMemMap", "cuMemSetAccess"] {
            let error = buffer.grow(3 * G).unwrap_err();
            assert_mentions(&error.to_string(), &[step, "CUDA_ERROR_OUT_OF_MEMORY"]);
            assert_eq!(vmm_live(), before);
        }
        // The shared range outlives the buffer it came from.
        drop(buffer);
        assert_eq!(read(&same, 2 * G - 1, 1, &s), [4]);
        drop((smaller, same));
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn a_buffer_of_another_resource_is_refused() {
    let d0 = device(0);
    let s = stream(d0);
    let mine = VirtualMemoryResource::new(d0, Default::default()).unwrap();
    let theirs = VirtualMemoryResource::new(d0, Default::default()).unwrap();
    let buffer = theirs.allocate(G, &s).unwrap();
    let error = mine.grow(&buffer, 2 * G).unwrap_err();
    assert!(matches!(error, VmmError::ForeignBuffer), "{error:?}");
    assert_mentions(&error.to_string(), &["not allocated by this"]);
    assert_eq!(theirs.grow(&buffer, 2 * G).unwrap().size(), 2 * G);
}

#[test]
fn grown_chunks_keep_their_peers_access() {
    machine!(&[("CUDA_SIM_DEVICES", "2")], || {
        let d0 = device(0);
        let Some(d1) = try_device(1) else { return };
        d0.set_current().unwrap();
        if !d1.can_access_peer(d0).unwrap() {
            cuda_sim::testing::skip("device 1 cannot access device 0");
            return;
        }
        let (s0, s1) = (stream(d0), stream(d1));
        let resource = VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().peers([d1])).unwrap();
        let a = resource.allocate(G, &s0).unwrap();
        let b = a.grow(2 * G).unwrap();
        let blocker = block_after(&b, G);
        let c = b.grow(3 * G).unwrap();
        assert_eq!(b.ptr(), a.ptr());
        assert_ne!(c.ptr(), b.ptr());
        drop(blocker);
        for (i, buffer) in [&a, &b, &c].into_iter().enumerate() {
            for chunk in 0..buffer.chunk_count() {
                let at = chunk * G;
                let bytes = pattern((10 * i + chunk) as u8, 256);
                write(buffer, at, &bytes, &s1);
                assert_eq!(read(buffer, at, 256, &s1), bytes, "device 1, buffer {i}, chunk {chunk}");
                assert_eq!(read(buffer, at, 256, &s0), bytes, "device 0, buffer {i}, chunk {chunk}");
            }
        }
        assert_eq!(read(&c, 0, 256, &s1), pattern(20, 256), "the last write through the moved buffer");
    });
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    /// Allocates a new buffer.
    Allocate { size: usize },
    /// Writes `len` bytes (clamped) at a random offset of a buffer through pinned staging.
    Write { buffer: Index, offset: Index, len: usize, seed: u8 },
    /// Fills a whole buffer on the device.
    Fill { buffer: Index, byte: u8 },
    /// Grows a buffer to a random size up to three granules past its end, after blocking the
    /// addresses after it or not.
    Grow { buffer: Index, size: Index, block: bool },
    /// Drops a buffer (an old one or a grown one alike).
    Drop { buffer: Index },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0usize..=3 * G).prop_map(|size| Op::Allocate { size }),
        3 => (any::<Index>(), any::<Index>(), 1usize..=G + 8192, any::<u8>())
            .prop_map(|(buffer, offset, len, seed)| Op::Write { buffer, offset, len, seed }),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(buffer, byte)| Op::Fill { buffer, byte }),
        3 => (any::<Index>(), any::<Index>(), any::<bool>()).prop_map(|(buffer, size, block)| Op::Grow { buffer, size, block }),
        2 => any::<Index>().prop_map(|buffer| Op::Drop { buffer }),
    ]
}

/// The host's picture: every physical chunk's bytes, and each buffer's chunks and size.
#[derive(Default)]
struct Model {
    chunks: Vec<Vec<u8>>,
    buffers: Vec<(Vec<usize>, usize)>,
}

impl Model {
    fn mapped(&self, buffer: usize) -> usize {
        self.buffers[buffer].0.iter().map(|&c| self.chunks[c].len()).sum()
    }

    fn new_chunk(&mut self, size: usize) -> usize {
        self.chunks.push(vec![0; size]);
        self.chunks.len() - 1
    }

    fn expected(&self, buffer: usize) -> Vec<u8> {
        let (chunks, size) = &self.buffers[buffer];
        let mut bytes = Vec::with_capacity(*size);
        for &c in chunks {
            bytes.extend_from_slice(&self.chunks[c]);
        }
        bytes.truncate(*size);
        bytes
    }

    fn write(&mut self, buffer: usize, mut offset: usize, mut bytes: &[u8]) {
        for &chunk in &self.buffers[buffer].0 {
            let data = &mut self.chunks[chunk];
            if offset >= data.len() {
                offset -= data.len();
                continue;
            }
            let n = bytes.len().min(data.len() - offset);
            data[offset..offset + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            offset = 0;
            if bytes.is_empty() {
                break;
            }
        }
        assert!(bytes.is_empty(), "model write past the end");
    }

    /// What growing `buffer` to `new_size` gives.
    fn grow(&mut self, buffer: usize, new_size: usize) -> (Vec<usize>, usize) {
        let mapped = self.mapped(buffer);
        let requested = new_size.next_multiple_of(G);
        let (chunks, size) = self.buffers[buffer].clone();
        if requested <= mapped {
            return (chunks, requested.max(size));
        }
        let added = self.new_chunk(requested - mapped);
        let mut chunks = chunks;
        chunks.push(added);
        (chunks, requested)
    }
}

fn check(model: &Model, real: &[VirtualBuffer], buffer: usize, s: &Stream, context: &str) {
    let (chunks, size) = &model.buffers[buffer];
    let actual = &real[buffer];
    assert_eq!(actual.size(), *size, "{context}: size");
    assert_eq!(actual.chunk_count(), chunks.len(), "{context}: chunk count");
    assert_eq!(actual.mapped_size(), model.mapped(buffer), "{context}: mapped size");
    let bytes = read(actual, 0, *size, s);
    let expected = model.expected(buffer);
    // Slice equality first (a memcmp, fast even unoptimized); the position only on failure.
    if bytes != expected {
        let at = bytes.iter().zip(&expected).position(|(a, b)| a != b);
        panic!("{context}: buffer {buffer} differs from the model at byte {at:?} of {size}");
    }
}

fn run(resource: &std::sync::Arc<VirtualMemoryResource>, s: &Stream, ops: &[Op]) {
    let mut model = Model::default();
    let mut real: Vec<VirtualBuffer> = Vec::new();
    let mut blockers = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let context = format!("step {step} ({op:?})");
        match op {
            Op::Allocate { size } => {
                let buffer = resource.allocate(*size, s).unwrap();
                let requested = size.next_multiple_of(G);
                let chunks = if requested == 0 { Vec::new() } else { vec![model.new_chunk(requested)] };
                model.buffers.push((chunks, requested));
                real.push(buffer);
                check(&model, &real, real.len() - 1, s, &context);
            }
            Op::Write { buffer, offset, len, seed } => {
                if real.is_empty() {
                    continue;
                }
                let i = buffer.index(real.len());
                let size = real[i].size();
                if size == 0 {
                    continue;
                }
                let offset = offset.index(size);
                let bytes = pattern(*seed, (*len).min(size - offset));
                write(&real[i], offset, &bytes, s);
                model.write(i, offset, &bytes);
                check(&model, &real, i, s, &context);
            }
            Op::Fill { buffer, byte } => {
                if real.is_empty() {
                    continue;
                }
                let i = buffer.index(real.len());
                real[i].fill(FillPattern::U8(*byte), s).unwrap();
                let size = real[i].size();
                model.write(i, 0, &vec![*byte; size]);
                check(&model, &real, i, s, &context);
            }
            Op::Grow { buffer, size, block } => {
                if real.is_empty() {
                    continue;
                }
                let i = buffer.index(real.len());
                let old = &real[i];
                let new_size = 1 + size.index(old.size() + 3 * G);
                let blocked = *block && old.mapped_size() > 0 && new_size.next_multiple_of(G) > old.mapped_size();
                if blocked {
                    // Taken already (by a later growth) or not: either way growth must move.
                    let end = old.ptr() + old.mapped_size() as u64;
                    blockers.push(RawReservation::try_new(G, end).unwrap());
                }
                let grown = old.grow(new_size).unwrap();
                if blocked {
                    assert_ne!(grown.ptr(), old.ptr(), "{context}: blocked growth moves");
                }
                if grown.ptr() == old.ptr() {
                    assert!(grown.chunk_count() >= old.chunk_count());
                }
                let entry = model.grow(i, new_size);
                model.buffers.push(entry);
                real.push(grown);
                check(&model, &real, i, s, &context);
                check(&model, &real, real.len() - 1, s, &context);
            }
            Op::Drop { buffer } => {
                if real.is_empty() {
                    continue;
                }
                let i = buffer.index(real.len());
                drop(real.remove(i));
                model.buffers.remove(i);
            }
        }
    }
    for i in 0..real.len() {
        check(&model, &real, i, s, "at the end");
    }
    drop(real);
    drop(blockers);
}

#[test]
fn random_sequences_match_a_host_model_and_leak_nothing() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("zeroed fresh memory and live-object counts") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        let config = Config { cases: 30, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
        let mut runner = TestRunner::new(config);
        runner
            .run(&prop::collection::vec(op(), 1..14), |ops| {
                run(&resource, &s, &ops);
                let live = vmm_live();
                prop_assert_eq!(live, baseline, "after everything was dropped, for {:?}", ops);
                Ok(())
            })
            .unwrap();
    });
}
