//! Import: a DLPack tensor of CUDA device, pinned host or managed memory as a [`Buffer`] that
//! does not free the memory but calls the producer's deleter, once, when dropped.

use std::any::Any;
use std::sync::Arc;

use bytemuck::Pod;
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};

use super::dtype::{DlpackElement, element_bytes, is_defined};
use super::export::ExportSource;
use super::layout::{Unbounded, has_gaps, reach};
use super::range::{Known, check_inside_allocation};
use crate::buffer::{Buffer, ForeignMemory};
use crate::device::Device;
use crate::drop_errors::on_drop;
use crate::error::{DlpackError, Error, Result};
use crate::view::{DeviceView, DeviceViewMut};

/// A DLPack tensor taken from its producer: a [`Buffer`] over the memory (every element the
/// strides reach: the tensor's bytes when it is contiguous), which frees nothing, and the
/// tensor's shape, strides, data type and flags.
///
/// It dereferences to the buffer, for reading (copies out, [`host_slice`](Buffer::host_slice)
/// of host memory); writing needs [`buffer_mut`](DlpackImport::buffer_mut) or
/// [`view_mut`](DlpackImport::view_mut), which refuse a tensor its producer marked read-only.
///
/// A tensor whose elements leave gaps in their span (a column of a wider matrix, every other
/// element: see [`has_gaps`](DlpackImport::has_gaps)) gets a buffer over the whole span, gaps
/// included, which hold bytes the producer did not lend: it is read-only here.
/// [`buffer_mut`](DlpackImport::buffer_mut) refuses it, and handed on to another consumer
/// ([`export_dlpack`](crate::export_dlpack)) it is exported read-only.
///
/// Dropping it first waits for the work enqueued through the buffer (every stream it was used
/// on), so that the producer, which may free or reuse the memory as soon as it is released,
/// never does so under work still running, and then calls the producer's deleter, exactly
/// once. When that wait fails, the error is recorded (see
/// [`take_drop_errors`](crate::take_drop_errors)) and the buffer, dropped next, waits once
/// more: if that succeeds the deleter is called then; if it fails too, that error is recorded
/// as well and the deleter is never called (the tensor is leaked), so that the producer cannot
/// free or reuse the memory under work that may still be running.
///
/// # Exporting and importing
///
/// A buffer leaves as a versioned DLPack tensor (`DLManagedTensorVersioned`) for any DLPack
/// consumer (PyTorch, CuPy, JAX, cuda.core's `StridedMemoryView`, a C library): `into_dlpack`
/// moves an owned `Buffer` into the tensor (writable), `export_dlpack` takes an `Arc<Buffer>`
/// or any `ExportSource`, `DeviceView::to_dlpack` a typed view of a shared buffer (both
/// read-only). The tensor keeps the buffer, and so its pool, alive until the consumer calls its
/// deleter; its device is the memory's (`kDLCUDA`, `kDLCUDAHost`, `kDLCUDAManaged`), its data
/// type the element type's (`DlpackElement`), its shape one dimension or the one
/// `ExportOptions` gives (strides checked against the size). The consumer names its stream
/// (`ConsumerStream`, as `__dlpack__(stream=…)`): it waits for the buffer's work, and the
/// memory is freed after the consumer's. `DlpackImport` takes a tensor of CUDA device, pinned or
/// managed memory as a buffer that frees nothing and calls the producer's deleter once when
/// dropped (after the work enqueued through it).
///
/// ```
/// # #[cfg(feature = "dlpack")] {
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{ConsumerStream, Device, DeviceMemoryResource, DlpackImport, ExportOptions, Stream, StreamOptions};
///
/// let device = Device::new(0)?;
/// let producer = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let consumer = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let mut buffer = pool.allocate(6 * size_of::<f32>(), &producer)?;
/// buffer.copy_from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &producer)?;
///
/// // Export: a 2x3 float32 tensor that owns the buffer (and keeps the pool alive); the
/// // consumer's stream waits for the producer's work. `tensor.into_raw()` hands it to C, or
/// // to Python in a `dltensor_versioned` capsule.
/// let options = ExportOptions::default().shape(&[2, 3]).consumer_stream(ConsumerStream::Stream(&consumer));
/// let tensor = buffer.into_dlpack::<f32>(&options)?;
/// drop(pool);
///
/// // Import, as a consumer: a buffer over the tensor's memory, typed views of it.
/// // SAFETY: the tensor's memory stays valid until its deleter runs (it owns the buffer), and
/// // nothing else writes it.
/// let import = unsafe { DlpackImport::from_dlpack(tensor)? };
/// assert_eq!(import.shape(), [2, 3]);
/// assert_eq!(import.view::<f32>()?.to_vec(&consumer)?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// drop(import); // the deleter: the buffer is freed (after the consumer's work), then the pool
/// # }
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[doc(alias = "StridedMemoryView")]
#[doc(alias = "from_dlpack")]
#[derive(Debug)]
pub struct DlpackImport {
    // Dropped after `Drop::drop` has waited for its uses: the deleter lives in its keep-alive.
    buffer: Buffer,
    shape: Vec<i64>,
    strides: Vec<i64>,
    dtype: DLDataType,
    device: DLDevice,
    read_only: bool,
}

/// The major version of the tensors this crate reads.
const SUPPORTED_MAJOR: u32 = dlpark::ffi::DLPACK_MAJOR_VERSION;

impl DlpackImport {
    /// Takes a versioned tensor (`DLManagedTensorVersioned`, DLPack 1.x) from its producer.
    /// On error the tensor is released (its deleter called) before returning.
    ///
    /// # Safety
    /// The tensor describes memory valid for its shape, strides and data type until its deleter
    /// is called (the DLPack contract), and, for host-accessible memory, nothing writes it
    /// behind the buffer's back while host slices of it are borrowed (as
    /// [`Buffer::from_raw`]).
    ///
    /// # Errors
    /// - [`Error::Dlpack`] with [`DlpackError::UnsupportedVersion`] for another major version.
    /// - [`DlpackError::UnsupportedDevice`] for memory that is not CUDA device, CUDA host or CUDA
    ///   managed memory.
    /// - [`DlpackError::DeviceNotVisible`] for a device this process does not see.
    /// - [`DlpackError::NullData`] for elements at a null pointer.
    /// - [`DlpackError::UnknownDtype`] for a data type DLPack does not define (an unknown type
    ///   code, or a width its code does not take).
    /// - [`DlpackError::UnsupportedDtype`] for a data type that is not a whole number of bytes.
    /// - [`DlpackError::Malformed`] for inconsistent metadata: a negative dimension, a shape
    ///   whose element or byte count overflows, a data pointer and byte offset whose sum with
    ///   the elements' extent passes the end of the address space.
    /// - For device and managed memory, [`DlpackError::NotAllocated`] when the driver knows no
    ///   allocation at the elements' lowest byte, and [`DlpackError::OutsideAllocation`] when
    ///   they run past the allocation they start in (`cuMemGetAddressRange`; memory mapped
    ///   through the VMM API may run on through the mappings that follow without a gap). Pinned
    ///   host memory is checked so where the driver knows its address.
    /// - A driver error counting devices, or asking where the memory lies.
    ///
    /// The range check keeps a producer's word from reaching memory the tensor does not have:
    /// a byte offset of 2^63, a shape past the allocation's end, elements that run into a
    /// neighbouring allocation. What it cannot see is the producer's own use of an allocation it
    /// owns: that stays its promise (above).
    pub unsafe fn from_dlpack(tensor: impl Into<dlpark::versioned::Dlpack>) -> Result<DlpackImport> {
        import(tensor.into())
    }

    /// Takes a legacy tensor (`DLManagedTensor`, before DLPack 1.0: no version, no flags, so
    /// writable) from its producer, as [`from_dlpack`](DlpackImport::from_dlpack).
    ///
    /// # Safety
    /// As [`from_dlpack`](DlpackImport::from_dlpack).
    ///
    /// # Errors
    /// As [`from_dlpack`](DlpackImport::from_dlpack).
    pub unsafe fn from_legacy(tensor: dlpark::legacy::Dlpack) -> Result<DlpackImport> {
        import(tensor)
    }

    /// Takes a versioned tensor from a raw pointer (from C, or a Python capsule named
    /// `dltensor_versioned`). A tensor of another major version is released (its deleter
    /// called, as DLPack requires) and refused.
    ///
    /// # Safety
    /// `tensor` is null or points to a `DLManagedTensorVersioned` the caller owns (its deleter
    /// not yet called), whose deleter may be called from any thread; and as
    /// [`from_dlpack`](DlpackImport::from_dlpack).
    ///
    /// # Errors
    /// - [`DlpackError::NullTensor`] for a null pointer.
    /// - As [`from_dlpack`](DlpackImport::from_dlpack).
    pub unsafe fn from_raw(tensor: *mut DLManagedTensorVersioned) -> Result<DlpackImport> {
        // SAFETY: the caller hands over ownership of a valid tensor; dlpark releases one of an
        // incompatible version before returning its error.
        let managed = unsafe { Managed::from_raw(tensor) }.map_err(from_raw_error)?;
        import(managed)
    }

    /// Takes a legacy tensor from a raw pointer (a Python capsule named `dltensor`).
    ///
    /// # Safety
    /// As [`from_raw`](DlpackImport::from_raw), for a `DLManagedTensor`.
    ///
    /// # Errors
    /// As [`from_raw`](DlpackImport::from_raw).
    pub unsafe fn from_raw_legacy(tensor: *mut DLManagedTensor) -> Result<DlpackImport> {
        // SAFETY: as in `from_raw`.
        let managed = unsafe { Managed::from_raw(tensor) }.map_err(from_raw_error)?;
        import(managed)
    }

    /// The buffer over the tensor's memory, for reading: its copies, fills and views.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The buffer, for writing: only where it holds nothing but the tensor's elements.
    ///
    /// # Errors
    /// - [`DlpackError::ReadOnly`] when the producer marked the tensor read-only.
    /// - [`DlpackError::Gaps`] when its elements leave gaps in the buffer (see
    ///   [`has_gaps`](DlpackImport::has_gaps)), bytes the producer did not lend.
    pub fn buffer_mut(&mut self) -> Result<&mut Buffer> {
        if self.read_only {
            return Err(DlpackError::ReadOnly.into());
        }
        if self.has_gaps() {
            return Err(DlpackError::Gaps { shape: self.shape.clone(), strides: self.strides.clone() }.into());
        }
        Ok(&mut self.buffer)
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Its strides, in elements (computed, compact row-major, for a legacy tensor without).
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// Its data type.
    pub fn dtype(&self) -> DLDataType {
        self.dtype
    }

    /// Its DLPack device (type and id).
    pub fn dl_device(&self) -> DLDevice {
        self.device
    }

    /// Whether the producer marked it read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether its elements leave gaps in the span they reach (a column of a wider matrix,
    /// every other element): the buffer then covers bytes between them that are not the
    /// tensor's, so it is not lent for writing. Compact, permuted (transposed), reversed and
    /// broadcast tensors have none.
    pub fn has_gaps(&self) -> bool {
        has_gaps(&self.shape, &self.strides)
    }

    /// Whether its elements are compact row-major (what a typed view needs).
    pub fn is_contiguous(&self) -> bool {
        let mut step = 1i64;
        self.shape.contains(&0)
            || self.shape.iter().zip(&self.strides).rev().all(|(&dim, &stride)| {
                let compact = dim == 1 || stride == step;
                step = step.saturating_mul(dim);
                compact
            })
    }

    /// The elements as a typed view, in row-major order.
    ///
    /// # Errors
    /// - [`DlpackError::DtypeMismatch`] unless the tensor holds `T`s.
    /// - [`DlpackError::NotContiguous`] unless it is compact row-major.
    /// - As [`Buffer::view`] (alignment).
    pub fn view<T: Pod + DlpackElement>(&self) -> Result<DeviceView<'_, T>> {
        self.check_view::<T>()?;
        self.buffer().view::<T>()
    }

    /// The elements as a mutable typed view, in row-major order.
    ///
    /// # Errors
    /// - [`DlpackError::ReadOnly`] for a read-only tensor.
    /// - As [`view`](DlpackImport::view).
    pub fn view_mut<T: Pod + DlpackElement>(&mut self) -> Result<DeviceViewMut<'_, T>> {
        self.check_view::<T>()?;
        self.buffer_mut()?.view_mut::<T>()
    }

    fn check_view<T: DlpackElement>(&self) -> Result<()> {
        if !self.dtype.matches(T::DTYPE) {
            return Err(DlpackError::DtypeMismatch { expected: T::DTYPE, actual: self.dtype }.into());
        }
        if !self.is_contiguous() {
            return Err(DlpackError::NotContiguous { shape: self.shape.clone(), strides: self.strides.clone() }.into());
        }
        Ok(())
    }
}

/// An import handed on to another consumer: the new tensor holds it, so the producer's deleter
/// runs when the new consumer releases it. Writable unless its producer said read-only or its
/// elements leave gaps (the tensor exported covers the whole buffer, and the gaps are not the
/// producer's to lend); its device type stays the producer's (managed memory stays managed).
// SAFETY: the import is moved into the tensor, so its buffer is reached through nothing else of
// this process; the producer's read-only flag is kept (writable only where it allowed writes),
// and a buffer with gaps, bytes the producer did not lend, is never claimed exclusive.
unsafe impl ExportSource for DlpackImport {
    fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    fn is_exclusive(&self) -> bool {
        !self.read_only && !self.has_gaps()
    }

    fn is_managed(&self) -> Option<bool> {
        Some(self.device.device_type == DLDeviceType::CUDAMANAGED)
    }
}

impl Drop for DlpackImport {
    fn drop(&mut self) {
        // The buffer, the last holder of the deleter, is dropped after this: the producer's
        // deleter runs then.
        on_drop("DlpackImport", || self.buffer.wait_for_uses());
    }
}

fn from_raw_error(error: dlpark::dlpack::FromRawError) -> Error {
    match error {
        dlpark::dlpack::FromRawError::Version { source } => {
            DlpackError::UnsupportedVersion { major: source.actual, supported: SUPPORTED_MAJOR }.into()
        }
        _ => DlpackError::NullTensor.into(),
    }
}

/// Where the tensor's memory is: the device, and whether devices and the host reach it.
fn placement(device: DLDevice) -> Result<(Option<Device>, bool, bool)> {
    match device.device_type {
        DLDeviceType::CUDA => {
            let count = Device::count()?;
            let visible = usize::try_from(device.device_id).ok().filter(|&id| id < count);
            let Some(ordinal) = visible else {
                return Err(DlpackError::DeviceNotVisible { device_id: device.device_id, count }.into());
            };
            Ok((Some(Device::new(ordinal)?), true, false))
        }
        // Pinned and managed memory: every device and the host reach it; DLPack's id is 0.
        DLDeviceType::CUDAHOST | DLDeviceType::CUDAMANAGED => Ok((None, true, true)),
        other => Err(DlpackError::UnsupportedDevice { device_type: other.0, device_id: device.device_id }.into()),
    }
}

/// The import of either ABI; on error `tensor` is dropped, which calls its deleter.
fn import<M: ManagedTensorBase>(tensor: Managed<M>) -> Result<DlpackImport> {
    // SAFETY: `Managed` owns a valid tensor whose metadata stays readable while it lives.
    let header = unsafe { &*tensor.as_ptr() };
    if let Some(version) = header.version()
        && version.major != SUPPORTED_MAJOR
    {
        return Err(DlpackError::UnsupportedVersion { major: version.major, supported: SUPPORTED_MAJOR }.into());
    }
    let read_only = tensor.flags().contains(DlpackFlags::READ_ONLY);
    let described = tensor.validate().map_err(DlpackError::Malformed)?;
    let (device, device_accessible, host_accessible) = placement(described.device())?;
    let dtype = described.dtype();
    if !is_defined(dtype) {
        return Err(DlpackError::UnknownDtype { dtype }.into());
    }
    let element = element_bytes(dtype).ok_or(DlpackError::UnsupportedDtype { dtype })?;
    let shape = described.shape().to_vec();
    let strides = described.strides_or_compact().map_err(DlpackError::Malformed)?.into_owned();
    let overflow = || Error::from(DlpackError::Malformed(dlpark::tensor::Error::DataPointerOverflow));
    let (ptr, size) = match reach(&shape, &strides).map_err(|Unbounded| overflow())? {
        None => (0, 0),
        Some((low, high)) => {
            let bytes = described.num_bytes();
            let data = described.data_ptr() as u64;
            if data == 0 {
                return Err(DlpackError::NullData { bytes }.into());
            }
            // Element `[0, …, 0]` is at data + byte_offset; the buffer starts at the lowest
            // element reached and ends after the highest. Checked: dlpark's validation (a byte
            // count that fits `usize`) keeps these products below 2^127, but the metadata is the
            // producer's, and nothing here should wrap on its word.
            let element = element as i128;
            let origin = i128::from(data) + i128::from(described.byte_offset());
            let start = low.checked_mul(element).and_then(|offset| origin.checked_add(offset)).ok_or_else(overflow)?;
            let end = high
                .checked_add(1)
                .and_then(|past| past.checked_mul(element))
                .and_then(|offset| origin.checked_add(offset))
                .ok_or_else(overflow)?;
            let ptr = u64::try_from(start).map_err(|_| overflow())?;
            let size = usize::try_from(end - start).map_err(|_| overflow())?;
            u64::try_from(end).map_err(|_| overflow())?;
            (ptr, size)
        }
    };
    let device_desc = described.device();
    if size > 0 {
        let known = if device_desc.device_type == DLDeviceType::CUDAHOST { Known::IfKnown } else { Known::Required };
        check_inside_allocation(device, ptr, size, known)?;
    }
    let deleter: Arc<dyn Any + Send + Sync> = Arc::new(tensor.into_deleter());
    let memory = ForeignMemory::default()
        .device(device)
        .device_accessible(device_accessible)
        .host_accessible(host_accessible)
        .keep_alive(deleter);
    // SAFETY: the producer keeps the `size` bytes at `ptr` (every element the tensor reaches)
    // valid until its deleter is called, which the buffer's keep-alive does when the buffer is
    // dropped; the caller of the public constructors vouched for the memory's accessibility
    // and that nothing writes it behind host slices.
    let buffer = unsafe { Buffer::from_raw(ptr, size, memory) };
    Ok(DlpackImport { buffer, shape, strides, dtype, device: device_desc, read_only })
}
