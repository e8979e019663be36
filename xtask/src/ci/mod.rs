//! `cargo xtask ci`: the whole CI, in order, stopping at the first failure.
//!
//! The steps are the rows of [`STEPS`]:
//!
//! 1. `cargo fmt --all --check`
//! 2. `shellcheck` of the repository's shell scripts (`.ci/run`, the GPU bundle's `run.sh`);
//!    skipped, saying so, without shellcheck
//! 3. `cargo clippy --workspace --all-targets --all-features -- -D warnings` (optional features,
//!    such as `cuda-mem-ipc/vmm` and `tracing`, are checked and tested too), then the same
//!    without `--all-features` (the default features), then each memory crate alone with its
//!    default features (`-p`), as a crate that depends on it builds it
//! 4. `cargo build -p cuda-sim` (the tests load `target/debug/libcuda_sim.so`)
//! 5. fetch the pinned `cuda.h` into `.cuda-header/` (or use `CUDA_HOME`'s), for the layout test
//!    and the bindings check; without network access this step is skipped, saying why
//! 6. `cargo test --workspace --all-features --no-fail-fast` (every test binary runs, even after
//!    a failure), against the simulator: `CUDA_MEM_DRIVER`, `CUDA_MEM_REQUIRE_GPU` and
//!    `CUDA_SIM_LIB` are removed from its environment so that a developer's settings do not
//!    redirect it, and `CUDA_MEM_CUDA_INCLUDE` names the header's folder when there is one
//! 7. the numbered examples the crate docs point to ([`EXAMPLES`]), each run on the simulator
//!    (`cargo run -p <crate> --example <name>`)
//! 8. cuda-mem-ipc's test of a build without its `vmm` feature
//! 9. no binary links `libcuda` (the driver is loaded at run time)
//! 10. cuda-bindings (the layer under cuda.core) on the simulator, from a private virtual
//!     environment (skipped, saying why, without Python or PyPI)
//! 11. cuda.core sharing pools and buffers with Rust processes on the simulator, both ways, and
//!     cuda.core's DLPack, `copy_batch` and graphs on it (`cargo test` of the targets in
//!     `python_smoke::PYTHON_TEST_TARGETS`, with `CUDA_MEM_PYTHON` naming the virtual
//!     environment's Python, which has cuda.core; skipped, saying why, without Python or PyPI)
//! 12. `cargo doc --workspace --all-features --no-deps` with `RUSTDOCFLAGS=-Dwarnings`
//! 13. the README's "Platforms" table, on other targets ([`crate::platforms`]): `cargo check` of
//!     the crates that build on Windows, macOS and aarch64 Linux, and the one `compile_error!` of
//!     each Linux-only crate elsewhere (a target whose standard library is not installed is
//!     skipped, saying so)
//! 14. the `cargo xtask bindgen --check` equivalent, when libclang and `cuda.h` can be had
//!     (skipped, saying why, otherwise; it builds xtask again with its `bindgen` feature)
//! 15. `cargo deny check` against `deny.toml` (licences, duplicate versions, sources,
//!     advisories) where cargo-deny is installed; advisories are skipped, saying so, where the
//!     RustSec database cannot be fetched
//! 16. `cargo publish --dry-run` of every published crate, each packaged and its package built as
//!     a user would get it (about 45 s warm on two cores); where it fails, `cargo package
//!     --offline` of the same crates (which builds them too, from the local cache): if that
//!     passes, only the registry failed, and the step passes saying so with the cause
//! 17. the declared `rust-version` (MSRV): `cargo +<rust-version> check --workspace --all-targets
//!     --all-features` when rustup has that toolchain (about 2 min the first time, seconds after;
//!     `rustup toolchain install <rust-version> --profile minimal` gets it), otherwise skipped,
//!     saying so: clippy's `incompatible_msrv` lint (on by default, denied by step 3's `-D
//!     warnings`) still refuses standard-library items newer than the manifests' `rust-version`
//! 18. the lowest versions the manifests allow: `cargo +nightly update -Z
//!     direct-minimal-versions` in a copy of the workspace, then `cargo check` of it (skipped,
//!     saying so, without a nightly toolchain)
//!
//! It ends with the time each step took and, last, the summaries `cargo test` printed. The test
//! steps run libtest with `--show-output`, read (not shown) what each passed test printed, and
//! count a test that only printed SKIP (it could not run here) as skipped, not passed
//! ([`test_output`]).

mod bindings;
mod deny;
mod linking;
mod publish;
mod report;
mod test_output;
mod toolchains;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub(crate) use report::{Outcome, Record, print_summary};
pub(crate) use test_output::{SHOW_OUTPUT, Summary, count_tests, run_collecting_summaries};

use crate::{cargo, header, run_command};

/// What the steps share as they run.
struct Ci<'a> {
    workspace: &'a Path,
    /// `cuda.h`'s folder, once the `fetch cuda.h` step has it.
    include: Option<PathBuf>,
    /// What the test steps' `cargo test` printed that the summary keeps, printed last.
    summary: Summary,
}

/// A step: how it ended, or why it failed.
type Step = fn(&mut Ci) -> Result<Outcome, String>;

/// The steps, in the order they run (the module's documentation says what each does).
const STEPS: &[(&str, Step)] = &[
    ("fmt", fmt),
    ("shellcheck", shellcheck),
    ("clippy", clippy),
    ("build cuda-sim", build_simulator),
    ("fetch cuda.h", fetch_header),
    ("test", test),
    ("examples", run_examples),
    ("cuda-mem-ipc without features", ipc_without_features),
    ("no libcuda link", |ci| linking::no_libcuda_link(ci.workspace)),
    ("cuda-bindings on the simulator", cuda_bindings),
    ("cuda.core exchange on the simulator", cuda_core_exchange),
    ("doc", doc),
    ("other targets", |ci| crate::platforms::check(ci.workspace)),
    ("bindgen --check", |ci| bindings::bindgen_check(ci.workspace, ci.include.is_some())),
    ("deny", |ci| deny::deny(ci.workspace)),
    ("publish --dry-run", |ci| publish::publish_dry_run(ci.workspace)),
    ("msrv", |ci| toolchains::msrv_check(ci.workspace)),
    ("minimal versions", |ci| toolchains::minimal_versions(ci.workspace)),
];

/// Runs the subcommand.
pub fn run(workspace: &Path) -> Result<(), String> {
    let mut ci = Ci { workspace, include: None, summary: Summary::default() };
    let mut records = Vec::new();
    let result = run_steps(&mut ci, &mut records);
    print_summary("ci", &records, &ci.summary);
    result
}

/// Runs [`STEPS`] in order, each recorded as it ends; stops at the first failure and returns it.
fn run_steps(ci: &mut Ci, records: &mut Vec<Record>) -> Result<(), String> {
    for (number, &(name, step)) in STEPS.iter().enumerate() {
        println!("\n==> ci [{}/{}] {name}", number + 1, STEPS.len());
        let start = Instant::now();
        let outcome = step(ci).unwrap_or_else(Outcome::Failed);
        let failure = match &outcome {
            Outcome::Failed(message) => Some(format!("ci step `{name}` failed: {message}")),
            Outcome::Skipped(reason) | Outcome::Unavailable(reason) => {
                println!("{name} skipped: {reason}");
                None
            }
            Outcome::Passed | Outcome::PassedWith(_) => None,
        };
        records.push(Record { name, time: start.elapsed(), outcome });
        if let Some(failure) = failure {
            return Err(failure);
        }
    }
    Ok(())
}

/// The memory crates, checked each alone with its default features.
const LIBRARIES: &[&str] = &["cuda-mem-core", "cuda-mem-vmm", "cuda-mem-ipc"];

fn fmt(ci: &mut Ci) -> Result<Outcome, String> {
    passed(run_command(cargo(ci.workspace).args(["fmt", "--all", "--check"])))
}

/// With every feature, and with none: the optional features (`tracing`'s events expand to
/// nothing without it) must leave no warning either way. Then each library alone, as a crate
/// depending on it builds it: in the workspace another member turns on its optional features (a
/// test of cuda-mem-core that used `dlpack` ungated built only there).
fn clippy(ci: &mut Ci) -> Result<Outcome, String> {
    for features in [&["--all-features"][..], &[]] {
        run_command(
            cargo(ci.workspace)
                .args(["clippy", "--workspace", "--all-targets"])
                .args(features)
                .args(["--", "-D", "warnings"]),
        )?;
    }
    for library in LIBRARIES {
        run_command(cargo(ci.workspace).args(["clippy", "-p", library, "--all-targets", "--", "-D", "warnings"]))?;
    }
    Ok(Outcome::Passed)
}

/// The repository's shell scripts: CI's entry point and the GPU bundle's `run.sh`.
const SHELL_SCRIPTS: &[&str] = &[".ci/run", "xtask/gpu-bundle/run.sh"];

fn shellcheck(ci: &mut Ci) -> Result<Outcome, String> {
    if Command::new("shellcheck").arg("--version").output().is_err() {
        return Ok(Outcome::Skipped("shellcheck is not installed (`apt-get install shellcheck`)".to_string()));
    }
    passed(run_command(Command::new("shellcheck").current_dir(ci.workspace).args(SHELL_SCRIPTS)))
}

fn build_simulator(ci: &mut Ci) -> Result<Outcome, String> {
    passed(run_command(cargo(ci.workspace).args(["build", "-p", "cuda-sim"])))
}

fn fetch_header(ci: &mut Ci) -> Result<Outcome, String> {
    match header::fetch_include_dir(ci.workspace) {
        Ok(dir) => {
            let note = dir.display().to_string();
            ci.include = Some(dir);
            Ok(Outcome::PassedWith(note))
        }
        Err(e) => Ok(Outcome::Skipped(format!(
            "cuda.h not available ({e}; it needs network access to PyPI, or CUDA_HOME): \
             the layout test and the bindings check will skip"
        ))),
    }
}

/// `cargo test` of the whole workspace on the simulator, `cuda.h`'s folder named when there is one.
fn test(ci: &mut Ci) -> Result<Outcome, String> {
    let mut command = cargo(ci.workspace);
    if let Some(dir) = &ci.include
        && std::env::var_os(cuda_mem_sys_env::CUDA_INCLUDE).is_none()
    {
        command.env(cuda_mem_sys_env::CUDA_INCLUDE, dir);
    }
    command.args(["test", "--workspace", "--all-features", "--no-fail-fast", "--", SHOW_OUTPUT]);
    let (result, summary) = run_collecting_summaries(on_the_simulator(&mut command));
    let counted = count_tests(&summary);
    ci.summary.extend(summary);
    result?;
    Ok(Outcome::PassedWith(counted))
}

/// The numbered examples the crate docs point to: package, example, the features it needs.
const EXAMPLES: &[(&str, &str, &[&str])] = &[
    ("cuda-mem-core", "01_allocate_and_copy", &[]),
    ("cuda-mem-core", "02_pools_and_attributes", &[]),
    ("cuda-mem-ipc", "03_share_over_ipc", &[]),
    ("cuda-mem-vmm", "04_grow_a_vmm_buffer", &[]),
    ("cuda-mem-core", "05_dlpack_and_cudarc", &["dlpack", "cudarc"]),
    ("cuda-mem-vmm", "06_sleep_and_wake", &[]),
    ("cuda-mem-ipc", "07_serve_workers", &["tokio"]),
];

/// Runs every example of [`EXAMPLES`] on the simulator: a walk-through that no longer runs is a
/// failure, as a test's.
fn run_examples(ci: &mut Ci) -> Result<Outcome, String> {
    for (package, example, features) in EXAMPLES {
        let mut command = cargo(ci.workspace);
        command.args(["run", "-p", package, "--example", example]);
        if !features.is_empty() {
            command.args(["--features", &features.join(",")]);
        }
        run_command(on_the_simulator(&mut command)).map_err(|e| format!("example {example} of {package}: {e}"))?;
    }
    Ok(Outcome::PassedWith(format!("{} examples ran", EXAMPLES.len())))
}

/// `--all-features` never builds cuda-mem-ipc without `vmm`: the test that a build without it
/// refuses virtual buffers (naming the feature) runs here.
fn ipc_without_features(ci: &mut Ci) -> Result<Outcome, String> {
    let mut command = cargo(ci.workspace);
    command.args(["test", "-p", "cuda-mem-ipc", "--test", "without_vmm", "--", SHOW_OUTPUT]);
    let (result, summary) = run_collecting_summaries(on_the_simulator(&mut command));
    let counted = count_tests(&summary);
    ci.summary.extend(summary);
    result?;
    Ok(Outcome::PassedWith(counted))
}

fn cuda_bindings(ci: &mut Ci) -> Result<Outcome, String> {
    match crate::python_smoke::run(ci.workspace)? {
        None => Ok(Outcome::Passed),
        Some(reason) => Ok(Outcome::Skipped(reason)),
    }
}

/// The tests with Python beside Rust; they skip without the Python, and here they must have run:
/// each target of `PYTHON_TEST_TARGETS` with passed tests and none skipped, none failed.
fn cuda_core_exchange(ci: &mut Ci) -> Result<Outcome, String> {
    let mut command = match crate::python_smoke::exchange_test(ci.workspace)? {
        Ok(command) => command,
        Err(reason) => return Ok(Outcome::Skipped(reason)),
    };
    command.args(["--", SHOW_OUTPUT]);
    let (result, summary) = run_collecting_summaries(on_the_simulator(&mut command));
    let counted = count_tests(&summary);
    let all_ran = summary.binaries.iter().filter(|b| b.passed > 0 && b.skipped == 0).count();
    let total = summary.total();
    ci.summary.extend(summary);
    result?;
    if total.passed == 0 || total.failed > 0 || all_ran < crate::python_smoke::PYTHON_TEST_TARGETS.len() {
        return Err(format!(
            "the tests with Python ({}) did not all run and pass: {counted}",
            crate::python_smoke::PYTHON_TEST_TARGETS.join(", ")
        ));
    }
    // The server example with its fourth worker, the Python one (the examples step ran it with
    // the three Rust workers only).
    let python = command.get_envs().find(|(k, _)| *k == crate::python_smoke::PYTHON_ENV).and_then(|(_, v)| v);
    let python = python.ok_or("the exchange test's command names no Python")?.to_os_string();
    let mut example = cargo(ci.workspace);
    example.args(["run", "-p", "cuda-mem-ipc", "--features", "tokio", "--example", "07_serve_workers"]);
    example.env(crate::python_smoke::PYTHON_ENV, &python);
    let output = on_the_simulator(&mut example).output().map_err(|e| format!("running example 07: {e}"))?;
    let printed = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !printed.contains("worker 0x44:") {
        return Err(format!(
            "example 07_serve_workers with the Python worker failed ({}):\n{printed}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    print!("{printed}");
    Ok(Outcome::PassedWith(format!("{counted}; example 07 served three Rust workers and a Python one")))
}

fn doc(ci: &mut Ci) -> Result<Outcome, String> {
    let mut flags = std::env::var("RUSTDOCFLAGS").unwrap_or_default();
    flags.push_str(" -Dwarnings");
    passed(run_command(
        cargo(ci.workspace)
            .args(["doc", "--workspace", "--all-features", "--no-deps"])
            .env("RUSTDOCFLAGS", flags.trim()),
    ))
}

/// `command` with what would send tests to another driver than the simulator removed, so that a
/// developer's settings do not redirect them.
fn on_the_simulator(command: &mut Command) -> &mut Command {
    command
        .env_remove(cuda_mem_sys_env::DRIVER)
        .env_remove(cuda_mem_sys_env::REQUIRE_GPU)
        .env_remove(cuda_mem_sys_env::SIM_LIB)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shell_scripts_checked_are_there() {
        for script in SHELL_SCRIPTS {
            assert!(crate::workspace_root().join(script).is_file(), "{script}");
        }
    }

    #[test]
    fn every_numbered_example_is_run() {
        let root = crate::workspace_root();
        let mut found = Vec::new();
        for package in ["cuda-mem-core", "cuda-mem-ipc", "cuda-mem-vmm"] {
            let Ok(entries) = std::fs::read_dir(root.join(package).join("examples")) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().trim_end_matches(".rs").to_string();
                if name.starts_with(|c: char| c.is_ascii_digit()) {
                    found.push((package, name));
                }
            }
        }
        found.sort();
        let mut listed: Vec<(&str, String)> = EXAMPLES.iter().map(|(p, e, _)| (*p, (*e).to_string())).collect();
        listed.sort();
        assert_eq!(found, listed, "EXAMPLES lists every numbered example, and nothing else");
    }

    #[test]
    fn the_steps_have_distinct_names() {
        let mut names: Vec<&str> = STEPS.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), STEPS.len());
    }
}
