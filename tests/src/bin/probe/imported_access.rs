//! Question 3: what a freshly imported pool's access table says. `cuda-mem-core` derives an
//! imported pool's kind and device from `cuMemPoolGetAccess` (`pool/sharing.rs`:
//! `locate_imported`): read-write access from the host makes it a pinned pool, whatever devices
//! it was granted; otherwise exactly one device with read-write access makes it that device's
//! pool (a failed host query reads as "not the host's"). Whether an import inherits the grants
//! its exporter made is not documented either. The parent creates shareable pools, a device
//! pool and a pinned pool on device 0's host NUMA node, each as it is created and with the
//! grants the library makes (device 1 as a peer of the device pool; device 0 for the pinned
//! pool, as `PinnedMemoryResource` grants every device), reads their tables, and a child
//! imports each and reads its own.

use std::ffi::c_int;
use std::os::fd::AsFd;

use cuda_mem_sys::types::{CUdevice_attribute, CUmemAccess_flags, CUmemLocation, CUmemoryPool};

use crate::child::{self, Input};
use crate::owned::OwnedPool;
use crate::raw::{
    can_access_peer, code, destroy_pool, device_attribute, device_count, device_location, host_location,
    host_numa_location, import_pool, pool_access, pool_props, set_pool_access,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "imported-pool-access",
    question: "A freshly imported device pool, and an imported pinned host pool, each as created and with the \
               exporter's grants: which devices, and does the host location, have access (cuMemPoolGetAccess)? \
               cuda-mem-core derives an imported pool's kind and device from this.",
    run,
    child: Some(child_side),
};

/// What memory a case's pool holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Memory {
    /// Device 0's memory.
    Device,
    /// Pinned host memory on device 0's host NUMA node.
    Pinned,
}

/// One pool to import: its tag, its memory, and the device the exporter grants read-write
/// access before exporting, if any.
struct Case {
    tag: &'static str,
    memory: Memory,
    grant: Option<c_int>,
}

const CASES: [Case; 4] = [
    Case { tag: "device", memory: Memory::Device, grant: None },
    Case { tag: "device_with_a_peer", memory: Memory::Device, grant: Some(1) },
    Case { tag: "pinned", memory: Memory::Pinned, grant: None },
    Case { tag: "pinned_granted_to_device_0", memory: Memory::Pinned, grant: Some(0) },
];

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
    let mut answers = Vec::new();
    for case in &CASES {
        let answer = match applicable(case, setup, numa) {
            Ok(location) => ask_about(case, location, setup, details, numa),
            Err(why) => format!("not asked ({why})"),
        };
        answers.push(format!("{}: {answer}", case.tag));
    }
    Ok(answers.join("; "))
}

/// Where the case's pool goes, or why it cannot be asked here.
fn applicable(case: &Case, setup: &Setup<'_>, numa: Option<c_int>) -> Result<CUmemLocation, String> {
    if let Some(device) = case.grant {
        if device >= setup.devices {
            return Err(format!("needs device {device}"));
        }
        if case.memory == Memory::Device && !can_access_peer(device, 0).unwrap_or(false) {
            return Err(format!("device {device} cannot access device 0"));
        }
    }
    match (case.memory, numa) {
        (Memory::Device, _) => Ok(device_location(0)),
        (Memory::Pinned, Some(node)) => Ok(host_numa_location(node)),
        (Memory::Pinned, None) => Err("device 0 reports no host NUMA node".to_string()),
    }
}

/// Creates a shareable pool at `location` with the case's grant, records the exporter's table,
/// has a child import it and record its own, and sums up the importer's table.
fn ask_about(
    case: &Case,
    location: CUmemLocation,
    setup: &Setup<'_>,
    details: &mut Details,
    numa: Option<c_int>,
) -> String {
    let tag = case.tag;
    let pool = match OwnedPool::new(&pool_props(location, true, 0)) {
        Ok(pool) => pool,
        Err(e) => {
            let error = crate::raw::error_code(e);
            details.put(format!("{tag}.create"), &error);
            return format!("not created ({error})");
        }
    };
    if let Some(device) = case.grant {
        let read_write = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        let granted = set_pool_access(pool.raw(), device_location(device), read_write);
        details.put(format!("{tag}.grant_device_{device}"), code(&granted));
        if let Err(e) = granted {
            return format!("the grant failed ({})", crate::raw::error_code(e));
        }
    }
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
    let payload = numa.unwrap_or(-1).to_string();
    let importer = match child::ask(QUESTION.name, payload.as_bytes(), &[fd.as_fd()]) {
        Ok(importer) => importer,
        Err(e) => return format!("the child could not be asked ({e})"),
    };
    let answer = table_summary(&importer, setup.devices, case.memory);
    details.absorb(&format!("{tag}.importer"), importer);
    if let Some(device) = case.grant {
        // Revoked before the pool is destroyed, so that no access passes to a later pool
        // (nvbug 5698116).
        let none = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        details.put(
            format!("{tag}.revoke_device_{device}"),
            code(&set_pool_access(pool.raw(), device_location(device), none)),
        );
    }
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

/// The importer's table in words, and how `cuda-mem-core` reads it (as `locate_imported`
/// does).
fn table_summary(importer: &Details, devices: c_int, memory: Memory) -> String {
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
        _ if host == "READWRITE" => "a pinned pool".to_string(),
        [device] => format!("a device pool of device {device}"),
        _ => "neither (UnsupportedImportedPool)".to_string(),
    };
    let expected = match memory {
        Memory::Device => "a device pool of device 0",
        Memory::Pinned => "a pinned pool",
    };
    let verdict = if read == expected { "right" } else { "WRONG" };
    let devices = if read_write.is_empty() { "none".to_string() } else { read_write.join(",") };
    format!("read-write devices {devices}, host {host}; cuda-mem-core reads {read} ({verdict})")
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
