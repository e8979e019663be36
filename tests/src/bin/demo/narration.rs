//! How the demo says things: byte counts, durations, sets of devices, yes and no, and a pool's
//! usage.

use std::collections::BTreeSet;
use std::time::Duration;

use cuda_mem_core::{Device, MemoryPool};

use crate::Error;

/// Prints a pool's usage.
pub(crate) fn print_attributes(label: &str, pool: &MemoryPool) -> Result<(), Error> {
    let a = pool.attributes()?;
    println!(
        "    {label:<21} used {:>9} (high {:>9})   reserved {:>9} (high {:>9})",
        format_bytes(a.used_mem_current),
        format_bytes(a.used_mem_high),
        format_bytes(a.reserved_mem_current),
        format_bytes(a.reserved_mem_high)
    );
    Ok(())
}

/// A set of devices, as `{device 0, device 1}`.
pub(crate) fn format_devices(devices: &BTreeSet<Device>) -> String {
    let names: Vec<String> = devices.iter().map(Device::to_string).collect();
    format!("{{{}}}", names.join(", "))
}

/// `yes` or `no`.
pub(crate) fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// Formats a byte count in the largest binary unit that keeps it at least 1.
pub(crate) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if bytes == u64::MAX {
        "unlimited".to_string()
    } else if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Formats a duration with a unit suited to its size.
pub(crate) fn format_duration(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 1e6 {
        format!("{:.1} ms", micros / 1e3)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}
