//! Question 7: whether `cuMemAddressReserve` honours an address hint for the range right after
//! an existing reservation. `cuda-mem-vmm` grows a virtual buffer in place only when it does
//! (`grow`: `cuMemAddressReserve(added, 0, end)`), and moves it otherwise; the demo counts on
//! it to show growth in place. Asked many times, with alignment 0 (as the library asks), with
//! the granularity as the alignment, and for a range eight times larger.

use cuda_mem_sys::types::{CUmemAllocationGranularity_flags, CUmemAllocationProp, CUmemAllocationType};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::owned::Reservation;
use crate::raw::{device_location, error_code};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "address-hint",
    question: "cuMemAddressReserve with the address right after an existing reservation as the hint: how often is it \
               honoured, with alignment 0 (as cuda-mem-vmm's in-place growth asks), with the granularity as the \
               alignment, and for a larger range?",
    run,
    child: None,
};

/// How many times each variant is asked.
const TRIES: usize = 32;

/// A variant: its key in the details, its words in the answer, the alignment (in granularities;
/// 0 for none) and the size of the hinted range (in granularities).
const VARIANTS: [(&str, &str, usize, usize); 3] = [
    ("alignment_0", "with alignment 0", 0, 1),
    ("alignment_granularity", "with the granularity as alignment", 1, 1),
    ("eight_granularities", "for 8 granularities (alignment 0)", 0, 8),
];

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let granularity = granularity()?;
    details.put("granularity", granularity);
    let mut answers = Vec::new();
    for (name, words, alignment, size) in VARIANTS {
        let (mut honoured, mut elsewhere) = (0, 0);
        let mut refusals: Vec<String> = Vec::new();
        for _ in 0..TRIES {
            let first = Reservation::new(granularity, 0, 0)?;
            match Reservation::new(size * granularity, alignment * granularity, first.end()) {
                Ok(next) if next.ptr() == first.end() => honoured += 1,
                Ok(_) => elsewhere += 1,
                Err(e) => refusals.push(error_code(e)),
            }
        }
        refusals.sort();
        refusals.dedup();
        details.put(format!("{name}.honoured"), format!("{honoured}/{TRIES}"));
        details.put(format!("{name}.granted_elsewhere"), elsewhere);
        if !refusals.is_empty() {
            details.put(format!("{name}.refused_with"), refusals.join(", "));
        }
        answers.push(format!("{honoured}/{TRIES} {words}"));
    }
    Ok(format!("the hint right after a reservation is honoured {}", answers.join(", ")))
}

/// The minimum granularity of device 0's memory, the unit of VMM sizes.
pub(crate) fn granularity() -> Result<usize, CudaError> {
    let d = driver()?;
    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: device_location(0),
        ..CUmemAllocationProp::default()
    };
    let mut granularity = 0usize;
    // SAFETY: `granularity` is a valid out-pointer and `prop` valid for a read.
    unsafe {
        cu_call!(
            d,
            cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
            )
        )
    }?;
    Ok(granularity)
}
