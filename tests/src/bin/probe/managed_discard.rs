//! Question 18: what discarded managed memory reads as. `cuda.h`: reading a discarded range
//! without writing or prefetching it first "will return an indeterminate value"; the simulator
//! overwrites discarded pages with `0xDB`, so that code relying on the old contents fails there.
//! Memory is filled with `0x5A`, discarded with `cuMemDiscardBatchAsync`, and copied to the host.

use std::collections::BTreeSet;

use cuda_mem_sys::{cu_call, driver};

use crate::owned::{ManagedAllocation, OwnedStream};
use crate::raw::{Call, code, managed_unsupported, memset_sync, read_bytes};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "managed-discard",
    question: "A managed allocation filled with 0x5A, discarded with cuMemDiscardBatchAsync (one range, the whole \
               allocation) on a stream, then copied to the host with cuMemcpyDtoH: the discard's result, and what the \
               bytes read as",
    run,
    child: None,
};

const SIZE: usize = 2 << 20;
const PATTERN: u8 = 0x5A;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    if let Some(reason) = managed_unsupported()? {
        return Ok(reason);
    }
    let memory = ManagedAllocation::new(SIZE)?;
    memset_sync(memory.ptr(), PATTERN, SIZE)?;
    let stream = OwnedStream::new(false)?;
    let discarded = discard(memory.ptr(), SIZE, &stream).and_then(|()| stream.synchronize());
    details.put("discard", code(&discarded));
    if let Err(e) = discarded {
        return Ok(format!("cuMemDiscardBatchAsync: {}", crate::raw::error_code(e)));
    }
    let bytes = read_bytes(memory.ptr(), SIZE)?;
    let values: BTreeSet<u8> = bytes.iter().copied().collect();
    let shown: Vec<String> = values.iter().take(8).map(|v| format!("{v:#04X}")).collect();
    details.put(
        "distinct_values",
        format!("{} ({}{})", values.len(), shown.join(" "), if values.len() > 8 { " …" } else { "" }),
    );
    details.put("first_byte", format!("{:#04X}", bytes[0]));
    let reads = match values.iter().copied().collect::<Vec<_>>().as_slice() {
        [only] if *only == PATTERN => "every byte still 0x5A (the old contents)".to_string(),
        [only] => format!("every byte {only:#04X}"),
        _ => format!("mixed: {} distinct values", values.len()),
    };
    Ok(format!("cuMemDiscardBatchAsync: CUDA_SUCCESS; the memory reads {reads}"))
}

/// `cuMemDiscardBatchAsync` of one range on `stream`.
fn discard(ptr: u64, size: usize, stream: &OwnedStream) -> Call {
    let d = driver()?;
    let mut ptrs = [ptr];
    let mut sizes = [size];
    // SAFETY: both arrays hold one element, the count given; the driver checks the range; the
    // stream is alive.
    unsafe { cu_call!(d, cuMemDiscardBatchAsync(ptrs.as_mut_ptr(), sizes.as_mut_ptr(), 1, 0, stream.raw())) }
}
