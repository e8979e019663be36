//! Property tests: pool accounting, peer-access sets, and fills and copies against host models.

mod common;

use std::collections::BTreeSet;

use cuda_mem_core::{
    Buffer, DeviceMemoryResource, Event, EventOptions, FillPattern, MemoryResourceExt, PinnedMemoryResource,
    PinnedMemoryResourceOptions, ScopedBuffer, Stream,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum PoolOp {
    /// A `Buffer`, or with `scoped` a `ScopedBuffer` (borrowing the pool and the stream).
    Allocate {
        size: usize,
        stream: usize,
        scoped: bool,
    },
    Free {
        index: usize,
    },
    ResetPeaks,
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        4 => (1usize..3 << 20, 0usize..3, any::<bool>())
            .prop_map(|(size, stream, scoped)| PoolOp::Allocate { size, stream, scoped }),
        3 => any::<usize>().prop_map(|index| PoolOp::Free { index }),
        1 => Just(PoolOp::ResetPeaks),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// `used_mem_current` equals the live bytes (on the simulator exactly; a driver may round
    /// up), and the high-water marks never fall until reset; shared and scoped buffers alike.
    #[test]
    fn pool_accounting_matches_live_bytes(ops in prop::collection::vec(pool_op(), 1..40)) {
        let device = common::device();
        let streams: Vec<Stream> = (0..3).map(|_| common::stream(device)).collect();
        let dmr = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let pool = dmr.pool();
        let mut live: Vec<ScopedBuffer<'_>> = Vec::new();
        let (mut used_high, mut reserved_high) = (0u64, 0u64);
        for op in ops {
            match op {
                PoolOp::Allocate { size, stream, scoped: false } => {
                    live.push(dmr.allocate(size, &streams[stream]).unwrap());
                }
                PoolOp::Allocate { size, stream, scoped: true } => {
                    live.push(dmr.allocate_scoped(size, &streams[stream]).unwrap());
                }
                PoolOp::Free { index } if !live.is_empty() => drop(live.swap_remove(index % live.len())),
                PoolOp::Free { .. } => {}
                PoolOp::ResetPeaks => {
                    pool.reset_peak_usage().unwrap();
                    (used_high, reserved_high) = (0, 0);
                }
            }
            for stream in &streams {
                stream.synchronize().unwrap();
            }
            let a = pool.attributes().unwrap();
            let live_bytes: u64 = live.iter().map(|b| b.size() as u64).sum();
            if cuda_sim::testing::on_simulator() {
                prop_assert_eq!(a.used_mem_current, live_bytes);
            } else {
                prop_assert!(a.used_mem_current >= live_bytes);
            }
            prop_assert!(a.used_mem_high >= used_high && a.used_mem_high >= a.used_mem_current);
            prop_assert!(a.reserved_mem_high >= reserved_high && a.reserved_mem_high >= a.reserved_mem_current);
            prop_assert!(a.reserved_mem_current >= a.used_mem_current);
            (used_high, reserved_high) = (a.used_mem_high, a.reserved_mem_high);
        }
    }
}

#[derive(Debug, Clone)]
enum DataOp {
    Fill { buffer: usize, pattern: FillPattern, stream: usize },
    Copy { from: usize, to: usize, stream: usize },
}

const SIZE: usize = 64;

fn data_op() -> impl Strategy<Value = DataOp> {
    let pattern = prop_oneof![
        any::<u8>().prop_map(FillPattern::U8),
        any::<u16>().prop_map(FillPattern::U16),
        any::<u32>().prop_map(FillPattern::U32),
    ];
    prop_oneof![
        (0usize..3, pattern, 0usize..2).prop_map(|(buffer, pattern, stream)| DataOp::Fill { buffer, pattern, stream }),
        (0usize..3, 0usize..3, 0usize..2).prop_map(|(from, to, stream)| DataOp::Copy { from, to, stream }),
    ]
}

fn pattern_bytes(pattern: FillPattern) -> Vec<u8> {
    let unit = match pattern {
        FillPattern::U8(v) => vec![v],
        FillPattern::U16(v) => v.to_ne_bytes().to_vec(),
        FillPattern::U32(v) => v.to_ne_bytes().to_vec(),
    };
    unit.repeat(SIZE / unit.len())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Random fills and copies on two streams, each ordered after the previous one by an event,
    /// leave the device buffers equal to a host model.
    #[test]
    fn fills_and_copies_match_a_host_model(ops in prop::collection::vec(data_op(), 1..30)) {
        let device = common::device();
        let streams = [common::stream(device), common::stream(device)];
        let dmr = DeviceMemoryResource::current(device).unwrap();
        let mut buffers: Vec<Buffer> = (0..3).map(|_| dmr.allocate(SIZE, &streams[0]).unwrap()).collect();
        let mut model = vec![vec![0u8; SIZE]; 3];
        for b in &mut buffers {
            b.fill(FillPattern::U8(0), &streams[0]).unwrap();
        }
        let mut previous: Event = streams[0].record_event().unwrap();
        for op in ops {
            let stream = match op { DataOp::Fill { stream, .. } | DataOp::Copy { stream, .. } => &streams[stream] };
            stream.wait(&previous).unwrap();
            match op {
                DataOp::Fill { buffer, pattern, .. } => {
                    buffers[buffer].fill(pattern, stream).unwrap();
                    model[buffer] = pattern_bytes(pattern);
                }
                DataOp::Copy { from, to, .. } if from != to => {
                    let (src, dst) = if from < to {
                        let (a, b) = buffers.split_at_mut(to);
                        (&a[from], &mut b[0])
                    } else {
                        let (a, b) = buffers.split_at_mut(from);
                        (&b[0], &mut a[to])
                    };
                    dst.copy_from(src, stream).unwrap();
                    model[to] = model[from].clone();
                }
                DataOp::Copy { .. } => {}
            }
            previous = Event::new(device, EventOptions::default()).unwrap();
            previous.record(stream).unwrap();
        }
        let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
        for (buffer, expected) in buffers.iter().zip(&model) {
            streams[0].wait(&previous).unwrap();
            let mut out = host.allocate(SIZE, &streams[0]).unwrap();
            out.copy_from(buffer, &streams[0]).unwrap();
            prop_assert_eq!(out.host_slice().unwrap(), expected.as_slice());
        }
    }
}

#[derive(Debug, Clone)]
enum PeerOp {
    Set(BTreeSet<usize>),
    Add(usize),
    Remove(usize),
}

fn peer_op() -> impl Strategy<Value = PeerOp> {
    prop_oneof![
        prop::collection::btree_set(0usize..3, 0..3).prop_map(PeerOp::Set),
        (0usize..3).prop_map(PeerOp::Add),
        (0usize..3).prop_map(PeerOp::Remove),
    ]
}

/// Random peer-set operations leave the driver's state equal to a model set.
#[test]
fn peer_sets_match_a_model() {
    cuda_sim::testing::in_simulated_machine("peer_sets_match_a_model", &[("CUDA_SIM_DEVICES", "3")], || {
        let Some(devices) = common::devices(3) else {
            return;
        };
        let mut runner =
            proptest::test_runner::TestRunner::new(ProptestConfig { cases: 24, ..ProptestConfig::default() });
        runner
            .run(&prop::collection::vec(peer_op(), 1..20), |ops| {
                let dmr = DeviceMemoryResource::new(devices[0], Default::default()).unwrap();
                let mut model: BTreeSet<usize> = BTreeSet::new();
                for op in ops {
                    match op {
                        PeerOp::Set(set) => {
                            dmr.pool().set_peer_accessible_by(set.iter().map(|&i| devices[i])).unwrap();
                            model = set;
                        }
                        PeerOp::Add(i) => {
                            dmr.pool().add_peer(devices[i]).unwrap();
                            model.insert(i);
                        }
                        PeerOp::Remove(i) => {
                            dmr.pool().remove_peer(devices[i]).unwrap();
                            model.remove(&i);
                        }
                    }
                    model.remove(&0);
                    let actual: BTreeSet<usize> =
                        dmr.pool().peer_accessible_by().unwrap().iter().map(|d| d.ordinal()).collect();
                    prop_assert_eq!(&actual, &model);
                }
                Ok(())
            })
            .unwrap();
    });
}
