//! [`Access`]: what a device (or the host) may do with memory, the driver's
//! `CUmemAccess_flags` as a Rust enum. Pools report and set it per device (`cuMemPoolGetAccess`,
//! `cuMemPoolSetAccess`); the virtual memory resource sets it on every mapping
//! (`cuMemSetAccess`).

use cuda_mem_sys::types::CUmemAccess_flags;

/// The access a location (a device, or the host) has to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read and write (`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`).
    ReadWrite,
    /// Read only (`CU_MEM_ACCESS_FLAGS_PROT_READ`).
    Read,
    /// None (`CU_MEM_ACCESS_FLAGS_PROT_NONE`).
    None,
}

impl Access {
    /// The driver's flags for this access.
    pub fn raw(self) -> CUmemAccess_flags {
        match self {
            Access::ReadWrite => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            Access::Read => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            Access::None => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        }
    }

    /// The access the driver's flags grant. A value `cuda.h` does not define grants nothing
    /// this crate can name, so it reads as [`Access::None`]: never more access than is known.
    pub fn from_raw(flags: CUmemAccess_flags) -> Access {
        match flags {
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE => Access::ReadWrite,
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ => Access::Read,
            _ => Access::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_access_is_its_driver_flags_and_back() {
        for (access, flags) in [
            (Access::ReadWrite, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
            (Access::Read, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ),
            (Access::None, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE),
        ] {
            assert_eq!(access.raw(), flags);
            assert_eq!(Access::from_raw(flags), access);
        }
    }

    #[test]
    fn flags_cuda_h_does_not_define_grant_nothing() {
        assert_eq!(Access::from_raw(CUmemAccess_flags(2)), Access::None);
        assert_eq!(Access::from_raw(CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_MAX), Access::None);
    }
}
