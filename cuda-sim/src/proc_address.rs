//! `cuGetProcAddress_v2`: base name + CUDA version + stream flag → entry point, as the driver
//! answers it.
//!
//! The table joins the simulator's exported symbols with `cuda-mem-sys`'s symbol table (generated
//! from `cuda.h` and `cudaTypedefs.h`), which says for each versioned symbol its base name and
//! the CUDA version its ABI appeared in. A request selects the variant with the highest version
//! not above the one asked for; the per-thread flag selects the `_ptds`/`_ptsz` variant where
//! there is one. The simulator implements the variants `cuda.h` 13.0 declares, and the few older
//! ones `cuda_mem_sys::OLDER_SYMBOLS` lists (`cuEventElapsedTime` of CUDA 2.0, which `cuda-mem` uses
//! on drivers before 12.8; `cuMemAdvise` and `cuMemPrefetchAsync` of CUDA 8.0, used before 12.2;
//! `cuDeviceGetUuid` of CUDA 9.2, used before 11.4),
//! so a request for another older ABI of a function (`cuMemAlloc` at
//! CUDA 3.0, with 32-bit sizes) is answered "version not sufficient" rather than with an entry
//! point of the wrong signature.
//!
//! Pretending to be an older driver (`CUDA_SIM_DRIVER_VERSION`), it offers no variant newer
//! than that version: a function all of whose variants are newer is "symbol not found", as on a
//! driver that never had it, and a request for a newer variant gets the newest one that driver
//! had. Before CUDA 12.0 there was no `cuGetProcAddress_v2` (and before 11.3 no
//! `cuGetProcAddress`): the simulator still exports them, so it answers every request "symbol
//! not found", which sends a loader to `dlsym`, as the missing entry point would.
//!
//! The few functions newer than `cuda.h` 13.0 come from `cuda_mem_sys::NEWER_SYMBOLS`, offered only
//! when the reported version is at least theirs.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use cuda_mem_sys::types::{CUdriverProcAddress_flags, CUdriverProcAddressQueryResult, CUresult, cuuint64_t};

use crate::error::{SimResult, ensure, fail, write_out};

/// For one base name: `(version, address)` of each legacy variant, and of each per-thread one.
#[derive(Default)]
struct Variants {
    legacy: Vec<(u32, usize)>,
    per_thread: Vec<(u32, usize)>,
}

fn table() -> &'static HashMap<&'static [u8], Variants> {
    static TABLE: OnceLock<HashMap<&'static [u8], Variants>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let exported: HashMap<&str, usize> = crate::exports::table().into_iter().collect();
        // A driver has no variant newer than itself.
        let newest = crate::config::driver_version().map_or(0, |v| v.unsigned_abs());
        let mut table: HashMap<&'static [u8], Variants> = HashMap::new();
        for info in cuda_mem_sys::SYMBOLS.iter().chain(cuda_mem_sys::NEWER_SYMBOLS).chain(cuda_mem_sys::OLDER_SYMBOLS) {
            let Some(version) = info.version.filter(|&v| v <= newest) else {
                continue;
            };
            let base = info.base.to_bytes();
            if let Some(&address) = info.symbol.to_str().ok().and_then(|s| exported.get(s)) {
                table.entry(base).or_default().legacy.push((version, address));
            }
            if let Some((name, pt_version)) = info.per_thread
                && pt_version <= newest
                && let Some(&address) = name.to_str().ok().and_then(|s| exported.get(s))
            {
                table.entry(base).or_default().per_thread.push((pt_version, address));
            }
        }
        table
    })
}

/// The CUDA version that introduced `cuGetProcAddress_v2` (`PFN_cuGetProcAddress_v12000`).
const GET_PROC_ADDRESS_V2: i32 = 12000;

/// The highest-versioned variant not above `version`, and whether any variant exists at all.
fn pick(variants: &[(u32, usize)], version: u32) -> Option<usize> {
    variants.iter().filter(|(v, _)| *v <= version).max_by_key(|(v, _)| *v).map(|(_, address)| *address)
}

/// `cuGetProcAddress_v2` (and the older `cuGetProcAddress`, with a null `status`). Callable
/// before `cuInit`, as the runtime relies on.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `pfn` and `status` are null or valid for a write.
pub(crate) unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> SimResult {
    use CUdriverProcAddressQueryResult as Q;
    ensure(!symbol.is_null() && !pfn.is_null() && version > 0)?;
    let reported = crate::api::init::reported_version()?;
    let legacy = u64::from(CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM.0);
    let per_thread = u64::from(CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.0);
    ensure(flags & !(legacy | per_thread) == 0 && flags != (legacy | per_thread))?;
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let version = version as u32;
    let found = (reported >= GET_PROC_ADDRESS_V2).then(|| table().get(name)).flatten().map(|variants| {
        let threaded = if flags == per_thread { pick(&variants.per_thread, version) } else { None };
        (threaded.or_else(|| pick(&variants.legacy, version)), variants)
    });
    let (address, result, code) = match found {
        Some((Some(address), _)) => (address as *mut c_void, Q::CU_GET_PROC_ADDRESS_SUCCESS, CUresult::CUDA_SUCCESS),
        Some((None, _)) => {
            (std::ptr::null_mut(), Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, CUresult::CUDA_ERROR_NOT_FOUND)
        }
        None => (std::ptr::null_mut(), Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CUresult::CUDA_ERROR_NOT_FOUND),
    };
    // SAFETY: forwarded from the caller; `status` is optional.
    unsafe {
        write_out(pfn, address)?;
        if !status.is_null() {
            write_out(status, result)?;
        }
    }
    if code == CUresult::CUDA_SUCCESS { Ok(()) } else { fail(code) }
}
