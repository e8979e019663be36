//! Example 6: a model's memory goes to sleep and wakes up at the same addresses.
//!
//! An inference server that shares its GPU between phases (vLLM's sleep mode) keeps two kinds
//! of memory: weights, which must come back as they were, and a KV cache, which may be thrown
//! away. Each is an [`ElasticGroup`]: sleeping offloads the weights to pinned host memory and
//! discards the cache, giving all their physical memory back to the device; waking maps new
//! memory at the same addresses (kernels' arguments and captured graphs stay valid), copies
//! the weights back and zeroes the cache. The example prints the device's free memory and the
//! buffers' addresses at each step.
//!
//! ```sh
//! cargo run -p cuda-mem-vmm --example 06_sleep_and_wake                 # on the simulator
//! CUDA_MEM_DRIVER=libcuda.so.1 cargo run -p cuda-mem-vmm --example 06_sleep_and_wake   # on a GPU
//! ```

use std::error::Error;

use cuda_mem_core::{Device, Stream, StreamOptions};
use cuda_mem_vmm::{Discarded, ElasticBuffer, ElasticGroup, Release, VirtualMemoryResource};

const MIB: usize = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    let device = Device::new(0)?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let resource = VirtualMemoryResource::new(device, Default::default())?;
    let weights = ElasticGroup::new(&resource, "weights");
    let kv_cache = ElasticGroup::new(&resource, "kv-cache");

    let mut layers: Vec<ElasticBuffer> =
        (0..4).map(|_| weights.allocate(16 * MIB, &stream)).collect::<Result<_, _>>()?;
    for (index, layer) in layers.iter_mut().enumerate() {
        let value = index as u32 + 1;
        layer.access_mut()?.view_mut::<u32>()?.fill(value, &stream)?;
    }
    let cache = kv_cache.allocate(256 * MIB, &stream)?;
    let addresses: Vec<_> = layers.iter().map(ElasticBuffer::ptr).chain([cache.ptr()]).collect();
    stream.synchronize()?;
    let free = |what: &str| -> Result<(), Box<dyn Error>> {
        println!("{what:<28} free device memory {:>8} MiB", device.memory_info()?.free / MIB);
        Ok(())
    };
    free("awake:")?;

    let slept = weights.sleep(Release::Offload, &stream)?;
    let dropped = kv_cache.sleep(Release::Discard, &stream)?;
    println!(
        "asleep: weights offloaded ({} MiB to pinned host memory), cache discarded ({} MiB)",
        slept.offloaded_bytes / MIB,
        dropped.released_bytes / MIB
    );
    free("asleep:")?;
    assert!(layers[0].access().is_err(), "no access while asleep");

    weights.wake(Discarded::Unspecified, &stream)?;
    kv_cache.wake(Discarded::Zeroed, &stream)?;
    free("awake again:")?;
    let now: Vec<_> = layers.iter().map(ElasticBuffer::ptr).chain([cache.ptr()]).collect();
    for (before, after) in addresses.iter().zip(&now) {
        println!("  {before:#x} -> {after:#x}{}", if before == after { "  (the same)" } else { "  MOVED" });
    }
    if now != addresses {
        return Err("an address changed".into());
    }
    for (index, layer) in layers.iter().enumerate() {
        let back = layer.access()?.view::<u32>()?.to_vec(&stream)?;
        if back.iter().any(|&x| x != index as u32 + 1) {
            return Err(format!("layer {index} did not come back whole").into());
        }
    }
    let zeros = cache.access()?.view::<u8>()?.slice(..4096)?.to_vec(&stream)?;
    if zeros.iter().any(|&b| b != 0) {
        return Err("the cache was not zeroed".into());
    }
    println!("every weight came back, the cache is zeroed, every address is the same");
    Ok(())
}
