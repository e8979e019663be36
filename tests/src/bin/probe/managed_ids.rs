//! Question 16: what `CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID` and
//! `CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID` read where the matching `_TYPE` says the id
//! is to be ignored (the host, or no location yet). `cuda.h` says only "ignore"; the simulator
//! reads `CU_DEVICE_INVALID` (-2), and the legacy `PREFERRED_LOCATION` and
//! `LAST_PREFETCH_LOCATION` read `CU_DEVICE_CPU` (-1) for the host. Each value is read into one
//! preset to a marker, so that one the driver leaves alone shows as `unwritten`.

use cuda_mem_sys::types::{CUmem_advise, CUmem_range_attribute, CUmemLocationType};

use crate::owned::{ManagedAllocation, OwnedStream};
use crate::raw::{UNWRITTEN, advise, code, host_location, managed_unsupported, prefetch, range_attribute};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "managed-ignored-location-ids",
    question: "cuMemRangeGetAttribute of a managed allocation's PREFERRED_LOCATION_TYPE/_ID and \
               LAST_PREFETCH_LOCATION_TYPE/_ID (and the legacy PREFERRED_LOCATION, LAST_PREFETCH_LOCATION): with no \
               advice or prefetch, and after advising the host as the preferred location and prefetching to the host",
    run,
    child: None,
};

const SIZE: usize = 2 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    if let Some(reason) = managed_unsupported()? {
        return Ok(reason);
    }
    let memory = ManagedAllocation::new(SIZE)?;
    let stream = OwnedStream::new(false)?;
    let before = read(memory.ptr(), details, "fresh");
    let advised = advise(memory.ptr(), SIZE, CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host_location());
    details.put("advise_host", code(&advised));
    let prefetched = prefetch(memory.ptr(), SIZE, host_location(), stream.raw());
    details.put("prefetch_host", code(&prefetched));
    let after = read(memory.ptr(), details, "host");
    Ok(format!(
        "fresh: {before}; after preferring and prefetching to the host (advice {}, prefetch {}): {after}",
        code(&advised),
        code(&prefetched)
    ))
}

/// Reads the preferred and last-prefetch attributes, recording each under `stage`; one line.
fn read(ptr: u64, details: &mut Details, stage: &str) -> String {
    use CUmem_range_attribute as A;
    let mut read_one = |name: &str, attribute: A, as_type: bool| -> String {
        let value = match range_attribute(ptr, SIZE, attribute) {
            Ok(value) if as_type => location_type(value),
            Ok(value) => id(value),
            Err(e) => crate::raw::error_code(e),
        };
        details.put(format!("{stage}.{name}"), &value);
        value
    };
    let preferred = format!(
        "preferred {} id {} (legacy {})",
        read_one("preferred_type", A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, true),
        read_one("preferred_id", A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID, false),
        read_one("preferred_legacy", A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, false),
    );
    let last = format!(
        "last prefetch {} id {} (legacy {})",
        read_one("last_prefetch_type", A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE, true),
        read_one("last_prefetch_id", A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID, false),
        read_one("last_prefetch_legacy", A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, false),
    );
    format!("{preferred}, {last}")
}

/// A location type as read: its name without the prefix.
fn location_type(value: i32) -> String {
    use CUmemLocationType as T;
    let names = [
        (T::CU_MEM_LOCATION_TYPE_INVALID, "INVALID"),
        (T::CU_MEM_LOCATION_TYPE_DEVICE, "DEVICE"),
        (T::CU_MEM_LOCATION_TYPE_HOST, "HOST"),
        (T::CU_MEM_LOCATION_TYPE_HOST_NUMA, "HOST_NUMA"),
        (T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, "HOST_NUMA_CURRENT"),
    ];
    match names.iter().find(|(t, _)| t.0 as i64 == i64::from(value)) {
        Some((_, name)) => (*name).to_string(),
        None => id(value),
    }
}

/// An id as read: `CU_DEVICE_CPU` (-1), `CU_DEVICE_INVALID` (-2), the marker, or the number.
fn id(value: i32) -> String {
    match value {
        UNWRITTEN => "unwritten".to_string(),
        -1 => "CU_DEVICE_CPU".to_string(),
        -2 => "CU_DEVICE_INVALID".to_string(),
        other => other.to_string(),
    }
}
