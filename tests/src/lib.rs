//! Cross-crate and multi-process integration tests of the workspace (under `tests/`), the
//! `demo` binary (`cargo xtask demo`), the first thing to run on a new machine, and the `bench`
//! binary (`cargo xtask bench`).
//!
//! The tests run against the `cuda-sim` simulator unless `CUDA_MEM_DRIVER` names a driver
//! library; see [`cuda_sim::testing`]. The binaries choose their driver with [`driver_choice`].

pub mod driver_choice;
