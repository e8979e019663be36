//! cuda-mem-core's DLPack export and import behind a C interface, for a consumer in another
//! language: `tests/python/dlpack_consumer.py` loads this library with `ctypes` and hands its
//! tensors to cuda.core, and cuda.core's to it (`tests/tests/dlpack_consumer.rs` runs it).
//!
//! Built as a `cdylib` (`target/<profile>/examples/libdlpack_ffi.so`). The driver is the one
//! `CUDA_MEM_DRIVER` names (or `libcuda.so.1`): point it at the library the other side loads so
//! that both drive one simulator. Every function returns a status ([`OK`], [`FAILED`] with
//! [`dlpack_ffi_last_error`] saying why, [`PANICKED`]); none lets a panic cross into C.

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_mem_core::dlpark::ffi::DLManagedTensorVersioned;
use cuda_mem_core::{
    Buffer, ConsumerStream, Device, DeviceMemoryResource, DlpackImport, ExportOptions, ExportSource, RawStream, Stream,
    StreamOptions, export_dlpack,
};

/// The call succeeded.
pub const OK: i32 = 0;
/// The call failed: [`dlpack_ffi_last_error`] says why.
pub const FAILED: i32 = 1;
/// The call panicked (a bug here); the panic was stopped at the boundary.
pub const PANICKED: i32 = 2;

/// How many exported buffers were released: each export's deleter drops its source once.
static SOURCES_RELEASED: AtomicUsize = AtomicUsize::new(0);

/// The last failure's message.
static LAST_ERROR: Mutex<Option<CString>> = Mutex::new(None);

/// An exported buffer that counts its release in [`SOURCES_RELEASED`].
struct Counted(Buffer);

// SAFETY: the buffer is moved into `Counted`, which is moved into the tensor: nothing else
// reaches it.
unsafe impl ExportSource for Counted {
    fn buffer(&self) -> &Buffer {
        &self.0
    }

    fn is_exclusive(&self) -> bool {
        true
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        SOURCES_RELEASED.fetch_add(1, Ordering::SeqCst);
    }
}

/// What [`dlpack_ffi_import_read`] found in a tensor (`#[repr(C)]`, mirrored in the Python
/// script).
#[repr(C)]
#[derive(Debug, Default)]
pub struct ImportInfo {
    /// DLPack device type.
    pub device_type: i32,
    /// DLPack device id.
    pub device_id: i32,
    /// Data type code, bits and lanes.
    pub dtype_code: u8,
    /// Bits per lane.
    pub dtype_bits: u8,
    /// Lanes.
    pub dtype_lanes: u16,
    /// Number of dimensions.
    pub ndim: i32,
    /// The first dimension (0 for a scalar).
    pub shape0: i64,
    /// The bytes the tensor's elements span.
    pub size: u64,
    /// The first byte's address.
    pub ptr: u64,
    /// 1 when the producer marked it read-only.
    pub read_only: i32,
}

type Outcome = Result<(), String>;

/// Runs `body`, turning its error or panic into a status.
fn guarded(body: impl FnOnce() -> Outcome) -> i32 {
    let (status, message) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return OK,
        Ok(Err(message)) => (FAILED, message),
        Err(_) => (PANICKED, "panicked (a bug in dlpack_ffi)".to_string()),
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    if let Ok(mut last) = LAST_ERROR.lock() {
        *last = Some(message);
    }
    status
}

/// The consumer's stream as `__dlpack__(stream=…)` names it for CUDA: `-1` no synchronization,
/// `1` (or Python's `None`) the legacy default stream, `2` the per-thread default stream, any
/// other value a stream handle; `0` is ambiguous and refused.
///
/// # Safety
/// A handle is a live stream of device 0 until the tensor's deleter has run.
unsafe fn consumer_stream(stream: isize) -> Result<ConsumerStream<'static>, String> {
    Ok(match stream {
        -1 => ConsumerStream::NoSync,
        1 => ConsumerStream::LegacyDefault,
        2 => ConsumerStream::PerThreadDefault,
        0 => return Err("stream 0 is ambiguous for CUDA (DLPack): pass 1, 2, -1 or a stream handle".to_string()),
        // SAFETY: the caller vouches for the handle.
        handle => ConsumerStream::Raw(unsafe { RawStream::new(handle as cuda_mem_sys::types::CUstream) }),
    })
}

/// Allocates `n` `f32`s from a new device pool of device 0, fills them with `0, 1, …, n - 1`
/// and exports them (writable, one dimension) for a consumer on `stream` (see
/// [`consumer_stream`]); the tensor goes to `*out`. The pool lives as long as the tensor.
///
/// # Safety
/// `out` is valid for a write; `stream`, when a handle, is a live stream of device 0 until the
/// tensor's deleter has run.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlpack_ffi_export_f32(
    n: usize,
    stream: isize,
    out: *mut *mut DLManagedTensorVersioned,
) -> i32 {
    guarded(|| {
        // SAFETY: the caller vouches for the handle.
        let consumer = unsafe { consumer_stream(stream) }?;
        let device = Device::new(0).map_err(|e| e.to_string())?;
        let own = Stream::new(device, StreamOptions::default().non_blocking()).map_err(|e| e.to_string())?;
        let pool = DeviceMemoryResource::new(device, Default::default()).map_err(|e| e.to_string())?;
        let mut buffer = pool.allocate(n * size_of::<f32>(), &own).map_err(|e| e.to_string())?;
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        buffer.copy_from_slice(&data, &own).map_err(|e| e.to_string())?;
        let options = ExportOptions::default().consumer_stream(consumer);
        let tensor = export_dlpack::<f32>(Counted(buffer), &options).map_err(|e| e.to_string())?;
        // SAFETY: the caller vouched that `out` is writable.
        unsafe { out.write(tensor.into_raw()) };
        Ok(())
    })
}

/// Calls a tensor's deleter without using it (a capsule dropped unconsumed).
///
/// # Safety
/// `tensor` is null or a tensor the caller owns, whose deleter has not run.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlpack_ffi_release(tensor: *mut DLManagedTensorVersioned) -> i32 {
    guarded(|| {
        // SAFETY: the caller vouched that a non-null `tensor` is a live tensor.
        if let Some(deleter) = unsafe { tensor.as_ref() }.and_then(|t| t.deleter) {
            // SAFETY: the caller owns the tensor and hands it over; its deleter runs once.
            unsafe { deleter(tensor) };
        }
        Ok(())
    })
}

/// How many exported tensors have been released (their deleter called).
#[unsafe(no_mangle)]
pub extern "C" fn dlpack_ffi_sources_released() -> usize {
    SOURCES_RELEASED.load(Ordering::SeqCst)
}

/// Imports `tensor` with [`DlpackImport::from_raw`], describes it in `*info`, copies its
/// `size` bytes into `out` (`out_len` of them, which must match), and drops the import, which
/// calls the producer's deleter once; on error the tensor is released too.
///
/// # Safety
/// `tensor` is a `DLManagedTensorVersioned` the caller owns (as `DlpackImport::from_raw` asks);
/// `info` is valid for a write and `out` for `out_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlpack_ffi_import_read(
    tensor: *mut DLManagedTensorVersioned,
    info: *mut ImportInfo,
    out: *mut u8,
    out_len: usize,
) -> i32 {
    guarded(|| {
        // SAFETY: the caller hands over a tensor it owns, describing memory its producer keeps.
        let import = unsafe { DlpackImport::from_raw(tensor) }.map_err(|e| e.to_string())?;
        let device = import.buffer().device().map_or_else(|| Device::new(0), Ok).map_err(|e| e.to_string())?;
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).map_err(|e| e.to_string())?;
        let dtype = import.dtype();
        let described = ImportInfo {
            device_type: import.dl_device().device_type.0 as i32,
            device_id: import.dl_device().device_id,
            dtype_code: dtype.code.0,
            dtype_bits: dtype.bits,
            dtype_lanes: dtype.lanes,
            ndim: import.shape().len() as i32,
            shape0: import.shape().first().copied().unwrap_or(0),
            size: import.buffer().size() as u64,
            ptr: import.buffer().ptr(),
            read_only: i32::from(import.is_read_only()),
        };
        // SAFETY: the caller vouched that `info` is writable.
        unsafe { info.write(described) };
        if import.buffer().size() != out_len {
            return Err(format!("the tensor spans {} bytes, the destination holds {out_len}", import.buffer().size()));
        }
        let bytes = import.buffer().to_vec::<u8>(&stream).map_err(|e| e.to_string())?;
        // SAFETY: the caller vouched for `out_len` bytes at `out`, which `bytes` has.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, out_len) };
        drop(import);
        Ok(())
    })
}

/// The last failure's message (valid until the next failure), or null.
#[unsafe(no_mangle)]
pub extern "C" fn dlpack_ffi_last_error() -> *const c_char {
    match LAST_ERROR.lock() {
        Ok(last) => last.as_ref().map_or(std::ptr::null(), |m| m.as_ptr()),
        Err(_) => std::ptr::null(),
    }
}
