//! Graphs over the memory crates: memory a captured graph uses whose release could not be
//! captured (a `cuda-mem-vmm` virtual buffer, a `cuMemAlloc` buffer) dropped during the capture
//! is still there when the graph is launched later, after the capture ended and after every
//! safe point that releases deferred memory; it goes with the last executable graph, after its
//! launches. The simulator refuses work on unmapped or freed memory, so a graph that ran over
//! released memory fails here.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuda_mem_core::{
    CaptureMode, DeviceMemoryResource, FillPattern, GraphMemoryResource, InstantiateOptions, SynchronousMemoryResource,
    take_drop_errors,
};
use cuda_mem_vmm::{VirtualMemoryResource, release_deferred};
use cuda_sim::testing::{Gate, in_simulated_machine, live_objects_if_simulated};

/// The simulator's live VMM mappings, where it counts them (`None` on a real driver).
fn mappings() -> Option<u64> {
    live_objects_if_simulated().map(|live| live.mappings)
}

#[test]
fn a_graph_launched_after_its_virtual_buffer_was_dropped_still_finds_it_mapped() {
    in_simulated_machine("a_graph_launched_after_its_virtual_buffer_was_dropped_still_finds_it_mapped", &[], || {
        let (device, stream) = common::setup();
        let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let mut output = pool.allocate(2 << 20, &stream).unwrap();
        output.fill(FillPattern::U8(0), &stream).unwrap();
        let baseline = mappings();
        let mut buffer = vmm.allocate(2 << 20, &stream).unwrap();

        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        buffer.fill(FillPattern::U8(0x5A), &stream).unwrap();
        output.copy_from(buffer.as_buffer(), &stream).unwrap();
        drop(buffer);
        let graph = capture.end().unwrap();
        let exec = graph.instantiate(InstantiateOptions::default()).unwrap();
        drop(graph);
        // Every safe point a virtual memory resource has: the memory stays mapped.
        assert_eq!(release_deferred(), 0);
        drop(vmm.allocate(2 << 20, &stream).unwrap());
        drop(vmm);

        // SAFETY: `output` lives on, unlent; the virtual buffer is the capture's to keep.
        unsafe {
            exec.launch(&stream).expect("the graph runs on mapped memory");
            exec.launch(&stream).expect("the graph runs on mapped memory");
        }
        assert!(output.to_vec::<u8>(&stream).unwrap().iter().all(|&b| b == 0x5A), "the graph ran on mapped memory");
        assert_eq!(mappings(), baseline.map(|n| n + 1), "kept for the executable graph");
        drop(exec);
        assert_eq!(mappings(), baseline, "unmapped with the last graph");
        assert!(take_drop_errors().is_empty());
    });
}

#[test]
fn a_graph_launched_after_its_cumemalloc_buffer_was_dropped_still_finds_it_allocated() {
    in_simulated_machine(
        "a_graph_launched_after_its_cumemalloc_buffer_was_dropped_still_finds_it_allocated",
        &[],
        || {
            let (device, stream) = common::setup();
            let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
            let mut output = pool.allocate(64, &stream).unwrap();
            let mut buffer = SynchronousMemoryResource::new(device).allocate(64, &stream).unwrap();
            let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
            buffer.fill(FillPattern::U32(0xBEEF), &stream).unwrap();
            output.copy_from(&buffer, &stream).unwrap();
            drop(buffer);
            assert!(capture.is_active().unwrap(), "the free did not wait for the capturing stream");
            let exec = capture.end().unwrap().instantiate(InstantiateOptions::default()).unwrap();
            // SAFETY: `output` lives on, unlent; the dropped buffer is the capture's to keep.
            unsafe { exec.launch(&stream) }.unwrap();
            assert_eq!(output.to_vec::<u32>(&stream).unwrap(), vec![0xBEEF; 16]);
            assert!(take_drop_errors().is_empty());
        },
    );
}

#[test]
fn what_a_graph_keeps_goes_only_after_its_launches() {
    in_simulated_machine("what_a_graph_keeps_goes_only_after_its_launches", &[], || {
        let (device, stream) = common::setup();
        let d = cuda_sim::testing::driver().unwrap();
        let launcher = cuda_mem_core::Stream::new(device, Default::default()).unwrap();
        let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
        let mut buffer = vmm.allocate(2 << 20, &stream).unwrap();
        let baseline = mappings();
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        buffer.fill(FillPattern::U8(1), &stream).unwrap();
        drop(buffer);
        let exec = capture.end().unwrap().instantiate(InstantiateOptions::default()).unwrap();
        // The launch waits behind a gate: dropping the graph must wait for it before unmapping.
        let (gate, _open) = Gate::new();
        // SAFETY: a live stream of this test.
        unsafe { gate.hold(d, launcher.handle()) }.unwrap();
        // SAFETY: the graph uses only the virtual buffer, which is the capture's to keep.
        unsafe { exec.launch(&launcher) }.unwrap();
        let opened = Arc::new(AtomicBool::new(false));
        let opener = {
            let opened = Arc::clone(&opened);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                opened.store(true, Ordering::SeqCst);
                gate.open();
            })
        };
        drop(exec);
        assert!(opened.load(Ordering::SeqCst), "the drop waited for the launch");
        assert_eq!(mappings(), baseline.map(|n| n - 1), "then unmapped");
        opener.join().unwrap();
        assert!(take_drop_errors().is_empty());
    });
}

#[test]
fn graph_memory_in_a_graph_launched_twice() {
    let (device, stream) = common::setup();
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut output = pool.allocate(16, &stream).unwrap();
    let graph_memory = GraphMemoryResource::new(device);
    let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
    let mut scratch = graph_memory.allocate(16, &stream).unwrap();
    assert!(scratch.is_device_accessible() && !scratch.is_host_accessible());
    assert!(scratch.host_slice().is_err(), "graph memory is never host-accessible");
    scratch.fill(FillPattern::U32(3), &stream).unwrap();
    output.copy_from(&scratch, &stream).unwrap();
    drop(scratch);
    let exec = capture.end().unwrap().instantiate(InstantiateOptions::default()).unwrap();
    for _ in 0..2 {
        output.fill(FillPattern::U32(0), &stream).unwrap();
        // SAFETY: `output` lives on, unlent; the scratch memory is the graph's own.
        unsafe { exec.launch(&stream) }.unwrap();
        assert_eq!(output.to_vec::<u32>(&stream).unwrap(), [3; 4]);
    }
}
