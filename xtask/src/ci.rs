//! `cargo xtask ci`: the whole CI, in order, stopping at the first failure.
//!
//! 1. `cargo fmt --all --check`
//! 2. `cargo clippy --workspace --all-targets --all-features -- -D warnings` (optional features,
//!    such as `cuda-mem-ipc/vmm` and `tracing`, are checked and tested too), then the same
//!    without `--all-features` (the default features), then each memory crate alone with its
//!    default features (`-p`), as a crate that depends on it builds it
//! 3. `cargo build -p cuda-sim` (the tests load `target/debug/libcuda_sim.so`)
//! 4. fetch the pinned `cuda.h` into `.cuda-header/` (or use `CUDA_HOME`'s), for the layout test
//!    and the bindings check; without network access this step is skipped, saying why
//! 5. `cargo test --workspace --all-features --no-fail-fast` (every test binary runs, even after a failure),
//!    against the simulator: `CUDA_MEM_DRIVER`, `CUDA_MEM_REQUIRE_GPU` and `CUDA_SIM_LIB` are
//!    removed from its environment so that a developer's settings do not redirect it, and
//!    `CUDA_MEM_CUDA_INCLUDE` names the header's folder when there is one
//! 6. no binary links `libcuda` (the driver is loaded at run time)
//! 7. cuda-bindings (the layer under cuda.core) on the simulator, from a private virtual
//!    environment (skipped, saying why, without Python or PyPI)
//! 8. cuda.core sharing pools and buffers with Rust processes on the simulator, both ways, and
//!    cuda.core's DLPack, `copy_batch` and graphs on it (`cargo test -p tests` of the targets in
//!    `python_smoke::PYTHON_TEST_TARGETS`, with `CUDA_MEM_PYTHON` naming the virtual
//!    environment's Python, which has cuda.core; skipped, saying why, without Python or PyPI)
//! 9. `cargo doc --workspace --all-features --no-deps` with `RUSTDOCFLAGS=-Dwarnings`
//! 10. the README's "Platforms" table, on other targets ([`crate::platforms`]): `cargo check` of
//!     the crates that build on Windows, macOS and aarch64 Linux, and the one `compile_error!` of
//!     each Linux-only crate elsewhere (a target whose standard library is not installed is
//!     skipped, saying so)
//! 11. the `cargo xtask bindgen --check` equivalent, when libclang and `cuda.h` can be had
//!     (skipped, saying why, otherwise; it builds xtask again with its `bindgen` feature)
//! 12. `cargo publish --dry-run` of every published crate, each packaged and its package built as
//!     a user would get it (about 45 s warm on two cores); where it fails, `cargo package
//!     --offline` of the same crates (which builds them too, from the local cache): if that
//!     passes, only the registry failed, and the step passes saying so with the cause
//! 13. the declared `rust-version` (MSRV): `cargo +<rust-version> check --workspace --all-targets
//!     --all-features` when rustup has that toolchain (about 2 min the first time, seconds after;
//!     `rustup toolchain install <rust-version> --profile minimal` gets it), otherwise skipped,
//!     saying so: clippy's `incompatible_msrv` lint (on by default, denied by step 2's `-D
//!     warnings`) still refuses standard-library items newer than the manifests' `rust-version`
//!
//! It ends with the time each step took and, last, the summaries `cargo test` printed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{cargo, describe, header, run_command};

/// How a step ended.
pub(crate) enum Outcome {
    Passed,
    /// Passed, with a note for the summary (the test counts).
    PassedWith(String),
    Skipped(String),
    /// Could not run here (a tool is missing), with why and how to get it.
    Unavailable(String),
    Failed(String),
}

/// One step's line in the summary.
pub(crate) struct Record {
    pub(crate) name: &'static str,
    pub(crate) time: Duration,
    pub(crate) outcome: Outcome,
}

/// Runs the subcommand.
pub fn run(workspace: &Path) -> Result<(), String> {
    let mut records = Vec::new();
    let mut summaries = Vec::new();
    let result = run_steps(workspace, &mut records, &mut summaries);
    print_summary("ci", &records, &summaries);
    result
}

/// The steps, each recorded as it ends; returns the first failure.
fn run_steps(workspace: &Path, records: &mut Vec<Record>, summaries: &mut Vec<String>) -> Result<(), String> {
    const TOTAL: usize = 14;
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Result<Outcome, String>| {
        println!("\n==> ci [{}/{TOTAL}] {name}", records.len() + 1);
        let start = Instant::now();
        let outcome = f().unwrap_or_else(Outcome::Failed);
        let failure = match &outcome {
            Outcome::Failed(message) => Some(format!("ci step `{name}` failed: {message}")),
            Outcome::Skipped(reason) | Outcome::Unavailable(reason) => {
                println!("{name} skipped: {reason}");
                None
            }
            Outcome::Passed | Outcome::PassedWith(_) => None,
        };
        records.push(Record { name, time: start.elapsed(), outcome });
        failure.map_or(Ok(()), Err)
    };

    step("fmt", &mut || passed(run_command(cargo(workspace).args(["fmt", "--all", "--check"]))))?;
    step("clippy", &mut || {
        // With every feature, and with none: the optional features (`tracing`'s events expand
        // to nothing without it) must leave no warning either way.
        for features in [&["--all-features"][..], &[]] {
            run_command(
                cargo(workspace)
                    .args(["clippy", "--workspace", "--all-targets"])
                    .args(features)
                    .args(["--", "-D", "warnings"]),
            )?;
        }
        // Each library alone, as a crate depending on it builds it: in the workspace another
        // member turns on its optional features (a test of cuda-mem-core that used `dlpack`
        // ungated built only there).
        for library in LIBRARIES {
            run_command(cargo(workspace).args(["clippy", "-p", library, "--all-targets", "--", "-D", "warnings"]))?;
        }
        Ok(Outcome::Passed)
    })?;
    step("build cuda-sim", &mut || passed(run_command(cargo(workspace).args(["build", "-p", "cuda-sim"]))))?;
    let mut include = None;
    step("fetch cuda.h", &mut || match header::fetch_include_dir(workspace) {
        Ok(dir) => {
            let note = dir.display().to_string();
            include = Some(dir);
            Ok(Outcome::PassedWith(note))
        }
        Err(e) => Ok(Outcome::Skipped(format!(
            "cuda.h not available ({e}; it needs network access to PyPI, or CUDA_HOME): \
             the layout test and the bindings check will skip"
        ))),
    })?;
    step("test", &mut || {
        let mut command = cargo(workspace);
        if let Some(dir) = &include
            && std::env::var_os(cuda_mem_sys_env::CUDA_INCLUDE).is_none()
        {
            command.env(cuda_mem_sys_env::CUDA_INCLUDE, dir);
        }
        command
            .args(["test", "--workspace", "--all-features", "--no-fail-fast"])
            .env_remove(cuda_mem_sys_env::DRIVER)
            .env_remove(cuda_mem_sys_env::REQUIRE_GPU)
            .env_remove(cuda_mem_sys_env::SIM_LIB);
        let (result, lines) = run_collecting_summaries(&mut command);
        *summaries = lines;
        result?;
        Ok(Outcome::PassedWith(count_tests(summaries)))
    })?;
    // `--all-features` above never builds cuda-mem-ipc without `vmm`: the test that a build
    // without it refuses virtual buffers (naming the feature) runs here.
    step("cuda-mem-ipc without features", &mut || {
        let mut command = cargo(workspace);
        command
            .args(["test", "-p", "cuda-mem-ipc", "--test", "without_vmm"])
            .env_remove(cuda_mem_sys_env::DRIVER)
            .env_remove(cuda_mem_sys_env::REQUIRE_GPU)
            .env_remove(cuda_mem_sys_env::SIM_LIB);
        let (result, lines) = run_collecting_summaries(&mut command);
        let counted = count_tests(&lines);
        summaries.extend(lines);
        result?;
        Ok(Outcome::PassedWith(counted))
    })?;
    step("no libcuda link", &mut || no_libcuda_link(workspace))?;
    step("cuda-bindings on the simulator", &mut || match crate::python_smoke::run(workspace) {
        Ok(None) => Ok(Outcome::Passed),
        Ok(Some(reason)) => Ok(Outcome::Skipped(reason)),
        Err(message) => Err(message),
    })?;
    step("cuda.core exchange on the simulator", &mut || {
        let mut command = match crate::python_smoke::exchange_test(workspace)? {
            Ok(command) => command,
            Err(reason) => return Ok(Outcome::Skipped(reason)),
        };
        command
            .env_remove(cuda_mem_sys_env::DRIVER)
            .env_remove(cuda_mem_sys_env::REQUIRE_GPU)
            .env_remove(cuda_mem_sys_env::SIM_LIB);
        let (result, lines) = run_collecting_summaries(&mut command);
        let (passed, failed, _) = totals(&lines);
        let counted = count_tests(&lines);
        // One result line per test target (`PYTHON_TEST_TARGETS`): each must have passed tests.
        let targets_passed = lines.iter().filter(|line| totals(std::slice::from_ref(line)).0 > 0).count();
        summaries.extend(lines);
        result?;
        // The tests skip without the Python; here they must have run.
        if passed == 0 || failed > 0 || targets_passed < crate::python_smoke::PYTHON_TEST_TARGETS.len() {
            return Err(format!(
                "the tests with Python ({}) did not all run and pass: {counted}",
                crate::python_smoke::PYTHON_TEST_TARGETS.join(", ")
            ));
        }
        Ok(Outcome::PassedWith(counted))
    })?;
    step("doc", &mut || {
        let mut flags = std::env::var("RUSTDOCFLAGS").unwrap_or_default();
        flags.push_str(" -Dwarnings");
        passed(run_command(
            cargo(workspace)
                .args(["doc", "--workspace", "--all-features", "--no-deps"])
                .env("RUSTDOCFLAGS", flags.trim()),
        ))
    })?;
    step("other targets", &mut || crate::platforms::check(workspace))?;
    step("bindgen --check", &mut || bindgen_check(workspace, include.is_some()))?;
    step("publish --dry-run", &mut || publish_dry_run(workspace))?;
    step("msrv", &mut || msrv_check(workspace))?;
    Ok(())
}

/// The crates published to crates.io, in the order they can be published.
/// The memory crates, checked each alone with its default features.
const LIBRARIES: &[&str] = &["cuda-mem-core", "cuda-mem-vmm", "cuda-mem-ipc"];

const PUBLISHED: &[&str] = &["cuda-mem-sys", "cuda-sim", "cuda-mem-core", "cuda-mem-vmm", "cuda-mem-ipc"];

/// `cargo publish --dry-run` of every published crate (packaged, then built from the package);
/// where it fails, `cargo package --offline` of them, which packages and builds them the same way
/// without asking crates.io: if that passes, what failed was the registry (unreachable, or an
/// answer of its), and the step passes saying so with the cause; if it fails too, both causes
/// are the step's error.
fn publish_dry_run(workspace: &Path) -> Result<Outcome, String> {
    let packages: Vec<&str> = PUBLISHED.iter().flat_map(|name| ["-p", name]).collect();
    forget_unpacked_packages()?;
    // The packages are built from a temporary registry, whose crates cargo takes to be immutable:
    // it reuses what it built of one of that name and version before without looking at its
    // sources. So the verify builds get a target folder of their own, from which our crates'
    // builds are forgotten each time (the third-party crates stay built).
    let target = workspace.join("target/publish-check");
    forget_built_packages(&target)?;
    // `--allow-dirty`: this checks what the packages hold, not whether the tree is committed.
    let mut command = cargo(workspace);
    command.args(["publish", "--dry-run", "--allow-dirty"]).args(&packages).env("CARGO_TARGET_DIR", &target);
    let output = command.stderr(Stdio::piped()).spawn().and_then(|child| child.wait_with_output());
    let output = output.map_err(|e| format!("cannot run `{}`: {e}", describe(&command)))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    if output.status.success() {
        return Ok(Outcome::PassedWith(format!("{} crates", PUBLISHED.len())));
    }
    // The cause goes into the step's line: a CI log may keep only its last lines.
    let cause = cargo_error(&stderr);
    let why = if is_network_failure(&stderr) { "crates.io cannot be reached" } else { "the dry run failed" };
    println!("{why}: packaging offline instead");
    forget_built_packages(&target)?;
    let mut offline = cargo(workspace);
    offline.args(["package", "--offline", "--allow-dirty"]).args(&packages).env("CARGO_TARGET_DIR", &target);
    match run_command(&mut offline) {
        Ok(()) => Ok(Outcome::PassedWith(format!(
            "{} crates, packaged offline ({why}: {})",
            PUBLISHED.len(),
            cause.lines().next().unwrap_or_default()
        ))),
        Err(offline_error) => Err(format!(
            "`{}` failed ({}):\n{cause}\nand packaging offline failed too: {offline_error}",
            describe(&command),
            output.status
        )),
    }
}

/// Forgets what an earlier dry run built of our packages in `target` (its `.fingerprint`
/// entries, named after the package), so that they are built again from the new packages.
fn forget_built_packages(target: &Path) -> Result<(), String> {
    let fingerprints = target.join("debug/.fingerprint");
    let Ok(entries) = std::fs::read_dir(&fingerprints) else { return Ok(()) };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = PUBLISHED.iter().any(|crate_name| {
            name.strip_prefix(crate_name)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|hash| hash.chars().all(|c| c.is_ascii_hexdigit()))
        });
        if ours {
            std::fs::remove_dir_all(entry.path())
                .map_err(|e| format!("removing the stale {}: {e}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Removes the copies of our packages that an earlier dry run unpacked from its temporary local
/// registry (`target/package/tmp-registry`) under `$CARGO_HOME/registry/src/-<hash>/`: cargo
/// reuses an unpacked copy of the same name and version without comparing its contents, so the
/// next dry run would verify a dependent against the old sources. Only folders of file-URL
/// registries (named `-<hash>`, no host) are touched, never crates.io's.
fn forget_unpacked_packages() -> Result<(), String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    let Some(sources) = cargo_home.map(|home| home.join("registry/src")) else { return Ok(()) };
    let Ok(registries) = std::fs::read_dir(&sources) else { return Ok(()) };
    for registry in registries.filter_map(Result::ok).filter(|r| r.file_name().to_string_lossy().starts_with('-')) {
        let Ok(unpacked) = std::fs::read_dir(registry.path()) else { continue };
        for package in unpacked.filter_map(Result::ok) {
            let name = package.file_name().to_string_lossy().into_owned();
            let ours = PUBLISHED.iter().any(|crate_name| {
                name.strip_prefix(crate_name)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
            });
            if ours {
                std::fs::remove_dir_all(package.path())
                    .map_err(|e| format!("removing the stale {}: {e}", package.path().display()))?;
            }
        }
    }
    Ok(())
}

/// cargo's error and its causes (from its first `error` line), at most 30 lines of them.
fn cargo_error(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let first = lines.iter().position(|line| line.starts_with("error")).unwrap_or(0);
    let last = lines.len().min(first + 30);
    lines[first..last].join("\n")
}

/// Whether cargo's error output says the registry could not be reached, rather than that a
/// package is wrong: cargo's own words for a failed fetch, and curl's for a failed connection
/// (`[6] Could not resolve host`, `[7] Could not connect`, `[28] Timeout was reached`, ...).
fn is_network_failure(stderr: &str) -> bool {
    [
        "failed to query replaced source",
        "Unable to update registry",
        "failed to download",
        "download of ",
        "failed to get successful HTTP response",
        "spurious network error",
        "Couldn't resolve host",
        "Could not resolve",
        "Could not connect",
        "failed to connect",
        "Timeout was reached",
        "SSL connect error",
    ]
    .iter()
    .any(|sign| stderr.contains(sign))
}

/// The workspace's declared `rust-version` (`[workspace.package]` in the root manifest).
fn declared_rust_version(workspace: &Path) -> Result<String, String> {
    let manifest = workspace.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("reading {}: {e}", manifest.display()))?;
    text.lines()
        .find_map(|line| {
            let value = line.trim().strip_prefix("rust-version")?.trim_start().strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| format!("{} declares no rust-version", manifest.display()))
}

/// `cargo check` of the whole workspace on the declared `rust-version`, when rustup has it.
fn msrv_check(workspace: &Path) -> Result<Outcome, String> {
    let version = declared_rust_version(workspace)?;
    let installed = Command::new("rustup")
        .args(["run", &version, "cargo", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !installed {
        return Ok(Outcome::Skipped(format!(
            "Rust {version} (the declared rust-version) is not installed (`rustup toolchain install {version} \
             --profile minimal`); clippy's incompatible_msrv lint (step clippy) still checks the standard \
             library items used"
        )));
    }
    let mut command = Command::new("rustup");
    command
        .current_dir(workspace)
        .args(["run", &version, "cargo", "check", "--workspace", "--all-targets", "--all-features"])
        // The outer cargo's choices name its own toolchain.
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO");
    run_command(&mut command).map(|()| Outcome::PassedWith(format!("Rust {version}")))
}

/// The environment variables the test step removes (named here rather than taken from the
/// crates, which xtask does not depend on).
pub(crate) mod cuda_mem_sys_env {
    /// `cuda_mem_sys::DRIVER_ENV`.
    pub const DRIVER: &str = "CUDA_MEM_DRIVER";
    /// `cuda_sim::testing::REQUIRE_GPU_ENV`.
    pub const REQUIRE_GPU: &str = "CUDA_MEM_REQUIRE_GPU";
    /// `cuda_sim::testing::LIBRARY_ENV`.
    pub const SIM_LIB: &str = "CUDA_SIM_LIB";
    /// Where `cuda-mem-sys`'s layout test finds `cuda.h`.
    pub const CUDA_INCLUDE: &str = "CUDA_MEM_CUDA_INCLUDE";
}

fn passed(result: Result<(), String>) -> Result<Outcome, String> {
    result.map(|()| Outcome::Passed)
}

/// Runs `command`, passing its output through as it comes, and returns, with its result, the
/// lines that announce a test binary (`Running …`, `Doc-tests …`), the `test result:` lines,
/// cargo's `error: test failed, to rerun pass …` lines (a binary that exited non-zero after its
/// tests passed, as a sanitizer's report makes it) and the sanitizers' `SUMMARY: …` lines, in
/// order.
pub(crate) fn run_collecting_summaries(command: &mut Command) -> (Result<(), String>, Vec<String>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let spawned = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return (Err(format!("cannot run `{}`: {e}", describe(command))), Vec::new());
        }
    };
    let stdout = child.stdout.take().map(|out| relay(out, false, Arc::clone(&lines)));
    let stderr = child.stderr.take().map(|err| relay(err, true, Arc::clone(&lines)));
    for relay in [stdout, stderr].into_iter().flatten() {
        let _ = relay.join();
    }
    let status = child.wait();
    let lines = std::mem::take(&mut *lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    let result = match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("`{}` failed ({status})", describe(command))),
        Err(e) => Err(format!("waiting for `{}`: {e}", describe(command))),
    };
    (result, lines)
}

/// Copies `source` to this process's stdout (or stderr) as it arrives, and keeps the summary
/// lines among it.
fn relay(
    source: impl Read + Send + 'static,
    is_stderr: bool,
    keep: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            // Pass partial lines through at once (libtest prints `test x ... ` before running x).
            let chunk = match reader.fill_buf() {
                Ok([]) | Err(_) => break,
                Ok(chunk) => chunk.to_vec(),
            };
            reader.consume(chunk.len());
            let _ = if is_stderr {
                let mut err = std::io::stderr().lock();
                err.write_all(&chunk).and_then(|()| err.flush())
            } else {
                let mut out = std::io::stdout().lock();
                out.write_all(&chunk).and_then(|()| out.flush())
            };
            for byte in chunk {
                if byte == b'\n' {
                    keep_if_summary(&line, &keep);
                    line.clear();
                } else {
                    line.push(byte);
                }
            }
        }
        keep_if_summary(&line, &keep);
    })
}

fn keep_if_summary(line: &[u8], keep: &Mutex<Vec<String>>) {
    let line = String::from_utf8_lossy(line);
    let trimmed = line.trim();
    if trimmed.starts_with("test result:")
        || trimmed.starts_with("Running ")
        || trimmed.starts_with("Doc-tests ")
        || trimmed.starts_with("error: test failed")
        || trimmed.starts_with("SUMMARY: ")
    {
        keep.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line.trim_end().to_string());
    }
}

/// Totals of the `test result:` lines, as "N passed, N failed, N ignored".
pub(crate) fn count_tests(summaries: &[String]) -> String {
    let (passed, failed, ignored) = totals(summaries);
    format!("{passed} passed, {failed} failed, {ignored} ignored")
}

/// Passed, failed and ignored tests over every `test result:` line.
pub(crate) fn totals(summaries: &[String]) -> (u64, u64, u64) {
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in summaries.iter().filter(|l| l.trim_start().starts_with("test result:")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            let Ok(n) = pair[0].parse::<u64>() else {
                continue;
            };
            match pair[1].trim_end_matches([';', ',']) {
                "passed" => passed += n,
                "failed" => failed += n,
                "ignored" => ignored += n,
                _ => {}
            }
        }
    }
    (passed, failed, ignored)
}

/// The binding check, or why it cannot run here.
fn bindgen_check(workspace: &Path, have_header: bool) -> Result<Outcome, String> {
    if !have_header {
        return Ok(Outcome::Skipped("cuda.h not available (see the `fetch cuda.h` step)".to_string()));
    }
    let Some(libclang) = find_libclang() else {
        return Ok(Outcome::Skipped(
            "libclang not found (install libclang-dev, or set LIBCLANG_PATH to its folder)".to_string(),
        ));
    };
    println!("libclang: {}", libclang.display());
    crate::run_bindgen(workspace, true).map(|()| Outcome::Passed)
}

/// A libclang shared library bindgen can load: in `LIBCLANG_PATH`, in the dynamic loader's
/// cache, or in an LLVM installation under `/usr/lib`.
fn find_libclang() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LIBCLANG_PATH") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Some(path);
        }
        if let Some(found) = libclang_in(&path) {
            return Some(found);
        }
    }
    if let Ok(output) = Command::new("ldconfig").arg("-p").stderr(Stdio::null()).output() {
        let listing = String::from_utf8_lossy(&output.stdout);
        // Lines read `\tlibclang-14.so.13 (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-14.so.13`.
        let found = listing.lines().find_map(|line| {
            let name = line.split_whitespace().next()?;
            let path = line.rsplit_once("=> ")?.1.trim();
            is_libclang(name).then(|| PathBuf::from(path))
        });
        if found.is_some() {
            return found;
        }
    }
    let mut llvm_dirs = std::fs::read_dir("/usr/lib").ok()?.filter_map(Result::ok).filter_map(|entry| {
        let name = entry.file_name();
        name.to_string_lossy().starts_with("llvm").then(|| entry.path().join("lib"))
    });
    llvm_dirs.find_map(|dir| libclang_in(&dir))
}

/// The first libclang library in `dir`.
fn libclang_in(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|entry| is_libclang(&entry.file_name().to_string_lossy()))
        .map(|entry| entry.path())
}

/// `libclang.so`, `libclang.so.N`, `libclang-N.so`, `libclang-N.so.M` (not `libclang-cpp`).
fn is_libclang(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("libclang") else {
        return false;
    };
    let Some(at) = rest.find(".so") else {
        return false;
    };
    let (version, suffix) = rest.split_at(at);
    let version_ok = version.is_empty()
        || version
            .strip_prefix('-')
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'));
    version_ok && (suffix == ".so" || suffix.starts_with(".so."))
}

/// Prints, under `==> TITLE summary`, the time each step took and, last, the summaries of
/// `cargo test`.
pub(crate) fn print_summary(title: &str, records: &[Record], summaries: &[String]) {
    println!("\n==> {title} summary");
    for record in records {
        let (status, note) = match &record.outcome {
            Outcome::Passed => ("ok", String::new()),
            Outcome::PassedWith(note) => ("ok", format!(" ({note})")),
            Outcome::Skipped(reason) => ("skipped", format!(": {reason}")),
            Outcome::Unavailable(reason) => ("unavailable", format!(": {reason}")),
            Outcome::Failed(message) => ("FAILED", format!(": {message}")),
        };
        println!("  {:<30} {:>8.1}s  {status}{note}", record.name, record.time.as_secs_f64());
    }
    let total: Duration = records.iter().map(|r| r.time).sum();
    println!("  {:<30} {:>8.1}s", "total", total.as_secs_f64());
    if !summaries.is_empty() {
        println!("\n==> cargo test summaries");
        for line in summaries {
            println!("{line}");
        }
        // The whole run's count, last, in the plain form CI readers look for.
        let (passed, failed, _) = totals(summaries);
        println!("\ntests: {passed} passed, {failed} failed");
    }
}

/// Fails if any built binary or shared library asks the dynamic loader for libcuda: the driver
/// must only ever be opened at run time.
fn no_libcuda_link(workspace: &Path) -> Result<Outcome, String> {
    use std::os::unix::fs::PermissionsExt;
    if Command::new("readelf").arg("--version").output().is_err() {
        return Ok(Outcome::Skipped("readelf is not installed".to_string()));
    }
    let mut checked = 0usize;
    let mut linked = Vec::new();
    for dir in ["target/debug", "target/debug/deps"] {
        let Ok(entries) = std::fs::read_dir(workspace.join(dir)) else { continue };
        for path in entries.filter_map(Result::ok).map(|e| e.path()) {
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            let is_object = path.extension().is_some_and(|e| e == "so") || meta.permissions().mode() & 0o111 != 0;
            if !meta.is_file() || !is_object {
                continue;
            }
            let output = Command::new("readelf").arg("-d").arg(&path).output().map_err(|e| format!("readelf: {e}"))?;
            checked += 1;
            if String::from_utf8_lossy(&output.stdout).lines().any(|l| l.contains("NEEDED") && l.contains("libcuda")) {
                linked.push(path.display().to_string());
            }
        }
    }
    if linked.is_empty() {
        Ok(Outcome::PassedWith(format!("{checked} binaries, none needs libcuda")))
    } else {
        Err(format!("these link against libcuda: {}", linked.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_libclang_names() {
        for name in ["libclang.so", "libclang.so.1", "libclang-14.so", "libclang-14.so.13", "libclang-17.0.6.so"] {
            assert!(is_libclang(name), "{name}");
        }
        for name in ["libclang-cpp.so.14", "libclangBasic.a", "libclang.a", "libclang-14.sox"] {
            assert!(!is_libclang(name), "{name}");
        }
    }

    #[test]
    fn reads_the_declared_rust_version() {
        let version = declared_rust_version(&crate::workspace_root()).expect("the root manifest");
        assert!(version.split('.').all(|part| part.parse::<u32>().is_ok()), "{version}");
    }

    #[test]
    fn tells_network_failures_from_packaging_failures() {
        assert!(is_network_failure("error: failed to query replaced source registry `crates-io`"));
        assert!(!is_network_failure("error: failed to verify package tarball\nerror[E0432]: unresolved import"));
        // cargo's words for an index that answers 503, and what it printed here with connections refused.
        assert!(is_network_failure(
            "error: failed to get `libc` as a dependency of package `cuda-sim v0.1.0`\n\nCaused by:\n  \
             download of li/bc/libc failed\n\nCaused by:\n  failed to get successful HTTP response from \
             `https://index.crates.io/li/bc/libc`, got 503"
        ));
        assert!(is_network_failure(
            "error: download of config.json failed\n\nCaused by:\n  [7] Could not connect to server (Failed to \
             connect to 127.0.0.1 port 1 after 1 ms: Could not connect to server)"
        ));
    }

    #[test]
    fn a_cargo_error_is_kept_from_its_first_error_line() {
        let stderr = "   Compiling a v0.1.0\n   Verifying b v0.1.0\nerror: failed to verify package tarball\n\nCaused by:\n  no space";
        assert_eq!(cargo_error(stderr), "error: failed to verify package tarball\n\nCaused by:\n  no space");
        assert_eq!(cargo_error("no error line"), "no error line");
    }

    #[test]
    fn totals_the_test_result_lines() {
        let lines = [
            "     Running unittests src/lib.rs (target/debug/deps/a-1)".to_string(),
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s".to_string(),
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out".to_string(),
        ];
        assert_eq!(count_tests(&lines), "5 passed, 1 failed, 1 ignored");
    }
}
