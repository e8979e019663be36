//! No leaks across processes: 1,000 export/import/drop cycles leave both processes with the
//! file descriptors they started with, every pool with nothing in use, and no import mapped.
//!
//! One test only, in a binary of its own: it counts the descriptors of the whole process, which
//! tests running beside it would disturb.

#[macro_use]
mod common;

use std::sync::Arc;

use common::*;
use cuda_mem_core::{FillPattern, MemoryResource, MemoryResourceExt};
use cuda_mem_ipc::Received;
use cuda_sim::testing::open_fds;

const WARM_UP: usize = 8;
const CYCLES: usize = 1000;

fn size(i: usize) -> usize {
    256 + (i % 7) * 512
}

#[test]
fn no_leaks_over_1000_export_import_drop_cycles() {
    if role().is_some() {
        return child();
    }
    let (device, stream) = setup();
    let pools: [Arc<dyn MemoryResource>; 2] = [device_pool(device), pinned_pool(device)];
    for pool in &pools {
        // Exported once, here: the pool keeps its descriptor.
        cuda_mem_ipc::allocation_handle(pool.as_ref()).unwrap();
    }
    let initial = open_fds();
    let (child, channel) = spawn_role(test_name!(), "importer", &[]);

    let cycle = &|i: usize| {
        let mut buffer = pools[i % 2].allocate(size(i), &stream).unwrap();
        buffer.fill(FillPattern::U8(i as u8), &stream).unwrap();
        stream.synchronize().unwrap();
        channel.send_buffers(&[&buffer]).unwrap();
        let ack = decode_u64s(&expect_data(&channel, &stream));
        assert_eq!(ack, [i as u64, checksum(&vec![i as u8; size(i)])], "cycle {i}");
        drop(buffer);
    };
    // Everything opened once (the pools' exported descriptors, the driver's own files) is
    // opened here.
    (0..WARM_UP).for_each(cycle);
    stream.synchronize().unwrap();
    channel.send_data(b"start").unwrap();
    let before = open_fds();
    let started = std::time::Instant::now();
    (WARM_UP..WARM_UP + CYCLES).for_each(cycle);
    stream.synchronize().unwrap();
    let elapsed = started.elapsed();
    let after = open_fds();
    channel.send_data(b"end").unwrap();

    let report = decode_u64s(&expect_data(&channel, &stream));
    let [child_before, child_after, last_holders, child_used, child_initial, child_final] = report[..] else {
        panic!("a report of six numbers, got {report:?}")
    };
    eprintln!(
        "{CYCLES} cycles in {elapsed:?}; descriptors: parent {before}→{after}, child {child_before}→{child_after}"
    );
    assert_eq!(after, before, "the parent's open descriptors after {CYCLES} cycles");
    assert_eq!(child_after, child_before, "the child's open descriptors after {CYCLES} cycles");
    assert_eq!(last_holders, 0, "the child's last import is unmapped");
    assert_eq!(child_used, 0, "the child's imported pools have nothing in use");
    if cuda_sim::testing::simulator_only("a driver may keep files it opened for the first import") {
        assert_eq!(child_final, child_initial, "the child's descriptors once its mapped resources are gone");
    }
    for (k, pool) in pools.iter().enumerate() {
        let used = pool.memory_pool().unwrap().attributes().unwrap().used_mem_current;
        assert_eq!(used, 0, "pool {k} has nothing in use");
    }
    drop(channel);
    child.wait_success();
    assert_eq!(open_fds(), initial, "the parent's descriptors once the child and its channel are gone");
    let errors = cuda_mem_core::take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

fn child() {
    let (_device, stream) = setup();
    let channel = parent_channel();
    let initial = open_fds();
    let mut resources = Vec::new();
    let mut count = 0u64;
    let mut last = None;
    let mut before = None;
    loop {
        match channel.recv(&stream).unwrap() {
            Received::Resource(resource) => resources.push(resource),
            Received::Buffers(buffers) => {
                assert_eq!(buffers.len(), 1);
                let bytes = read_bytes(&buffers[0], &stream);
                assert!(bytes.iter().all(|&b| b == count as u8), "cycle {count}: the parent's fill");
                let ptr = buffers[0].ptr();
                assert_eq!(cuda_mem_core::import_holders(ptr), 1);
                drop(buffers);
                assert_eq!(cuda_mem_core::import_holders(ptr), 0);
                last = Some(ptr);
                channel.send_data(&encode_u64s(&[count, checksum(&bytes)])).unwrap();
                count += 1;
            }
            Received::Data(text) if text == b"start" => before = Some(open_fds()),
            Received::Data(text) if text == b"end" => break,
            Received::Data(text) => panic!("unexpected {text:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    stream.synchronize().unwrap();
    let after = open_fds();
    assert_eq!(count as usize, WARM_UP + CYCLES);
    assert_eq!(resources.len(), 2, "each pool arrived once");
    let holders = cuda_mem_core::import_holders(last.expect("a last import")) as u64;
    let used: u64 = if cuda_sim::testing::simulator_only("imported pools' usage counters") {
        resources.iter().map(|r| r.imported_pool().attributes().unwrap().used_mem_current).sum()
    } else {
        0
    };
    drop(resources);
    channel.release_resources();
    let finished = open_fds();
    let errors = cuda_mem_core::take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
    let before = before.expect("a start") as u64;
    channel.send_data(&encode_u64s(&[before, after as u64, holders, used, initial as u64, finished as u64])).unwrap();
}
