//! Sharing CUDA memory pools and buffers between processes through POSIX file descriptors.
//!
//! Planned contents (tracked in the project's IPC issue): exporting an IPC-enabled pool as an
//! owned file descriptor with a UUID, importing it in another process as a mapped resource,
//! fixed-size versioned buffer descriptors, a process-wide duplicate-import cache, a registry of
//! mapped resources, and a channel that passes file descriptors over a Unix socket.
//!
//! Today the crate re-exports the core types it builds on:
//!
//! ```no_run
//! use cuda_mem_ipc::core::Device;
//!
//! let device = Device::new(0)?;
//! println!("IPC handle types: {:?}", device.properties()?.mempool_supported_handle_types);
//! # Ok::<(), cuda_mem_ipc::core::Error>(())
//! ```

pub use cuda_mem_core as core;
