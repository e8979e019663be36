//! The memory resources that cases (1c) and (8) compare, each a name and a constructor: adding
//! a resource to both cases is one entry in [`contenders`]. The constructor returns the resource
//! as an `Arc<dyn MemoryResource>` with a probe of what it holds from the driver: for a resource
//! that allocates from a driver pool holding nothing else (any stack of adaptors over one, or a
//! caching resource over a pool of its own), [`pool_reserved`]; otherwise a closure over the
//! concrete resource that reads its own count (a caching resource's reserved bytes from its
//! statistics, say).

use std::sync::Arc;

use cuda_mem_core::{
    CachingOptions, CachingResource, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryResource,
};

use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions};

use crate::Error;

/// How many bytes a resource holds from the driver now (for a pool, its reserved bytes).
pub(crate) type ReservedProbe = Box<dyn Fn() -> Result<u64, Error>>;

/// A resource under test, fresh from its constructor.
pub(crate) struct Subject {
    /// What allocates.
    pub(crate) resource: Arc<dyn MemoryResource>,
    /// What it holds from the driver, read between the replay's calls (for a driver pool, its
    /// reserved bytes; for a caching resource, its segments').
    pub(crate) reserved: ReservedProbe,
}

/// A named way to make a [`Subject`] on a device.
pub(crate) struct Contender {
    /// The name in the tables, the JSON, the CSV headers (so no comma or quote) and the plots'
    /// legends.
    pub(crate) name: &'static str,
    /// A fresh resource on the device (each measurement gets its own).
    pub(crate) make: fn(Device) -> Result<Subject, Error>,
}

/// The resources compared: the driver pool alone, with its default release threshold (0:
/// everything free is released at each synchronization) and with the threshold at `u64::MAX`
/// (nothing is released), the caching resource over a driver pool, and the caching resource
/// with expandable segments over a virtual memory resource (one segment per stream, and one
/// per stream and size class).
pub(crate) fn contenders() -> Vec<Contender> {
    vec![
        Contender { name: "driver pool (release threshold 0)", make: |device| driver_pool(device, 0) },
        Contender { name: "driver pool (release threshold max)", make: |device| driver_pool(device, u64::MAX) },
        Contender { name: "caching over the driver pool", make: caching },
        Contender { name: "caching with expandable segments (VMM)", make: |device| caching_expandable(device, false) },
        Contender {
            name: "caching with expandable segments and a small pool (VMM)",
            make: |device| caching_expandable(device, true),
        },
    ]
}

/// A new device pool resource with release threshold `threshold`, its reserved bytes as the
/// probe.
pub(crate) fn driver_pool(device: Device, threshold: u64) -> Result<Subject, Error> {
    let resource: Arc<dyn MemoryResource> = pool_with_threshold(device, threshold)?;
    Ok(Subject { reserved: pool_reserved(Arc::clone(&resource)), resource })
}

/// A [`CachingResource`] with its default policy over a driver pool that keeps nothing cached
/// itself (release threshold 0), its reserved bytes (its segments) as the probe: its blocks are
/// not the pool's allocations, so it names no pool of its own.
pub(crate) fn caching(device: Device) -> Result<Subject, Error> {
    let cache = CachingResource::new(pool_with_threshold(device, 0)?, CachingOptions::default())?;
    Ok(Subject { reserved: cache_reserved(&cache), resource: cache })
}

/// A [`CachingResource`] with expandable segments over a virtual memory resource (PyTorch's
/// `expandable_segments`), its reserved bytes (what is mapped of its segments) as the probe.
/// By default one expandable segment per stream serves every size; with `small_pool`, small
/// requests get segments of their own, as PyTorch's do.
pub(crate) fn caching_expandable(device: Device, small_pool: bool) -> Result<Subject, Error> {
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
    let options = CachingOptions::default().expandable_small_pool(small_pool);
    let cache = CachingResource::with_expandable_segments(vmm, options)?;
    Ok(Subject { reserved: cache_reserved(&cache), resource: cache })
}

/// A caching resource's reserved bytes, as a probe.
fn cache_reserved(cache: &Arc<CachingResource>) -> ReservedProbe {
    let cache = Arc::clone(cache);
    Box::new(move || Ok(cache.statistics().all.reserved_bytes.current))
}

/// A new device pool on `device` with release threshold `threshold`.
fn pool_with_threshold(device: Device, threshold: u64) -> Result<Arc<DeviceMemoryResource>, Error> {
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    pool.pool().set_release_threshold(threshold)?;
    Ok(pool)
}

/// The reserved bytes of the driver pool `resource` allocates from (through any adaptors), as
/// a probe: for a resource with no driver pool it fails when read.
pub(crate) fn pool_reserved(resource: Arc<dyn MemoryResource>) -> ReservedProbe {
    Box::new(move || {
        let pool = resource.memory_pool().ok_or("the resource allocates from no driver pool")?;
        Ok(pool.usage()?.reserved_bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_distinct_and_fit_in_a_csv_header() {
        let names: Vec<&str> = contenders().iter().map(|c| c.name).collect();
        assert!(names.iter().all(|n| !n.is_empty() && !n.contains([',', '"', '\n'])), "{names:?}");
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }
}
