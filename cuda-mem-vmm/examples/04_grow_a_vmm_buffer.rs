//! Example 4: a buffer that grows without moving or copying.
//!
//! A virtual memory resource reserves address space ahead of each buffer
//! ([`ReserveAhead`]), so growing maps new physical chunks right after the old ones: the pointer
//! stays, the contents stay, and nothing is copied. The example grows one buffer step by step,
//! writes into each new part, and reads everything back at the end.
//!
//! ```sh
//! cargo run -p cuda-mem-vmm --example 04_grow_a_vmm_buffer                 # on the simulator
//! CUDA_MEM_DRIVER=libcuda.so.1 cargo run -p cuda-mem-vmm --example 04_grow_a_vmm_buffer   # on a GPU
//! ```

use std::error::Error;

use cuda_mem_core::{Device, Stream, StreamOptions};
use cuda_mem_vmm::{ReserveAhead, VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions};

/// How many times the buffer grows, by one granule each time.
const STEPS: usize = 8;

fn main() -> Result<(), Box<dyn Error>> {
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    let device = Device::new(0)?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;

    // Address space for the whole growth, reserved up front: reserving costs no memory.
    let probe = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
    let step = probe.granularity();
    let options = VirtualMemoryResourceOptions::default().reserve_ahead(ReserveAhead::Bytes(STEPS * step));
    let vmm = VirtualMemoryResource::new(device, options)?;
    println!("{}: granularity {} KiB, {} KiB reserved ahead", device.name()?, step >> 10, (STEPS * step) >> 10);

    let mut buffer = vmm.allocate(step, &stream)?;
    write_part(&mut buffer, 0, step, &stream)?;
    let start = buffer.ptr();
    for part in 1..STEPS {
        let mut grown = buffer.grow((part + 1) * step)?;
        println!("step {part}: {} KiB at {:#x} in {} chunks", grown.size() >> 10, grown.ptr(), grown.chunk_count());
        if grown.ptr() != start {
            return Err(format!("the buffer moved from {start:#x} to {:#x}", grown.ptr()).into());
        }
        write_part(&mut grown, part, step, &stream)?;
        buffer = grown; // the smaller buffer is dropped: its memory lives on in the grown one
    }

    // Every part still holds what was written into it, through the one pointer.
    let bytes = buffer.as_buffer().to_vec::<u8>(&stream)?;
    for (part, bytes) in bytes.chunks(step).enumerate() {
        if bytes.iter().any(|&b| usize::from(b) != part) {
            return Err(format!("part {part} lost its contents").into());
        }
    }
    println!("{STEPS} parts of {} KiB each read back through one pointer, never moved, never copied", step >> 10);
    Ok(())
}

/// Writes the byte `part` into part `part` (of `step` bytes) of `buffer`.
fn write_part(buffer: &mut VirtualBuffer, part: usize, step: usize, stream: &Stream) -> Result<(), Box<dyn Error>> {
    let data = vec![part as u8; step];
    buffer.view_mut::<u8>()?.slice_mut(part * step..(part + 1) * step)?.copy_from_slice(&data, stream)?;
    Ok(())
}
