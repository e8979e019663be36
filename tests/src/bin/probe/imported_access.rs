//! Question 3: what a freshly imported pool's access table says. `cuda-mem-core` derives an
//! imported pool's kind and device from `cuMemPoolGetAccess` (`pool/sharing.rs`:
//! `locate_imported`): exactly one device with read-write access makes it that device's pool;
//! none, and read-write access from the host, a pinned host pool. The parent creates a
//! shareable device pool and a shareable pinned pool (on device 0's host NUMA node), reads
//! their tables, and a child imports each and reads its own.

use std::ffi::c_int;
use std::os::fd::AsFd;

use cuda_sys::types::{CUdevice_attribute, CUmemLocation, CUmemoryPool};

use crate::child::{self, Input};
use crate::owned::OwnedPool;
use crate::raw::{
    code, destroy_pool, device_attribute, device_count, device_location, host_location, host_numa_location,
    import_pool, pool_access, pool_props,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "imported-pool-access",
    question: "A freshly imported device pool, and an imported pinned host pool: which devices, and does the host \
               location, have access (cuMemPoolGetAccess)? cuda-mem-core derives an imported pool's kind and device \
               from this.",
    run,
    child: Some(child_side),
};

/// The two pools, by the tag the child is given.
const DEVICE: &str = "device";
const PINNED: &str = "pinned";

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let numa = device_attribute(0, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
    details.put(
        "device_0_host_numa_id",
        match &numa {
            Ok(node) => node.to_string(),
            Err(_) => code(&numa),
        },
    );
    let numa = numa.ok().filter(|&n| n >= 0);
    let device = ask_about(setup, details, DEVICE, device_location(0), numa);
    let pinned = match numa {
        Some(node) => ask_about(setup, details, PINNED, host_numa_location(node), Some(node)),
        None => "not asked: device 0 reports no host NUMA node".to_string(),
    };
    Ok(format!("imported device pool: {device}; imported pinned pool: {pinned}"))
}

/// Creates a shareable pool at `location`, records the exporter's table, has a child import it
/// and record its own, and sums up the importer's table.
fn ask_about(
    setup: &Setup<'_>,
    details: &mut Details,
    tag: &str,
    location: CUmemLocation,
    numa: Option<c_int>,
) -> String {
    let pool = match OwnedPool::new(&pool_props(location, true, 0)) {
        Ok(pool) => pool,
        Err(e) => {
            let error = crate::raw::error_code(e);
            details.put(format!("{tag}.create"), &error);
            return format!("not created ({error})");
        }
    };
    let mut exporter = Details::default();
    access_table(pool.raw(), setup.devices, numa, &mut exporter);
    details.absorb(&format!("{tag}.exporter"), exporter);
    let fd = match pool.export() {
        Ok(fd) => fd,
        Err(e) => {
            let error = crate::raw::error_code(e);
            details.put(format!("{tag}.export"), &error);
            return format!("not exported ({error})");
        }
    };
    let payload = format!("{}", numa.unwrap_or(-1));
    let importer = match child::ask(QUESTION.name, payload.as_bytes(), &[fd.as_fd()]) {
        Ok(importer) => importer,
        Err(e) => return format!("the child could not be asked ({e})"),
    };
    let answer = table_summary(&importer, setup.devices, tag);
    details.absorb(&format!("{tag}.importer"), importer);
    answer
}

/// Each device's access to `pool`, the host's and the host NUMA node's.
fn access_table(pool: CUmemoryPool, devices: c_int, numa: Option<c_int>, details: &mut Details) {
    for ordinal in 0..devices {
        details.put(format!("device_{ordinal}"), pool_access(pool, device_location(ordinal)));
    }
    details.put("host", pool_access(pool, host_location()));
    if let Some(node) = numa {
        details.put(format!("host_numa_{node}"), pool_access(pool, host_numa_location(node)));
    }
}

/// The importer's table in words, and how `cuda-mem-core` would read it.
fn table_summary(importer: &Details, devices: c_int, tag: &str) -> String {
    match importer.get("import") {
        Some("CUDA_SUCCESS") => {}
        Some(code) => return format!("the import failed ({code})"),
        None => return format!("not imported ({})", importer.get("child").unwrap_or("no word")),
    }
    let read_write: Vec<String> = (0..devices)
        .filter(|i| importer.get(&format!("device_{i}")) == Some("READWRITE"))
        .map(|i| i.to_string())
        .collect();
    let host = importer.get("host").unwrap_or("not asked");
    let read = match read_write.as_slice() {
        [device] => format!("a device pool of device {device}"),
        [] if host == "READWRITE" => "a pinned pool".to_string(),
        _ => "neither (refused: UnsupportedImportedPool)".to_string(),
    };
    let expected = if tag == DEVICE { "a device pool of device 0" } else { "a pinned pool" };
    let verdict = if read == expected { "as cuda-mem-core expects" } else { "NOT as cuda-mem-core expects" };
    let devices = if read_write.is_empty() { "none".to_string() } else { read_write.join(",") };
    format!("read-write devices {devices}, host {host}: cuda-mem-core reads {read} ({verdict})")
}

/// The importing child: imports the pool and records its access table.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let numa: c_int = String::from_utf8_lossy(&input.payload).trim().parse().unwrap_or(-1);
    let pool = import_pool(input.fd(0)?);
    details.put("import", code(&pool));
    let pool = pool?;
    access_table(pool, device_count()?, (numa >= 0).then_some(numa), details);
    details.put("destroy", code(&destroy_pool(pool)));
    Ok(())
}
