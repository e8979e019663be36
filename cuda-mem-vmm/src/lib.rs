//! A virtual memory resource over the CUDA VMM API (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`): allocations that grow without copying and can be shared by
//! file descriptor.
//!
//! Planned contents (tracked in the project's VMM issue): typed options, allocation as separate
//! owned pieces (physical memory, reservation, mapping), growth in place or by remapping, and
//! export/import of per-chunk file descriptors.
//!
//! Today the crate re-exports the core types it builds on:
//!
//! ```no_run
//! use cuda_mem_vmm::core::Device;
//!
//! let supported = Device::new(0)?.properties()?.virtual_memory_management_supported;
//! println!("VMM supported: {supported}");
//! # Ok::<(), cuda_mem_vmm::core::Error>(())
//! ```

pub use cuda_mem_core as core;
