//! `cargo xtask`: the project's automation.
//!
//! - `cargo xtask demo [ARGS…]`: build the simulator and run the demo (on the real driver when
//!   there is a GPU, on the simulator otherwise).
//! - `cargo xtask probe [NAMES…]`: build the simulator and ask the driver the questions its
//!   documentation leaves open (on the real driver when there is a GPU, beside the simulator's
//!   answers; on the simulator otherwise), writing `target/probe/probe.json`.
//! - `cargo xtask bench`: build the simulator and run the benchmarks (release), writing
//!   `target/bench/`.
//! - `cargo xtask snapshot-view SNAPSHOT.json [PAGE.html] [--torch OUT.pickle]`: a memory
//!   snapshot as the viewer's page (and as the pickle PyTorch's memory viewer opens).
//! - `cargo xtask ci`: the whole CI: fmt, shellcheck, clippy, build, tests, docs, other targets,
//!   binding check, cargo-deny, the published crates' dry run, the MSRV and the lowest versions
//!   the manifests allow (the steps are listed in [`ci`]).
//! - `cargo xtask platforms`: the README's "Platforms" table checked on other targets (`cargo
//!   check`; part of `ci`).
//! - `cargo xtask gpu-test [--out DIR]`: build the bundle that runs the test suite on a GPU
//!   machine without Rust.
//! - `cargo xtask bindgen [--check]`: regenerate (or verify) the committed `cuda-mem-sys` bindings.
//!   The generator (bindgen, syn) is behind xtask's `bindgen` feature, so that the other
//!   commands do not compile it: without the feature, this command runs xtask again with it.
//! - `cargo xtask sanitize [--miri] [--asan] [--tsan] [--valgrind] [--install]`: the tests under
//!   Miri, AddressSanitizer, ThreadSanitizer and valgrind (not part of `ci`).

mod bench;
#[cfg(feature = "bindgen")]
mod bindgen;
mod ci;
mod compare;
mod demo;
// Used by the generator only; its tests run in every build.
#[cfg(any(feature = "bindgen", test))]
mod doxygen;
mod gpu_test;
mod header;
mod platforms;
mod python_smoke;
mod sanitize;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workspace = workspace_root();
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("bench") if rest.is_empty() => bench::run(&workspace, false),
        Some("bench") if rest == ["--compare"] => bench::run(&workspace, true),
        Some("bindgen") if rest.is_empty() => run_bindgen(&workspace, false),
        Some("bindgen") if rest == ["--check"] => run_bindgen(&workspace, true),
        Some("ci") if rest.is_empty() => ci::run(&workspace),
        Some("platforms") if rest.is_empty() => platforms::run(&workspace),
        Some("demo") => demo::run(&workspace, "demo", rest),
        Some("probe") => demo::run(&workspace, "probe", rest),
        Some("snapshot-view") if !rest.is_empty() => snapshot_view(&workspace, rest),
        Some("gpu-test") => gpu_test::run(&workspace, rest),
        Some("sanitize") => sanitize::run(&workspace, rest),
        // Inside a GPU bundle, run by its `run.sh`: BUNDLE RESULTS.
        Some("compare-bundle") if rest.len() == 2 => {
            compare::compare(&compare::Setup::in_bundle(Path::new(&rest[0]), Path::new(&rest[1])))
        }
        Some("help" | "--help" | "-h") => {
            println!("{}", usage());
            Ok(())
        }
        _ => Err(usage()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    "usage: cargo xtask <command>\n\
     \n\
     commands:\n  \
       bench [--compare]     build the simulator, then run the benchmarks in release (results in target/bench/);\n                             --compare also runs cuda.core's equivalents on the same driver\n                             (and case 1 of both on a nearly free stand-in driver)\n  \
       demo [ARGS...]        build the simulator, then run the demo (real GPU if found, else the simulator)\n  \
       probe [NAMES...]      build the simulator, then ask the driver the open questions (same choice of\n                             driver; report in target/probe/probe.json)\n  \
       snapshot-view SNAPSHOT.json [PAGE.html] [--torch OUT.pickle]\n                             a memory snapshot (MemorySnapshot::write_json) as the viewer's page and SVG;\n                             --torch also writes the pickle pytorch.org/memory_viz opens\n  \
       ci                    fmt, shellcheck, clippy, build, test, doc, other targets, the bindings check, cargo\n                             deny, publish --dry-run, MSRV and minimal versions, stopping at the first failure\n  \
       platforms             check the README's Platforms table on Windows, macOS and aarch64 Linux (cargo check;\n                             targets not installed are skipped: `rustup target add` them)\n  \
       gpu-test [--out DIR]  build the GPU test bundle (default: gpu-bundle/); run it with `bash DIR/run.sh`\n  \
       bindgen [--check]     regenerate (or check) cuda-sys/src/generated from cuda.h\n  \
       sanitize [--miri] [--asan] [--tsan] [--valgrind] [--install]\n                             \
     the tests under Miri (pure modules), AddressSanitizer and ThreadSanitizer (core, ipc\n                             \
     and vmm on the simulator) and valgrind; by default every one that can run here.\n                             \
     Needs the nightly toolchain (Miri: components miri and rust-src; TSan: rust-src);\n                             \
     --install gets what is missing with rustup. Not part of ci."
        .to_string()
}

/// `cargo xtask snapshot-view SNAPSHOT.json [PAGE.html] [--torch OUT.pickle]`: runs the
/// integration package's `snapshot-view` binary, which writes the viewer's page (and the
/// timeline's SVG, and with `--torch` PyTorch's pickle) for a snapshot.
fn snapshot_view(workspace: &Path, args: &[String]) -> Result<(), String> {
    run_command(cargo(workspace).args(["run", "-q", "-p", INTEGRATION, "--bin", "snapshot-view", "--"]).args(args))
        .map_err(|e| format!("snapshot-view failed: {e}"))
}

/// The package (in `tests/`) that holds the cross-crate and multi-process integration tests, the
/// demo, the benchmarks and the probe.
pub const INTEGRATION: &str = "cuda-mem-integration";

/// The workspace root, found from this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `cargo xtask bindgen [--check]`: here, when xtask was built with its `bindgen` feature.
#[cfg(feature = "bindgen")]
fn run_bindgen(workspace: &Path, check: bool) -> Result<(), String> {
    bindgen::run(workspace, check)
}

/// `cargo xtask bindgen [--check]`: xtask again, built with its `bindgen` feature (bindgen and
/// syn are left out of the default build, which every other command uses).
#[cfg(not(feature = "bindgen"))]
fn run_bindgen(workspace: &Path, check: bool) -> Result<(), String> {
    println!("building xtask with its bindings generator (bindgen, syn; first time: about a minute)…");
    let mut command = cargo(workspace);
    command.args(["run", "--quiet", "--package", "xtask", "--features", "bindgen", "--", "bindgen"]);
    if check {
        command.arg("--check");
    }
    run_command(&mut command)
}

/// Parses one JSON document (a line of cargo's `--message-format=json`, the benchmarks'
/// results).
fn parse_json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
}

/// A `cargo` command run from the workspace root, with the cargo that runs xtask.
fn cargo(workspace: &Path) -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(program);
    command.current_dir(workspace);
    command
}

/// The command line of `command`, for messages.
fn describe(command: &Command) -> String {
    let program =
        Path::new(command.get_program()).file_name().unwrap_or(command.get_program()).to_string_lossy().into_owned();
    std::iter::once(program)
        .chain(command.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Creates `dir` and the folders above it, as needed.
fn create_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// Runs `command` with the terminal's standard streams and fails unless it exits with 0.
fn run_command(command: &mut Command) -> Result<(), String> {
    let status = command.status().map_err(|e| format!("cannot run `{}`: {e}", describe(command)))?;
    if status.success() { Ok(()) } else { Err(format!("`{}` failed ({status})", describe(command))) }
}
