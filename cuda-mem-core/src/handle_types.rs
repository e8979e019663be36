//! Shareable handle types, as a typed set of flags.

use cuda_sys::types::CUmemAllocationHandleType as T;

bitflags::bitflags! {
    /// Kinds of OS handle a pool or allocation can be exported as
    /// (`CUmemAllocationHandleType`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct HandleTypes: u32 {
        /// A POSIX file descriptor (Linux).
        const POSIX_FD = T::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
        /// A Windows NT handle.
        const WIN32 = T::CU_MEM_HANDLE_TYPE_WIN32.0;
        /// A Windows KMT handle.
        const WIN32_KMT = T::CU_MEM_HANDLE_TYPE_WIN32_KMT.0;
        /// A fabric handle (multi-node NVLink).
        const FABRIC = T::CU_MEM_HANDLE_TYPE_FABRIC.0;
    }
}

impl HandleTypes {
    /// The driver's representation.
    pub fn raw(self) -> T {
        T(self.bits())
    }
}
