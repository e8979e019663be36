//! Primary contexts: retained once per device for the life of the process, and bound to the
//! calling thread before every driver call that needs one.
//!
//! Binding on every call (rather than once) is what lets a buffer be dropped on a thread that
//! never touched CUDA, or after another library changed the current context.

use std::cell::RefCell;
use std::sync::{Mutex, PoisonError};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::CUcontext;

use crate::device::Device;
use crate::driver::driver;
use crate::error::Result;

/// A primary context this module retained, never released: valid for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Retained(CUcontext);

// SAFETY: the handle is an opaque token that only the driver interprets (Rust never dereferences
// it); the driver lets any thread make a context current and use it, and a retained primary
// context is never released here, so the handle stays valid wherever it is sent.
unsafe impl Send for Retained {}
// SAFETY: as for `Send`; `Retained` is a copyable value with no interior mutability.
unsafe impl Sync for Retained {}

/// Retained primary contexts, by device ordinal.
static PRIMARY: Mutex<Vec<Option<Retained>>> = Mutex::new(Vec::new());

thread_local! {
    /// The entries of [`PRIMARY`] this thread has read. A retained primary context stays the
    /// same for the life of the process, so a copy never goes stale and saves the lock that
    /// every thread allocating through a default stream would otherwise contend for.
    static SEEN: RefCell<Vec<Option<Retained>>> = const { RefCell::new(Vec::new()) };
}

/// The device's primary context, retained on first use and kept for the life of the process.
pub(crate) fn primary(device: Device) -> Result<CUcontext> {
    let ordinal = device.ordinal();
    // `try_with` fails only while the thread is being torn down; the table still answers then.
    let seen = SEEN.try_with(|seen| seen.borrow().get(ordinal).copied().flatten()).ok().flatten();
    if let Some(Retained(handle)) = seen {
        return Ok(handle);
    }
    let context = primary_from_table(device)?;
    let _ = SEEN.try_with(|seen| {
        let mut seen = seen.borrow_mut();
        if seen.len() <= ordinal {
            seen.resize(ordinal + 1, None);
        }
        seen[ordinal] = Some(Retained(context));
    });
    Ok(context)
}

/// [`primary`] through the process-wide table, retaining the context the first time.
fn primary_from_table(device: Device) -> Result<CUcontext> {
    let mut table = PRIMARY.lock().unwrap_or_else(PoisonError::into_inner);
    let ordinal = device.ordinal();
    if table.len() <= ordinal {
        table.resize(ordinal + 1, None);
    }
    if let Some(Retained(handle)) = table[ordinal] {
        return Ok(handle);
    }
    let d = driver()?;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer; the ordinal was validated by `Device::new`.
    unsafe { cu_call!(d, cuDevicePrimaryCtxRetain(&mut context, device.raw())) }?;
    table[ordinal] = Some(Retained(context));
    Ok(context)
}

/// Makes the device's primary context current on the calling thread, if it is not already.
pub(crate) fn bind(device: Device) -> Result<()> {
    let context = primary(device)?;
    let d = driver()?;
    let mut current: CUcontext = std::ptr::null_mut();
    // Asking first only saves a call: when the question fails, the context is set all the same
    // (so a free that needs a context is not given up for want of an answer).
    // SAFETY: `current` is a valid out-pointer.
    let asked = unsafe { cu_call!(d, cuCtxGetCurrent(&mut current)) };
    if asked.is_err() || current != context {
        // SAFETY: `context` is a retained primary context, valid for the life of the process.
        unsafe { cu_call!(d, cuCtxSetCurrent(context)) }?;
    }
    Ok(())
}

/// Whether no context is current on the calling thread.
pub(crate) fn current_is_none() -> Result<bool> {
    let d = driver()?;
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetCurrent(&mut current)) }?;
    Ok(current.is_null())
}
