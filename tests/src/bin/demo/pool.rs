//! Step 3, a device pool: allocate, fill on the device, read back through pinned memory and
//! check every word, free, with the pool's attributes at each stage.

use cuda_mem_core::{DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern};

use crate::Error;
use crate::devices::Demo;
use crate::errors::Context;
use crate::narration::{format_bytes, print_attributes};

/// Bytes of the device-pool step's buffer, and the word it is filled with.
const POOL_BYTES: usize = 32 << 20;
const POOL_WORD: u32 = 0xC0FF_EE11;

/// A pool of its own on device 0: allocate, fill on the device, read back through pinned
/// memory, free, with the pool's attributes at each stage.
pub(crate) fn device_pool(demo: &Demo) -> Result<(), Error> {
    let gpu = &demo.gpu;
    let pool = DeviceMemoryResource::new(gpu.device, DeviceMemoryResourceOptions::default())?;
    println!(
        "  DeviceMemoryResource::new({}): a pool of its own, release threshold {} (memory beyond it goes back \
         at each synchronization)",
        gpu.device,
        format_bytes(pool.pool().release_threshold()?)
    );
    print_attributes("new:", pool.pool())?;
    let mut buffer = pool.allocate(POOL_BYTES, &gpu.stream).context("allocating 32 MiB from the pool")?;
    buffer.fill(FillPattern::U32(POOL_WORD), &gpu.stream)?;
    gpu.expect_words(&buffer, POOL_BYTES, POOL_WORD, "the pool buffer")?;
    println!(
        "  allocated {} at {:#x}, filled it with {POOL_WORD:#010x} on the device, copied it to pinned memory: \
         every word checked",
        format_bytes(POOL_BYTES as u64),
        buffer.ptr()
    );
    print_attributes("with the buffer:", pool.pool())?;
    buffer.close(None)?;
    gpu.stream.synchronize()?;
    print_attributes("freed, synchronized:", pool.pool())?;
    Ok(())
}
