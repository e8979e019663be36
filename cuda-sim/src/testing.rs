//! Helpers for test suites: pick the driver a test runs against, and declare skips.
//!
//! Tests run against the simulator by default, through the same `dlopen` path as the real
//! driver: [`driver()`] opens `libcuda_sim.so` (which cargo builds next to every test binary of
//! a crate that has `cuda-sim` as a dev-dependency). When `CUDA_MEM_DRIVER` names a library (on
//! a GPU machine: `libcuda.so.1`), that library is used instead.
//!
//! A test that needs what the machine lacks (two GPUs, the simulator's fault injection) calls
//! [`skip`], which prints a `SKIP-DECLARED` line with the reason. With `CUDA_MEM_REQUIRE_GPU=1`
//! (set by the GPU bundle's run script) a skip is a failure instead, so nothing passes silently.

use std::path::PathBuf;

use cuda_sys::{Driver, LoadError};

/// The file name of the simulator library.
pub const LIBRARY_NAME: &str = "libcuda_sim.so";

/// Environment variable naming the simulator library explicitly.
pub const LIBRARY_ENV: &str = "CUDA_SIM_LIB";

/// Environment variable that turns declared skips into failures.
pub const REQUIRE_GPU_ENV: &str = "CUDA_MEM_REQUIRE_GPU";

/// Where the simulator library is: `CUDA_SIM_LIB`, or `libcuda_sim.so` beside the running
/// executable or in its parent folder (cargo puts test binaries in `target/<profile>/deps/`).
pub fn library_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(LIBRARY_ENV) {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    let beside_exe = exe.ancestors().skip(1).take(3).map(|dir| dir.join(LIBRARY_NAME));
    // Doc tests run from a temporary folder: look in this workspace's target folder too.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let in_target = ["debug/deps", "debug", "release/deps", "release"].map(|dir| target.join(dir).join(LIBRARY_NAME));
    beside_exe.chain(in_target).find(|candidate| candidate.is_file())
}

/// Whether the tests run on the simulator (no `CUDA_MEM_DRIVER` set).
pub fn on_simulator() -> bool {
    std::env::var_os(cuda_sys::DRIVER_ENV).is_none()
}

/// The driver the tests use, installed as the process-wide driver so that code under test that
/// calls [`cuda_sys::driver()`] gets the same one.
///
/// # Errors
/// When the simulator library cannot be found or either library cannot be opened.
pub fn driver() -> Result<&'static Driver, LoadError> {
    if !on_simulator() {
        return cuda_sys::driver();
    }
    if let Some(driver) = cuda_sys::installed_driver() {
        return Ok(driver);
    }
    let path = library_path().ok_or_else(|| LoadError::Library {
        path: PathBuf::from(LIBRARY_NAME),
        reason: format!(
            "the simulator library was not found beside the test binary; build it with \
             `cargo build -p cuda-sim` or set {LIBRARY_ENV}"
        ),
    })?;
    // SAFETY: the library is this crate's simulator, which exports every driver function it
    // has with the signature and the documented behaviour of `cuda.h`.
    let opened = unsafe { Driver::open(&path) }?;
    match cuda_sys::install_driver(opened) {
        Ok(driver) => Ok(driver),
        // Another thread installed one first: use that one.
        Err(_) => cuda_sys::installed_driver().ok_or(LoadError::NotADriver { path }),
    }
}

/// Whether a check of the simulator's own model applies here: on a real driver it does not (the
/// test should return). Unlike [`skip`], this is not a missing capability, so it never fails the
/// run, even with `CUDA_MEM_REQUIRE_GPU=1`; it says so on stderr.
pub fn simulator_only(what: &str) -> bool {
    if on_simulator() {
        return true;
    }
    eprintln!("NOT-APPLICABLE on a real driver: {what}");
    false
}

/// Declares that the calling test cannot run here, and why. Returns normally (the test should
/// then return) unless `CUDA_MEM_REQUIRE_GPU=1`, where it panics so the run fails.
pub fn skip(reason: &str) {
    if std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1") {
        panic!("test cannot run here and {REQUIRE_GPU_ENV}=1: {reason}");
    }
    eprintln!("SKIP-DECLARED: {reason}");
}

/// Environment variable that marks a child process spawned by [`in_simulated_machine`].
pub const CHILD_ENV: &str = "CUDA_SIM_TEST_CHILD";

pub use crate::config::VISIBLE_DEVICES_ENV;

/// Runs `body` on a simulated machine configured by `env` (`CUDA_SIM_DEVICES`, …), which must
/// be set before the simulator initializes: on the simulator, the test binary re-runs itself
/// (spawn and exec, never fork) for just the test named `test_name` (its full path as libtest
/// prints it) with `env` set, and fails if the child fails. `CUDA_VISIBLE_DEVICES` is cleared
/// in the child unless `env` sets it, so that one inherited from the environment (a job
/// scheduler's, meant for real GPUs) does not hide simulated devices. On a real driver `body`
/// runs in this process (it should check for the hardware it needs and call [`skip`]), one such
/// body at a time: on the simulator each has a process of its own, and tests that count the
/// process's descriptors or reserve the addresses next to a buffer must not interleave with
/// other tests there either.
pub fn in_simulated_machine(test_name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).is_ok_and(|name| name == test_name) {
        body();
        return;
    }
    if !on_simulator() {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        // A body that panicked (a failed test) poisons the lock; the next one runs all the same.
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        body();
        return;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("cannot find the test binary: {e}"));
    let output = std::process::Command::new(exe)
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test_name)
        .env_remove(VISIBLE_DEVICES_ENV)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot spawn the child for {test_name}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child for {test_name} with {env:?} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

/// Counts of the simulator's live objects (`cuSimLiveObjects`), for checking that nothing
/// leaks: compare before and after.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveObjects {
    /// VMM address reservations.
    pub reservations: u64,
    /// VMM mappings.
    pub mappings: u64,
    /// VMM physical allocations.
    pub physical_allocations: u64,
    /// Pools other than the default ones.
    pub pools: u64,
    /// Allocations (device, pinned, managed, registered, pool).
    pub allocations: u64,
}

/// The simulator's live objects now, asked of the loaded simulator library.
///
/// # Errors
/// When the driver is not the simulator, or the call fails.
pub fn live_objects(driver: &Driver) -> Result<LiveObjects, cuda_sys::CudaError> {
    let address = driver.library_symbol(c"cuSimLiveObjects")?;
    // SAFETY: the simulator exports `cuSimLiveObjects` with this signature.
    let f = unsafe {
        std::mem::transmute::<
            *const std::ffi::c_void,
            unsafe extern "C" fn(*mut LiveObjects) -> cuda_sys::types::CUresult,
        >(address)
    };
    let mut out = LiveObjects::default();
    // SAFETY: `out` is a valid out-pointer.
    let code = unsafe { f(&mut out) };
    driver.check("cuSimLiveObjects", code)?;
    Ok(out)
}

/// Makes the `nth` next call of `function` in the loaded simulator fail with
/// `CUDA_ERROR_OUT_OF_MEMORY` (the simulator's fault injection, armed at run time).
///
/// # Errors
/// When the driver is not the simulator, or the call fails.
pub fn inject_failure(driver: &Driver, function: &std::ffi::CStr, nth: u32) -> Result<(), cuda_sys::CudaError> {
    let address = driver.library_symbol(c"cuSimInjectFailure")?;
    // SAFETY: the simulator exports `cuSimInjectFailure` with this signature.
    let f = unsafe {
        std::mem::transmute::<
            *const std::ffi::c_void,
            unsafe extern "C" fn(*const std::ffi::c_char, u32) -> cuda_sys::types::CUresult,
        >(address)
    };
    // SAFETY: `function` is NUL-terminated.
    let code = unsafe { f(function.as_ptr(), nth) };
    driver.check("cuSimInjectFailure", code)?;
    Ok(())
}
