//! Cross-crate and multi-process integration tests of the workspace (under `tests/`), and the
//! `demo` binary (`cargo xtask demo`), the first thing to run on a new machine.
//!
//! The tests run against the `cuda-sim` simulator unless `CUDA_MEM_DRIVER` names a driver
//! library; see [`cuda_sim::testing`].
