//! Step 2, the devices: what each is and supports, and what the later steps share (device 0,
//! its stream and staging memory, and whether pools, peers and VMM sharing are available).

use std::path::PathBuf;

use cuda_mem_core::{Device, DeviceProperties, HandleType};

use crate::Error;
use crate::driver::{ChosenDriver, SIM_DEVICES_ENV};
use crate::gpu::Gpu;
use crate::narration::{format_bytes, yes_no};

/// What the steps share: the driver, device 0 and its stream, and what the devices support.
pub(crate) struct Demo {
    /// The driver library (the child loads the same).
    pub(crate) driver_path: PathBuf,
    /// Whether the driver is the `cuda-sim` simulator.
    pub(crate) simulator: bool,
    /// Device 0, its stream and staging memory.
    pub(crate) gpu: Gpu,
    /// Every device the driver reports.
    pub(crate) devices: Vec<Device>,
    /// Device 0's properties.
    pub(crate) properties: DeviceProperties,
    /// Whether device 0's pools can be shared by file descriptor.
    pub(crate) pool_ipc: bool,
    /// Whether device 1 (if there is one) can access device 0's memory.
    pub(crate) peer_reachable: bool,
}

impl Demo {
    /// Device 1, the peer of the peer-access step, or why that step cannot run.
    pub(crate) fn peer(&self) -> Result<Device, String> {
        let Some(&peer) = self.devices.get(1) else {
            let hint = if self.simulator { format!(" (run with {SIM_DEVICES_ENV}=2 or more)") } else { String::new() };
            return Err(format!("it needs two devices and there is one{hint}"));
        };
        if self.peer_reachable {
            Ok(peer)
        } else {
            Err("device 1 cannot access device 0's memory (cuDeviceCanAccessPeer)".to_string())
        }
    }
}

/// Initializes the driver and describes every device.
pub(crate) fn open_devices(chosen: ChosenDriver) -> Result<Demo, Error> {
    let driver = cuda_mem_core::driver()?;
    let version = driver.version()?;
    println!("  driver version: CUDA {}.{} ({version})", version / 1000, (version % 1000) / 10);
    let devices = Device::all()?;
    if devices.is_empty() {
        return Err("the driver reports no devices".into());
    }
    for device in &devices {
        let p = device.properties()?;
        println!(
            "  {device}: {}, {}, compute capability {}.{}",
            p.name,
            format_bytes(p.total_memory as u64),
            p.compute_capability.0,
            p.compute_capability.1
        );
        println!(
            "    memory pools: {} (shareable by fd: {}); virtual memory management: {} (shareable by fd: {})",
            yes_no(p.memory_pools_supported),
            yes_no(p.mempool_supported_handle_types.contains(HandleType::PosixFd)),
            yes_no(p.virtual_memory_management_supported),
            yes_no(p.posix_fd_handles_supported)
        );
    }
    let properties = devices[0].properties()?;
    if !properties.memory_pools_supported {
        return Err("device 0 does not support memory pools, which every step but VMM uses".into());
    }
    let peer_reachable = match devices.get(1) {
        Some(peer) => peer.can_access_peer(devices[0])?,
        None => false,
    };
    if devices.len() > 1 {
        println!("  device 1 can access device 0's memory: {}", yes_no(peer_reachable));
    }
    let gpu = Gpu::open()?;
    println!("  pinned host memory for reading results back: {}", gpu.staging_kind);
    Ok(Demo {
        driver_path: chosen.path,
        simulator: chosen.simulator,
        gpu,
        devices,
        pool_ipc: properties.mempool_supported_handle_types.contains(HandleType::PosixFd),
        properties,
        peer_reachable,
    })
}
