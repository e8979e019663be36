//! Question 26: an exporter that frees an allocation while another process still maps it.
//! `cuda.h` (`cuMemPoolImportPointer`) says the importers must free first, and not what
//! happens otherwise. The simulator (`cuda_sim::conservative`) poisons the bytes (`0xdb`),
//! keeps the range out of the pool's next allocations until the importers free it, and refuses
//! the freed allocation's export data; a GPU's pool may hand the memory to the exporter's next
//! allocation, which the importer would then read. The parent exports A from a device pool; a
//! child imports it and reads it; while the child holds it, the parent frees A and allocates
//! and fills B of the same size from the same pool; the child then reads its mapping of A
//! again, imports A's old export data again, frees its mapping and makes a pool of its own.

use std::os::fd::AsFd;

use cuda_mem_sys::types::{CUdeviceptr, CUmemPoolPtrExportData};

use crate::child::{self, Input};
use crate::owned::{OwnedPool, OwnedStream, PoolAllocation};
use crate::pointer_import::{export_pointer, free_and_wait, import_pointer};
use crate::raw::{
    code, destroy_pool, device_location, error_code, import_pool, memset_async, pool_props, pool_usage, read_byte,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "exporter-frees-first",
    question: "The exporter frees an allocation (cuMemFreeAsync, synchronized) while another process still maps it, \
               then allocates one of the same size from the pool: does the new one take the freed one's address, \
               what does the importer's mapping then read, does the old export data import again, and what do the \
               importer's free and its next driver call answer?",
    run,
    child: Some(child_side),
};

/// The size of A and B (one 2 MiB granule), and the bytes they are filled with.
const SIZE: usize = 2 << 20;
const A_BYTE: u8 = 0x11;
const B_BYTE: u8 = 0x22;
/// What the simulator overwrites memory freed under an importer with.
const SIMULATOR_POISON: u8 = 0xdb;

/// The child's observation that it holds A: the parent frees A when it arrives.
const HOLDS_A: &str = "holds_a";

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), true, 0))?;
    let mut a = PoolAllocation::new(pool.raw(), SIZE, &stream)?;
    let a_ptr = a.ptr();
    memset_async(a_ptr, A_BYTE, SIZE, stream.raw())?;
    stream.synchronize()?;
    let data = export_pointer(a_ptr)?;
    let fd = pool.export()?;
    let mut b: Option<PoolAllocation<'_>> = None;
    // Runs while the child, which has just imported A, waits for the answer.
    let react = |key: &str, _value: &str| {
        if key != HOLDS_A {
            return None;
        }
        details.put("free_a", code(&a.free().and_then(|()| stream.synchronize())));
        match PoolAllocation::new(pool.raw(), SIZE, &stream) {
            Ok(allocation) => {
                details.put("alloc_b", "CUDA_SUCCESS");
                details.put("b_address", where_b_lies(allocation.ptr(), a_ptr));
                let fill =
                    memset_async(allocation.ptr(), B_BYTE, SIZE, stream.raw()).and_then(|()| stream.synchronize());
                details.put("fill_b", code(&fill));
                b = Some(allocation);
            }
            Err(e) => details.put("alloc_b", error_code(e)),
        }
        details.put("pool_usage_while_the_importer_holds_a", pool_usage(pool.raw()));
        Some(Vec::new())
    };
    let importer = child::ask_and_answer(QUESTION.name, &data.reserved, &[fd.as_fd()], react)?;
    if let Some(mut allocation) = b {
        details.put("b_reads_after", byte_or_error(allocation.ptr()));
        details.put("free_b", code(&allocation.free().and_then(|()| stream.synchronize())));
    }
    // Nothing of A or B should stay in use once both processes have freed them.
    details.put("pool_usage_at_the_end", pool_usage(pool.raw()));
    let answer = summary(details, &importer);
    details.absorb("importer", importer);
    Ok(answer)
}

/// Where B lies against A: at A's address, inside A's range, or elsewhere.
fn where_b_lies(b: CUdeviceptr, a: CUdeviceptr) -> &'static str {
    if b == a {
        "A's address"
    } else if (a..a + SIZE as CUdeviceptr).contains(&b) {
        "inside A's range"
    } else {
        "another address"
    }
}

/// The first byte at `ptr` in hex, or the read's error.
fn byte_or_error(ptr: CUdeviceptr) -> String {
    match read_byte(ptr) {
        Ok(byte) => format!("{byte:#04x}"),
        Err(e) => error_code(e),
    }
}

/// What a read the child recorded (`byte_or_error`) shows.
fn meaning(read: &str) -> String {
    let byte = |b: u8| format!("{b:#04x}");
    if read == byte(A_BYTE) {
        format!("{read} (A's bytes)")
    } else if read == byte(B_BYTE) {
        format!("{read} (B's bytes)")
    } else if read == byte(SIMULATOR_POISON) {
        format!("{read} (the simulator's poison)")
    } else if read.starts_with("0x") {
        format!("{read} (neither A's nor B's bytes)")
    } else {
        format!("an error ({read})")
    }
}

/// The answer, from what the parent and the importing child observed.
fn summary(parent: &Details, importer: &Details) -> String {
    let get = |key: &str| importer.get(key).unwrap_or("not reached").to_string();
    if get("pool_import") != "CUDA_SUCCESS" || get("pointer_import") != "CUDA_SUCCESS" {
        return format!(
            "the child could not import (pool {}, pointer {}; {})",
            get("pool_import"),
            get("pointer_import"),
            get("child")
        );
    }
    let mut parts = Vec::new();
    if get("reads_before") != format!("{A_BYTE:#04x}") {
        parts.push(format!("the importer first read {}", meaning(&get("reads_before"))));
    }
    match parent.get("free_a") {
        Some("CUDA_SUCCESS") => {}
        Some(code) => parts.push(format!("the exporter's free: {code}")),
        None => return format!("the parent was never told the child held A ({})", get("child")),
    }
    parts.push(match (parent.get("alloc_b"), parent.get("b_address")) {
        (Some("CUDA_SUCCESS"), Some("A's address")) => "B took A's address: yes".to_string(),
        (Some("CUDA_SUCCESS"), Some(other)) => format!("B took A's address: no ({other})"),
        (code, _) => format!("B not allocated ({})", code.unwrap_or("not tried")),
    });
    if let Some(fill) = parent.get("fill_b").filter(|&fill| fill != "CUDA_SUCCESS") {
        parts.push(format!("B's fill: {fill}"));
    }
    let after = match importer.get("reads_after") {
        Some(read) => meaning(read),
        None => format!("nothing ({})", get("child")),
    };
    parts.push(format!("the importer then read {after}"));
    let reimport = match (importer.get("reimport"), importer.get("reimport_address")) {
        (Some("CUDA_SUCCESS"), Some(address)) => format!("CUDA_SUCCESS ({address})"),
        _ => get("reimport"),
    };
    parts.push(format!("A's old export data imported again: {reimport}"));
    parts.push(format!("the importer's free: {}", get("free_a")));
    parts.push(child::lived_on(importer, "the importer", &get("child")));
    if let Some(free) = parent.get("free_b").filter(|&free| free != "CUDA_SUCCESS") {
        parts.push(format!("B's free: {free}"));
    }
    parts.join("; ")
}

/// The importing child: the pool and A imported and read; once the parent has freed A and
/// filled B, A read again, its old export data imported again, A freed, and a pool made.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let data = CUmemPoolPtrExportData {
        reserved: input.payload.as_slice().try_into().map_err(|_| "the export data is not 64 bytes")?,
    };
    let stream = OwnedStream::new(false)?;
    let pool = import_pool(input.fd(0)?);
    details.put("pool_import", code(&pool));
    let pool = pool?;
    let a = import_pointer(pool, data);
    details.put("pointer_import", code(&a));
    let Ok(a) = a else {
        details.put("destroy_pool", code(&destroy_pool(pool)));
        return Ok(());
    };
    details.put("reads_before", byte_or_error(a));
    details.put(HOLDS_A, "yes");
    if let Err(e) = input.wait_for_parent() {
        // Release what the parent would otherwise find still mapped.
        details.put("free_a", code(&free_and_wait(a, &stream)));
        details.put("destroy_pool", code(&destroy_pool(pool)));
        return Err(e);
    }
    details.put("reads_after", byte_or_error(a));
    let again = import_pointer(pool, data);
    details.put("reimport", code(&again));
    if let Ok(ptr) = again {
        details.put("reimport_address", if ptr == a { "the same address" } else { "another address" });
        // The same address is the same, uncounted mapping (question 2): freed once, below.
        if ptr != a {
            details.put("reimport_reads", byte_or_error(ptr));
            details.put("free_reimport", code(&free_and_wait(ptr, &stream)));
        }
    }
    details.put("free_a", code(&free_and_wait(a, &stream)));
    details.put("destroy_pool", code(&destroy_pool(pool)));
    child::note_lived_on(details);
    Ok(())
}
