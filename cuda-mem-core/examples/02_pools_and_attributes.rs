//! Example 2: a pool's options and attributes, its usage, trimming, and adaptors that count and
//! limit what goes through them.
//!
//! ```sh
//! cargo run -p cuda-mem-core --example 02_pools_and_attributes                 # on the simulator
//! CUDA_MEM_DRIVER=libcuda.so.1 cargo run -p cuda-mem-core --example 02_pools_and_attributes   # on a GPU
//! ```

use std::error::Error;

use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, LimitingAdaptor, PoolResource, StatisticsAdaptor,
    Stream, StreamOptions,
};

const MIB: usize = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    let device = Device::new(0)?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;

    // A pool capped at 64 MiB that keeps up to 16 MiB cached when it is idle.
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().max_size(64 * MIB))?;
    pool.set_release_threshold(16 * MIB as u64)?;
    let buffers = (0..8).map(|_| pool.allocate(4 * MIB, &stream)).collect::<Result<Vec<_>, _>>()?;
    let attributes = pool.attributes()?;
    println!(
        "8 buffers of 4 MiB: {} MiB used, {} MiB reserved, release threshold {} MiB",
        attributes.used_mem_current >> 20,
        attributes.reserved_mem_current >> 20,
        attributes.release_threshold >> 20
    );

    // Freed memory goes back to the pool, not the device; trimming returns what is cached.
    drop(buffers);
    stream.synchronize()?;
    pool.trim_to(0)?;
    let usage = pool.usage()?;
    println!(
        "after the frees and a trim: {} MiB used, {} MiB reserved (high-water mark {} MiB)",
        usage.used_bytes >> 20,
        usage.reserved_bytes >> 20,
        usage.reserved_bytes_high >> 20
    );

    // Adaptors stack over any resource: counters under a budget, over the same pool.
    let counted = StatisticsAdaptor::new(pool.clone());
    let limited = LimitingAdaptor::new(counted.clone(), 8 * MIB);
    let held = limited.allocate(6 * MIB, &stream)?;
    match limited.allocate(4 * MIB, &stream) {
        Ok(_) => return Err("the budget let 10 MiB through".into()),
        Err(refused) => println!("over the 8 MiB budget: {refused}"),
    }
    let statistics = counted.statistics();
    println!("counted: {} MiB in {} allocation(s) now", statistics.current_bytes >> 20, statistics.current_count);
    drop(held);
    Ok(())
}
