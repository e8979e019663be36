//! [`DlpackTensor`]: an exported versioned DLPack tensor, owned until it is handed to a
//! consumer.

use dlpark::DlpackFlags;
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLTensor};

use crate::device::DevicePtr;
use crate::error::dlpack::describe;

/// An exported DLPack tensor (`DLManagedTensorVersioned`), made by this crate's exports.
///
/// Dropping it calls the deleter, which releases the buffer. Hand it to C or to Python with
/// [`into_raw`](DlpackTensor::into_raw): the consumer then calls the deleter, exactly once. A
/// consumer in Rust takes it with [`DlpackImport::from_dlpack`](crate::DlpackImport::from_dlpack).
pub struct DlpackTensor(dlpark::versioned::Dlpack);

impl DlpackTensor {
    /// A tensor this crate's export finished.
    pub(super) fn new(tensor: dlpark::versioned::Dlpack) -> DlpackTensor {
        DlpackTensor(tensor)
    }

    fn tensor(&self) -> &DLTensor {
        // SAFETY: this crate's export built the descriptor, valid and unchanged until the
        // deleter runs, which only dropping `self` (or a consumer, after `into_raw`) does.
        unsafe { self.0.tensor() }
    }

    /// The pointer to hand to a consumer (C, or a Python capsule named `dltensor_versioned`),
    /// which owns the tensor from then on and calls its deleter once.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        self.0.into_raw()
    }

    /// dlpark's owning handle, for code that works with dlpark's own types.
    pub fn into_inner(self) -> dlpark::versioned::Dlpack {
        self.0
    }

    /// The address of the first element (0 for a tensor of no elements).
    pub fn data_ptr(&self) -> DevicePtr {
        (self.tensor().data as DevicePtr).wrapping_add(self.tensor().byte_offset)
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        self.per_dimension(self.tensor().shape)
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[i64] {
        self.per_dimension(self.tensor().strides)
    }

    /// The `ndim` values at `values` (one of the tensor's arrays); none for a scalar.
    fn per_dimension(&self, values: *mut i64) -> &[i64] {
        match usize::try_from(self.tensor().ndim) {
            // SAFETY: the export wrote `ndim` values into each array, which live with the tensor.
            Ok(ndim) if ndim > 0 && !values.is_null() => unsafe { std::slice::from_raw_parts(values, ndim) },
            _ => &[],
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DLDataType {
        self.tensor().dtype
    }

    /// The DLPack device (type and id).
    pub fn dl_device(&self) -> DLDevice {
        self.tensor().device
    }

    /// The DLPack flags (`READ_ONLY` when the consumer may not write).
    pub fn flags(&self) -> DlpackFlags {
        self.0.flags()
    }
}

/// The device as PyTorch spells it (`cuda:0`), with DLPack's names for host and managed memory.
fn describe_device(device: DLDevice) -> String {
    match device.device_type {
        DLDeviceType::CUDA => format!("cuda:{}", device.device_id),
        DLDeviceType::CUDAHOST => "cuda_host".to_owned(),
        DLDeviceType::CUDAMANAGED => "cuda_managed".to_owned(),
        DLDeviceType::CPU => "cpu".to_owned(),
        DLDeviceType(code) => format!("device-type-{code}:{}", device.device_id),
    }
}

impl From<DlpackTensor> for dlpark::versioned::Dlpack {
    fn from(tensor: DlpackTensor) -> Self {
        tensor.0
    }
}

impl std::fmt::Debug for DlpackTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlpackTensor")
            .field("data", &format_args!("{:#x}", self.data_ptr()))
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("dtype", &format_args!("{}", describe(self.dtype())))
            .field("device", &format_args!("{}", describe_device(self.dl_device())))
            .field("flags", &self.flags())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_read_as_pytorch_names() {
        assert_eq!(describe_device(DLDevice::cuda(1)), "cuda:1");
        assert_eq!(describe_device(DLDevice { device_type: DLDeviceType::CUDAMANAGED, device_id: 0 }), "cuda_managed");
        assert_eq!(describe_device(DLDevice { device_type: DLDeviceType(99), device_id: 2 }), "device-type-99:2");
    }
}
