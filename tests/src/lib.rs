//! Cross-crate and multi-process integration tests of the workspace (under `tests/`), the
//! `demo` binary (`cargo xtask demo`), the first thing to run on a new machine, the `bench`
//! binary (`cargo xtask bench`), and the `probe` binary (`cargo xtask probe`), which asks the
//! driver what its documentation leaves open.
//!
//! The tests run against the `cuda-sim` simulator unless `CUDA_MEM_DRIVER` names a driver
//! library; see [`cuda_sim::testing`]. The binaries choose their driver with [`driver_choice`] and
//! write their files where [`output`] says; [`child_process`] watches the children they start,
//! and [`errors`] prints their errors.

pub mod child_process;
pub mod driver_choice;
pub mod errors;
pub mod output;
