//! Step 6, sharing a pool: an IPC-enabled pool and several buffers of it go to the child, which
//! checks each pattern and writes another that this process then reads. The hand-offs are
//! interprocess events, not host synchronization: each side records one after its writes and
//! sends it, and the other side's stream waits for it on the GPU.

use cuda_mem_core::{DeviceMemoryResource, DeviceMemoryResourceOptions, Event, EventOptions, FillPattern};
use cuda_mem_ipc::Received;

use crate::Error;
use crate::child::ChildProcess;
use crate::devices::Demo;
use crate::errors::Context;
use crate::narration::format_bytes;
use crate::protocol::{Patterns, Request};

/// Sizes of the buffers shared with the child.
const SHARED_SIZES: [usize; 4] = [64 << 10, 1 << 20, 4 << 20, 16 << 20];

/// Sends an IPC-enabled pool and several buffers to the child, which checks each pattern and
/// writes another; then checks the child's patterns here.
pub(crate) fn share_pool(demo: &Demo, child: &ChildProcess) -> Result<(), Error> {
    let gpu = &demo.gpu;
    let pool = DeviceMemoryResource::new(gpu.device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    let patterns: Vec<Patterns> = (0..SHARED_SIZES.len()).map(shared_patterns).collect();
    let mut buffers = Vec::with_capacity(SHARED_SIZES.len());
    for (&size, p) in SHARED_SIZES.iter().zip(&patterns) {
        let mut buffer = pool.allocate(size, &gpu.stream).context("allocating from the IPC-enabled pool")?;
        buffer.fill(FillPattern::U32(p.expect), &gpu.stream)?;
        buffers.push(buffer);
    }
    // No host synchronization: the child's stream waits for this event, recorded after the fills.
    let filled = Event::new(gpu.device, EventOptions::default().interprocess())?;
    filled.record(&gpu.stream)?;
    child.request(&Request::Buffers(patterns.clone()))?;
    child.ipc.send_buffers_after(&filled, &buffers.iter().collect::<Vec<_>>()).context("sending the buffers")?;
    let sizes: Vec<String> = SHARED_SIZES.iter().map(|&s| format_bytes(s as u64)).collect();
    println!(
        "  sent an IPC-enabled pool (its file descriptor) and {} buffers of it ({}) with send_buffers_after, \
         behind an interprocess event recorded after the fills (the child's stream waits for it on the GPU)",
        buffers.len(),
        sizes.join(", ")
    );
    wait_for_child(child, gpu)?;
    let reply = child.reply(&gpu.stream)?;
    println!("  the child replies: {reply}");
    for (index, (buffer, p)) in buffers.iter().zip(&patterns).enumerate() {
        gpu.expect_words(buffer, buffer.size(), p.write, &format!("shared buffer {index} after the child wrote it"))?;
    }
    println!("  every buffer here now holds the child's pattern: both processes use the same memory");
    Ok(())
}

/// Receives the event the child sends after its writes: the stream waits for them on the GPU.
pub(crate) fn wait_for_child(child: &ChildProcess, gpu: &crate::gpu::Gpu) -> Result<(), Error> {
    match child.ipc.recv(&gpu.stream).context("receiving the child's event")? {
        Received::Event(_) => {
            println!("  the child's event arrived: this stream now waits for the child's writes on the GPU");
            Ok(())
        }
        _ => Err("something else arrived where the child's event was due".into()),
    }
}

/// The patterns of shared buffer `index`: what this process writes, what the child writes.
fn shared_patterns(index: usize) -> Patterns {
    Patterns { expect: 0x5AFE_0000 + index as u32, write: 0xB0B0_0000 + index as u32 }
}
