//! Helpers for test suites: pick the driver a test runs against, and declare skips.
//!
//! Tests run against the simulator by default, through the same `dlopen` path as the real
//! driver: [`driver()`] opens `libcuda_sim.so` (which cargo builds next to every test binary of
//! a crate that has `cuda-sim` as a dev-dependency). When `CUDA_MEM_DRIVER` names a library (on
//! a GPU machine: `libcuda.so.1`), that library is used instead; where that library is itself the
//! simulator, the tests still know they run on it ([`on_simulator`]).
//!
//! A test that needs what the machine lacks (two GPUs, the simulator's fault injection) calls
//! [`skip`], which prints a `SKIP-DECLARED` line with the reason. With `CUDA_MEM_REQUIRE_GPU=1`
//! (set by the GPU bundle's run script) a skip is a failure instead, so nothing passes silently.
//!
//! Failure paths are tested as a matrix: [`count_calls`] runs a path once and says which driver
//! functions it called and how often; then [`CallCounts::injections`] names every one of those
//! calls, and [`run_failing`] runs the path again with that call failing (and says whether it
//! fired). Compare [`live_objects`] (and [`open_fds`]) before and after each; a failure of a
//! function that frees something ([`is_releasing`]) may leave what it would have freed.

mod gate;

use std::path::PathBuf;

use cuda_mem_sys::types::CUresult;
use cuda_mem_sys::{Driver, LoadError};

pub use gate::{Gate, OpenOnDrop, wait_for_gate};

/// The file name of the simulator library.
pub const LIBRARY_NAME: &str = "libcuda_sim.so";

/// Environment variable naming the simulator library explicitly.
pub const LIBRARY_ENV: &str = "CUDA_SIM_LIB";

/// Environment variable that turns declared skips into failures.
pub const REQUIRE_GPU_ENV: &str = "CUDA_MEM_REQUIRE_GPU";

/// Where the simulator library is: `CUDA_SIM_LIB`, or the simulator `CUDA_MEM_DRIVER` names
/// (see [`on_simulator`]), or `libcuda_sim.so` of this build (the nearest other one where there is
/// none, for [`driver()`] to refuse) beside the running
/// executable or in its parent folder (cargo puts test binaries in `target/<profile>/deps/`),
/// else (doc tests run from a temporary folder) in this workspace's target folder, which may
/// hold an older build: the one picked there is named on stderr, and [`driver()`] refuses a
/// library whose build id ([`crate::BUILD_ID`]) is not this build's.
pub fn library_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(LIBRARY_ENV) {
        return Some(PathBuf::from(path));
    }
    // The simulator `CUDA_MEM_DRIVER` names is the one loaded: links to it (`libcuda_dir`) must
    // reach that file, or a library loading `libcuda.so` would get a second, separate machine.
    if driver_env_names_simulator() {
        return std::env::var_os(cuda_mem_sys::DRIVER_ENV).map(PathBuf::from);
    }
    let exe = std::env::current_exe().ok()?;
    let existing = |candidates: Vec<PathBuf>| candidates.into_iter().filter(|c| c.is_file()).collect::<Vec<_>>();
    let beside_exe = existing(exe.ancestors().skip(1).take(3).map(|dir| dir.join(LIBRARY_NAME)).collect());
    // Doc tests run from a temporary folder: look in this workspace's target folder too.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let in_target = existing(
        ["debug/deps", "debug", "release/deps", "release"].map(|dir| target.join(dir).join(LIBRARY_NAME)).to_vec(),
    );
    // This build's simulator first: a folder above a doc test's temporary one (the system's
    // temporary folder) may hold a stray library of another build.
    if let Some(found) = beside_exe.iter().find(|candidate| is_this_build(candidate)) {
        return Some(found.clone());
    }
    if let Some(found) = in_target.iter().find(|candidate| is_this_build(candidate)) {
        eprintln!("cuda-sim: no {LIBRARY_NAME} beside the test binary; using {}", found.display());
        return Some(found.clone());
    }
    // None of this build: the nearest, which `driver()` refuses, naming its build id.
    beside_exe.into_iter().chain(in_target).next()
}

/// Whether the library at `path` holds this build's id ([`crate::BUILD_ID`], which the
/// simulator reports from a constant of its own): cheaper than opening it, and opening a library
/// runs its initializers.
fn is_this_build(path: &std::path::Path) -> bool {
    let id = crate::BUILD_ID.as_bytes();
    std::fs::read(path).is_ok_and(|bytes| bytes.windows(id.len()).any(|window| window == id))
}

/// Whether the tests run on the simulator: no `CUDA_MEM_DRIVER` set, or it names a simulator
/// library (one that answers `cuSimBuildId`, as a GPU bundle run against its own simulator
/// does). A test then checks the simulator's model and runs in a simulated machine of its own.
pub fn on_simulator() -> bool {
    std::env::var_os(cuda_mem_sys::DRIVER_ENV).is_none() || driver_env_names_simulator()
}

/// Whether `CUDA_MEM_DRIVER` is set and names a simulator library (asked once, of the library
/// loaded).
fn driver_env_names_simulator() -> bool {
    static NAMES_SIMULATOR: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NAMES_SIMULATOR.get_or_init(|| {
        std::env::var_os(cuda_mem_sys::DRIVER_ENV).is_some() && cuda_mem_sys::driver().is_ok_and(is_simulator)
    })
}

/// Whether `driver` is the simulator with its controls shown: it answers `cuSimBuildId`, which a
/// real driver lacks and a simulator with hidden controls ([`HIDE_CONTROLS_ENV`]) refuses, so
/// that a rehearsal takes a real driver's paths everywhere.
pub fn is_simulator(driver: &Driver) -> bool {
    build_id(driver).is_ok()
}

/// The driver the tests use, installed as the process-wide driver so that code under test that
/// calls [`cuda_mem_sys::driver()`] gets the same one.
///
/// # Errors
/// When the simulator library cannot be found or either library cannot be opened.
pub fn driver() -> Result<&'static Driver, LoadError> {
    // The library `CUDA_MEM_DRIVER` names, be it a real driver or a simulator.
    if std::env::var_os(cuda_mem_sys::DRIVER_ENV).is_some() {
        return cuda_mem_sys::driver();
    }
    if let Some(driver) = cuda_mem_sys::installed_driver() {
        return Ok(driver);
    }
    let path = library_path()
        .ok_or_else(|| LoadError::LibraryNotFound { path: PathBuf::from(LIBRARY_NAME), env: LIBRARY_ENV })?;
    // SAFETY: the library is this crate's simulator, which exports every driver function it
    // has with the signature and the documented behaviour of `cuda.h`.
    let opened = unsafe { Driver::open(&path) }?;
    check_build(&opened, &path)?;
    match cuda_mem_sys::install_driver(opened) {
        Ok(driver) => Ok(driver),
        // Another thread installed one first: use that one.
        Err(_) => cuda_mem_sys::installed_driver().ok_or(LoadError::NotADriver { path }),
    }
}

/// Refuses a simulator library built from other sources than this crate (a stale build in a
/// shared target folder, or one from another checkout): its behaviour is not what the tests of
/// this build expect, and the failures it causes would point nowhere near the cause.
fn check_build(driver: &Driver, path: &std::path::Path) -> Result<(), LoadError> {
    let found = build_id(driver).ok();
    if found.as_deref() == Some(crate::BUILD_ID) {
        return Ok(());
    }
    Err(LoadError::BuildMismatch { path: path.to_path_buf(), found, expected: crate::BUILD_ID, env: LIBRARY_ENV })
}

/// The build id a simulator library reports (`cuSimBuildId`).
fn build_id(driver: &Driver) -> Result<String, cuda_mem_sys::CudaError> {
    // SAFETY: the simulator exports `cuSimBuildId` with this signature.
    let f =
        unsafe { control::<unsafe extern "C" fn(*mut *const std::ffi::c_char) -> CUresult>(driver, c"cuSimBuildId") }?;
    let mut id = std::ptr::null();
    // SAFETY: `id` is valid for a write.
    let code = unsafe { f(&mut id) };
    driver.check("cuSimBuildId", code)?;
    if id.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the simulator writes a pointer to a static NUL-terminated string.
    Ok(unsafe { std::ffi::CStr::from_ptr(id) }.to_string_lossy().into_owned())
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

pub use crate::api::sim::HIDE_CONTROLS_ENV;
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
        // The parent checks for this line: a child that ran another test never prints it.
        println!("\n{}", child_ran(test_name));
        return;
    }
    // libtest names each test's thread after the test: a name that is not this test's would
    // re-run another test (or none) in the child, and this body never.
    if let Some(running) = std::thread::current().name().filter(|&name| name != "main")
        && running != test_name
    {
        panic!(
            "in_simulated_machine was given the name {test_name:?}, but the test running is {running:?}: \
             pass the test's own path as libtest prints it"
        );
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
        output.status.success() && stdout.contains("test result: ok. 1 passed"),
        "child for {test_name} with {env:?} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.lines().any(|line| line == child_ran(test_name)),
        "the child for {test_name:?} did not run this body: is {test_name:?} the test's own path as \
         libtest prints it?\n{stdout}\n{stderr}"
    );
}

/// The environment variable the dynamic loader searches first for a library named without a
/// path.
const LOADER_PATH_ENV: &str = "LD_LIBRARY_PATH";

/// A folder where `libcuda.so` and `libcuda.so.1` link to the simulator library ([`library_path`]):
/// put it first in `LD_LIBRARY_PATH` and a library that loads the driver by name (cudarc does)
/// loads the simulator. It is `libcuda-links/` beside the simulator; the links are replaced
/// atomically, so concurrent test processes can make it at once.
///
/// # Errors
/// When the simulator is not found, or the folder or a link cannot be made.
pub fn libcuda_dir() -> std::io::Result<PathBuf> {
    let not_found = || std::io::Error::new(std::io::ErrorKind::NotFound, format!("no {LIBRARY_NAME} was found"));
    let library = std::fs::canonicalize(library_path().ok_or_else(not_found)?)?;
    let dir = library.parent().ok_or_else(not_found)?.join("libcuda-links");
    std::fs::create_dir_all(&dir)?;
    // A temporary name of this call's own (threads of one process make links at once too).
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for name in ["libcuda.so", "libcuda.so.1"] {
        let temporary = dir.join(format!(".{name}.{}.{call}", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(&library, &temporary)?;
        std::fs::rename(&temporary, dir.join(name))?;
    }
    Ok(dir)
}

/// Runs `body` where a library that loads the driver by name (`libcuda.so`, as cudarc does) gets
/// the same driver as [`driver()`], so both see the same memory: on the simulator, in a child
/// process (as [`in_simulated_machine`], with `test_name` the test's own path) whose
/// `LD_LIBRARY_PATH` starts with [`libcuda_dir`] (the loader reads it only at start-up); on a real
/// driver, here.
///
/// # Panics
/// When the links cannot be made, or the child fails.
pub fn with_simulator_as_libcuda(test_name: &str, body: impl FnOnce()) {
    with_simulator_as_libcuda_on(test_name, &[], body);
}

/// [`with_simulator_as_libcuda`] on a simulated machine configured by `env` (`CUDA_SIM_DEVICES`,
/// …), as [`in_simulated_machine`] configures it.
///
/// # Panics
/// When the links cannot be made, or the child fails.
pub fn with_simulator_as_libcuda_on(test_name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if !on_simulator() || std::env::var(CHILD_ENV).is_ok_and(|name| name == test_name) {
        return in_simulated_machine(test_name, env, body);
    }
    let dir = libcuda_dir().unwrap_or_else(|e| panic!("cannot link the simulator as libcuda.so: {e}"));
    let mut search = std::ffi::OsString::from(dir);
    if let Some(inherited) = std::env::var_os(LOADER_PATH_ENV).filter(|path| !path.is_empty()) {
        search.push(":");
        search.push(inherited);
    }
    let search = search.into_string().unwrap_or_else(|path| panic!("a library path that is not UTF-8: {path:?}"));
    let mut env = env.to_vec();
    env.push((LOADER_PATH_ENV, &search));
    in_simulated_machine(test_name, &env, body);
}

/// The line a child prints once the body of `test_name` has run in it.
fn child_ran(test_name: &str) -> String {
    format!("{CHILD_ENV}: ran the body of {test_name}")
}

/// Counts of the simulator's live objects (`cuSimLiveObjects`), for checking that nothing
/// leaks: compare before and after. Defined with the control that fills it.
pub use crate::api::sim::LiveObjects;

/// The simulator's live objects now, asked of the loaded simulator library.
///
/// # Errors
/// When the driver is not the simulator, or the call fails.
pub fn live_objects(driver: &Driver) -> Result<LiveObjects, cuda_mem_sys::CudaError> {
    // SAFETY: the simulator exports `cuSimLiveObjects` with this signature.
    let f = unsafe { control::<unsafe extern "C" fn(*mut LiveObjects) -> CUresult>(driver, c"cuSimLiveObjects") }?;
    let mut out = LiveObjects::default();
    // SAFETY: `out` is a valid out-pointer.
    let code = unsafe { f(&mut out) };
    driver.check("cuSimLiveObjects", code)?;
    Ok(out)
}

/// How many file descriptors this process has open (entries of `/proc/self/fd`, counted the
/// same way each time: the one listing them included), for checking that nothing leaks one.
///
/// # Panics
/// When `/proc/self/fd` cannot be listed (not Linux, or no `/proc`).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd can be listed").count()
}

/// Makes the `nth` next call of `function` in the loaded simulator fail with
/// `CUDA_ERROR_OUT_OF_MEMORY` (the simulator's fault injection, armed at run time).
///
/// # Errors
/// When the driver is not the simulator, or the call fails.
pub fn inject_failure(driver: &Driver, function: &std::ffi::CStr, nth: u32) -> Result<(), cuda_mem_sys::CudaError> {
    // SAFETY: the simulator exports `cuSimInjectFailure` with this signature.
    let f = unsafe {
        control::<unsafe extern "C" fn(*const std::ffi::c_char, u32) -> CUresult>(driver, c"cuSimInjectFailure")
    }?;
    // SAFETY: `function` is NUL-terminated.
    let code = unsafe { f(function.as_ptr(), nth) };
    driver.check("cuSimInjectFailure", code)?;
    Ok(())
}

/// The functions the loader calls on its own (resolving entry points, naming errors), which no
/// path of the library makes: a [`CallCounts`] leaves them out, so they are never failed on
/// purpose (a failed resolution would stay cached for the life of the process).
pub const LOADER_FUNCTIONS: &[&str] =
    &["cuGetProcAddress", "cuGetProcAddress_v2", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString"];

/// The driver functions that free, destroy, unmap or release something: when one of them is
/// refused, what it would have let go of stays, and the refusal must be returned or recorded.
pub const RELEASING_FUNCTIONS: &[&str] = &[
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeHost",
    "cuMemHostUnregister",
    "cuMemPoolDestroy",
    "cuStreamDestroy_v2",
    "cuEventDestroy_v2",
    "cuMemRelease",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuDevicePrimaryCtxRelease_v2",
];

/// Whether `function` frees, destroys, unmaps or releases something (see [`RELEASING_FUNCTIONS`]).
pub fn is_releasing(function: &str) -> bool {
    RELEASING_FUNCTIONS.contains(&function)
}

/// How many calls of each driver function a stretch of code made (those it made at least once,
/// in the order the simulator lists its exports; [`LOADER_FUNCTIONS`] left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts(Vec<(&'static str, u32)>);

impl CallCounts {
    /// The calls of `function`.
    pub fn of(&self, function: &str) -> u32 {
        self.0.iter().find(|(name, _)| *name == function).map_or(0, |&(_, n)| n)
    }

    /// Each function called, with its number of calls.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u32)> + '_ {
        self.0.iter().copied()
    }

    /// Every call, each an [`Injection`] that fails it: call 1 to n of each function.
    pub fn injections(&self) -> impl Iterator<Item = Injection> + '_ {
        self.iter().flat_map(|(function, n)| (1..=n).map(move |nth| Injection { function, nth }))
    }

    /// The number of calls made in all.
    pub fn total(&self) -> u32 {
        self.0.iter().map(|&(_, n)| n).sum()
    }
}

/// One injected failure: the `nth` call of `function` (counted from when it is armed) fails
/// with `CUDA_ERROR_OUT_OF_MEMORY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injection {
    /// The driver function.
    pub function: &'static str,
    /// Which of its calls fails, from 1.
    pub nth: u32,
}

impl Injection {
    /// Whether the failed call frees, destroys, unmaps or releases something.
    pub fn is_releasing(&self) -> bool {
        is_releasing(self.function)
    }
}

impl std::fmt::Display for Injection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "call {} of {} failing", self.nth, self.function)
    }
}

/// The simulator's control `name`, with the signature `F`.
///
/// # Safety
/// The simulator exports `name` with the signature `F` (a function pointer type).
unsafe fn control<F: Copy>(driver: &Driver, name: &'static std::ffi::CStr) -> Result<F, cuda_mem_sys::CudaError> {
    let address = driver.library_symbol(name)?;
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of_val(&address));
    // SAFETY: the caller guarantees the symbol has the signature `F`, a function pointer as
    // large as the address.
    Ok(unsafe { std::mem::transmute_copy::<*const std::ffi::c_void, F>(&address) })
}

/// Starts counting every driver call from zero (`true`), or stops counting, keeping the counts.
fn set_counting(driver: &Driver, on: bool) -> Result<(), cuda_mem_sys::CudaError> {
    // SAFETY: the simulator exports `cuSimCountCalls` with this signature.
    let f = unsafe { control::<unsafe extern "C" fn(u32) -> CUresult>(driver, c"cuSimCountCalls") }?;
    // SAFETY: takes a plain value.
    let code = unsafe { f(u32::from(on)) };
    driver.check("cuSimCountCalls", code)?;
    Ok(())
}

/// The calls of `function` counted since counting last started.
fn counted(driver: &Driver, function: &str) -> Result<u32, cuda_mem_sys::CudaError> {
    // SAFETY: the simulator exports `cuSimCallCount` with this signature.
    let f = unsafe {
        control::<unsafe extern "C" fn(*const std::ffi::c_char, *mut u32) -> CUresult>(driver, c"cuSimCallCount")
    }?;
    let name = std::ffi::CString::new(function).unwrap_or_default();
    let mut count = 0;
    // SAFETY: a NUL-terminated name and a valid out-pointer.
    let code = unsafe { f(name.as_ptr(), &mut count) };
    driver.check("cuSimCallCount", code)?;
    Ok(count)
}

/// The counts since counting last started, of every function the simulator exports.
fn read_counts(driver: &Driver) -> Result<CallCounts, cuda_mem_sys::CudaError> {
    let mut counts = Vec::new();
    for (name, _) in crate::exports::table() {
        let per_thread = name.ends_with("_ptsz") || name.ends_with("_ptds");
        if per_thread || name.starts_with("cuSim") || LOADER_FUNCTIONS.contains(&name) {
            continue;
        }
        let n = counted(driver, name)?;
        if n > 0 {
            counts.push((name, n));
        }
    }
    Ok(CallCounts(counts))
}

/// Runs `path` and counts the driver calls it makes (on the simulator; calls other threads make
/// meanwhile count too). Run it once first if it retains things once per process (contexts,
/// cached properties, resolved entry points), so that the count is that of every later run.
///
/// # Errors
/// When the driver is not the simulator.
pub fn count_calls<R>(driver: &Driver, path: impl FnOnce() -> R) -> Result<(R, CallCounts), cuda_mem_sys::CudaError> {
    set_counting(driver, true)?;
    let out = path();
    set_counting(driver, false)?;
    Ok((out, read_counts(driver)?))
}

/// The simulator's live objects now ([`live_objects`]) where the tests run on it; `None` on a real
/// driver, which does not count its objects, so that a comparison of two such values (mapped
/// alike) holds there trivially while the rest of the test still runs.
///
/// # Panics
/// When the simulator cannot report them.
pub fn live_objects_if_simulated() -> Option<LiveObjects> {
    on_simulator().then(|| {
        let driver = driver().unwrap_or_else(|e| panic!("the test driver does not load: {e}"));
        live_objects(driver).unwrap_or_else(|e| panic!("the simulator does not report its live objects: {e}"))
    })
}

/// Runs `path`, counting its driver calls where the driver is the simulator ([`on_simulator`]);
/// on a real driver, which counts nothing, `path` runs uncounted and every check of the counts
/// holds, so the rest of a test (what it asserts of the outcome) still runs there. Run it once
/// first, as for [`count_calls`].
///
/// # Panics
/// When the simulator cannot count.
pub fn count_calls_if_simulated<R>(path: impl FnOnce() -> R) -> (R, CountedIfSimulated) {
    if !on_simulator() {
        return (path(), CountedIfSimulated(None));
    }
    let driver = driver().unwrap_or_else(|e| panic!("the test driver does not load: {e}"));
    let (out, counts) = count_calls(driver, path).unwrap_or_else(|e| panic!("the simulator cannot count calls: {e}"));
    (out, CountedIfSimulated(Some(counts)))
}

/// The driver calls [`count_calls_if_simulated`] counted: the simulator's counts, or none on a
/// real driver, where each check holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedIfSimulated(Option<CallCounts>);

impl CountedIfSimulated {
    /// The counts, where they were counted.
    pub fn counts(&self) -> Option<&CallCounts> {
        self.0.as_ref()
    }

    /// Asserts that `function` was called `expected` times, where calls were counted.
    ///
    /// # Panics
    /// When it was not.
    #[track_caller]
    pub fn assert_calls(&self, function: &str, expected: u32, what: &str) {
        if let Some(counts) = &self.0 {
            assert_eq!(counts.of(function), expected, "calls of {function}: {what}: {counts:?}");
        }
    }

    /// Asserts that `expected` calls were made in all, where calls were counted.
    ///
    /// # Panics
    /// When they were not.
    #[track_caller]
    pub fn assert_total(&self, expected: u32, what: &str) {
        if let Some(counts) = &self.0 {
            assert_eq!(counts.total(), expected, "calls in all: {what}: {counts:?}");
        }
    }
}

/// Runs `path` with `injection` armed, and says whether it fired (whether `path` made that
/// call): a path that makes other calls than the ones counted is not deterministic, and a
/// failure that did not fire would stay armed for whatever comes next, so check it.
///
/// # Errors
/// When the driver is not the simulator.
pub fn run_failing<R>(
    driver: &Driver,
    injection: Injection,
    path: impl FnOnce() -> R,
) -> Result<(R, bool), cuda_mem_sys::CudaError> {
    let name = std::ffi::CString::new(injection.function).unwrap_or_default();
    set_counting(driver, true)?;
    inject_failure(driver, &name, injection.nth)?;
    let out = path();
    set_counting(driver, false)?;
    Ok((out, counted(driver, injection.function)? >= injection.nth))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_builds_simulator_is_told_from_another_builds() {
        let library = library_path().expect("the simulator is built");
        assert!(is_this_build(&library), "{} is not of this build: `cargo build -p cuda-sim` first", library.display());
        let id = crate::BUILD_ID.as_bytes();
        let mut other = std::fs::read(&library).unwrap();
        let mut at = 0;
        while let Some(found) = other[at..].windows(id.len()).position(|window| window == id) {
            other[at + found..at + found + id.len()].fill(b'0');
            at += found + id.len();
        }
        assert!(at > 0, "the build id is in the library");
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(LIBRARY_NAME);
        std::fs::write(&stale, other).unwrap();
        assert!(!is_this_build(&stale));
        assert!(!is_this_build(&dir.path().join("missing.so")));
    }
}
