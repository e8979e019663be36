//! Example 1: allocate device memory, copy Rust data in and out, and look at it through typed
//! views.
//!
//! ```sh
//! cargo run -p cuda-mem-core --example 01_allocate_and_copy                 # on the simulator
//! CUDA_MEM_DRIVER=libcuda.so.1 cargo run -p cuda-mem-core --example 01_allocate_and_copy   # on a GPU
//! ```

use std::error::Error;

use cuda_mem_core::prelude::*;

fn main() -> Result<(), Box<dyn Error>> {
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    let device = Device::new(0)?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    println!("{}: {} MiB free", device.name()?, device.memory_info()?.free >> 20);

    // A pool of its own. Its buffers free themselves, on their stream, when dropped.
    let pool = DeviceMemoryResource::new(device, Default::default())?;
    let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let mut buffer = pool.allocate_from_slice(&data, &stream)?; // cudarc's clone_htod
    let zeros = pool.allocate_zeroed::<f32>(data.len(), &stream)?; // cudarc's alloc_zeros
    assert_eq!(zeros.to_vec::<f32>(&stream)?[..2], [0.0, 0.0]);

    // Typed views check the size and the alignment; slices check their range.
    let mut view = buffer.view_mut::<f32>()?;
    view.slice_mut(512..)?.fill(-1.0, &stream)?;
    let head = view.slice(..4)?.to_vec(&stream)?;
    println!("the first elements: {head:?}");

    // A copy into a new buffer of the same pool, then into pinned host memory.
    let copy = buffer.copy_to_new(&stream)?;
    let mut host = PinnedMemoryResource::current()?.allocate(copy.size(), &stream)?;
    host.copy_from(&copy, &stream)?;
    let floats: &[f32] = cuda_mem_core::bytemuck::cast_slice(host.host_slice()?);
    assert_eq!(floats[511..513], [511.0, -1.0]);
    println!("read back on the host: element 511 is {}, element 512 is {}", floats[511], floats[512]);

    // Scratch memory for one scope: it borrows the pool and the stream, with no reference count.
    let mut scratch = pool.allocate_scoped(4096, &stream)?;
    scratch.fill(FillPattern::U32(0xC0FF_EE00), &stream)?;
    let usage = pool.usage()?;
    println!("the pool holds {} allocations, {} bytes in use", usage.live_allocations, usage.used_bytes);
    Ok(())
}
