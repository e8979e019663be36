//! `cargo xtask gpu-test [--out DIR]`: builds the bundle that runs the test suite on a GPU
//! machine that has no Rust.
//!
//! Every test binary of the workspace that holds tests (but the simulator's own and xtask's,
//! which test nothing a GPU changes), the probe, the demo and the benchmarks (`bench`) are built
//! in release, stripped of debug information (not of symbols), and packed into `payload.tar.xz`
//! in DIR (default `gpu-bundle/` at the workspace root, ignored by git), beside a `run.sh` (the
//! file `xtask/gpu-bundle/run.sh`, which says what it does) and the simulator library. So are
//! xtask itself; under `compare/`, what the comparison with cuda.core needs there (its script,
//! the two helper libraries, and wheels of cuda.core for the machine's Python, which cannot reach
//! PyPI); and the workspace's Python files, for the tests that run cuda.core's side beside ours
//! (on the GPU machine the workspace is not at hand). The folder must fit what can be carried
//! (64 MiB); unpacked, the binaries would not.
//!
//! Carried to the GPU machine, `bash DIR/run.sh` unpacks the archive into a temporary folder (xz
//! and tar, or python3) and runs the probe first (the open driver questions, answered beside the
//! simulator's, which lies in the bundle; `probe.json` and `probe-simulator.json` in the
//! results), then the rest against `libcuda.so.1` with `CUDA_MEM_REQUIRE_GPU=1`, then the
//! comparison (`xtask compare-bundle`). It writes each one's output under `${RESULTS:-./results}`
//! (the benchmarks' and the comparison's files under `bench/` there), and prints a line per binary
//! and the totals. `PARTS` picks the parts (default `probe tests demo bench compare`).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{INTEGRATION, cargo, create_dir, describe};
use serde_json::Value;

/// The largest bundle that can be carried to the GPU machine.
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// Packages whose tests are left out of the bundle.
const EXCLUDED: [&str; 2] = ["cuda-sim", "xtask"];

/// The simulator library's file name (`cuda_sim::testing::LIBRARY_NAME`).
const SIMULATOR: &str = "libcuda_sim.so";

/// The archive in the bundle that holds everything but `run.sh`, the manifest and the simulator.
const PAYLOAD: &str = "payload.tar.xz";

/// The folder in the bundle where the archive's contents are gathered before packing.
const PAYLOAD_DIR: &str = ".payload";

/// The first line of every `run.sh`, which marks a folder as a bundle this command may replace.
const MARKER: &str = "# cuda-mem GPU test bundle";

/// One binary built for the bundle.
struct Artifact {
    /// The file name it gets in the bundle.
    name: String,
    /// Where cargo put it.
    path: PathBuf,
}

/// What the bundle is built from: the test binaries, the programs carried beside them (each with
/// its name in the payload), the `dlpack_ffi` library and the simulator library.
struct Built {
    tests: Vec<Artifact>,
    programs: Vec<(&'static str, PathBuf)>,
    dlpack_ffi: PathBuf,
    simulator: Option<PathBuf>,
}

/// Runs the subcommand.
pub fn run(workspace: &Path, args: &[String]) -> Result<(), String> {
    let out = parse_args(workspace, args)?;
    prepare_dir(&out)?;
    let built = build_all(workspace)?;
    // Everything but the simulator goes into a compressed archive, which `run.sh` unpacks into
    // a temporary folder: the binaries, uncompressed, are over what can be carried.
    let payload = out.join(PAYLOAD_DIR);
    let tests = fill_payload(workspace, &payload, &built)?;
    let wheels = pack_comparison(workspace, &payload.join("compare"))?;
    let unpacked = dir_size(&payload)?;
    pack_payload(&payload, &out.join(PAYLOAD))?;
    std::fs::remove_dir_all(&payload).map_err(|e| format!("removing {}: {e}", payload.display()))?;
    // Outside the archive, so that the bundle's programs can be tried on the simulator
    // (`CUDA_MEM_DRIVER=DIR/libcuda_sim.so`); `run.sh` copies it beside the unpacked test
    // binaries' folder, where `cuda_sim::testing::library_path` looks, for the tests that
    // exercise the loader against the simulator explicitly.
    if let Some(simulator) = &built.simulator {
        copy(simulator, &out.join(SIMULATOR))?;
    }
    write_executable(&out.join("run.sh"), run_script())?;
    write_manifest(&out, &tests, built.simulator.is_some(), wheels.is_some())?;
    // What is carried: the folder as it is now, the archive packed.
    let size = dir_size(&out)?;
    if size > MAX_BUNDLE_BYTES {
        return Err(format!("the bundle at {} is {:.1} MiB, over the 64 MiB limit", out.display(), mib(size)));
    }
    let comparison = wheels
        .map_or_else(String::new, |w| format!(" and the comparison with cuda.core ({:.1} MiB of wheels)", mib(w)));
    println!(
        "\nGPU test bundle: {} ({} test binaries, the probe, the demo, the benchmarks{comparison}; {:.1} MiB, \
         {:.1} MiB unpacked)",
        out.display(),
        tests.len(),
        mib(size),
        mib(unpacked)
    );
    for test in &tests {
        println!("  tests/{}", test.name);
    }
    if built.simulator.is_some() {
        println!("  {SIMULATOR}");
    }
    println!("Carry it to the GPU machine and run `bash {}/run.sh`.", relative(workspace, &out).display());
    Ok(())
}

/// `bytes` in mebibytes.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Builds everything the bundle carries, in release.
fn build_all(workspace: &Path) -> Result<Built, String> {
    let messages = build_tests(workspace)?;
    let mut tests: Vec<Artifact> = messages.iter().filter(|m| is_test_artifact(m)).filter_map(artifact).collect();
    tests.sort_by(|a, b| a.name.cmp(&b.name));
    if tests.is_empty() {
        return Err("cargo built no test binaries".to_string());
    }
    let simulator = messages.iter().find_map(simulator_library);
    let mut programs = Vec::new();
    for (package, name) in [(INTEGRATION, "probe"), (INTEGRATION, "demo"), (INTEGRATION, "bench"), ("xtask", "xtask")] {
        programs.push((name, build_binary(workspace, package, name)?));
    }
    // The C library the DLPack test loads into cuda.core's Python process (built by the test
    // itself where cargo is at hand; the GPU machine has none).
    let dlpack_ffi = build_target(workspace, INTEGRATION, "dlpack_ffi", Target::CdylibExample)?;
    Ok(Built { tests, programs, dlpack_ffi, simulator })
}

/// Gathers in `payload` the test binaries that hold tests, the programs, the `dlpack_ffi`
/// library and the workspace's Python files; returns the test binaries carried.
fn fill_payload<'a>(workspace: &Path, payload: &Path, built: &'a Built) -> Result<Vec<&'a Artifact>, String> {
    let tests_dir = payload.join("tests");
    create_dir(&tests_dir)?;
    let mut carried = Vec::new();
    for test in &built.tests {
        if holds_tests(&test.path)? {
            copy(&test.path, &tests_dir.join(&test.name))?;
            carried.push(test);
        } else {
            println!("left out (it holds no tests): {}", test.name);
        }
    }
    for (name, path) in &built.programs {
        copy(path, &payload.join(name))?;
    }
    copy_python_sources(workspace, &payload.join(PYTHON_SOURCES_DIR))?;
    create_dir(&payload.join("examples"))?;
    copy(&built.dlpack_ffi, &payload.join("examples").join(DLPACK_FFI))?;
    Ok(carried)
}

/// What the comparison with cuda.core needs, in `dir`; returns the size of its wheels, or
/// `None` (said as a warning, the folder removed) where they cannot be had.
fn pack_comparison(workspace: &Path, dir: &Path) -> Result<Option<u64>, String> {
    match crate::compare::pack(workspace, dir) {
        Ok(()) => Ok(Some(dir_size(&dir.join("wheels"))?)),
        Err(why) => {
            eprintln!("warning: the bundle will not compare with cuda.core: {why}");
            std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
            Ok(None)
        }
    }
}

/// Builds the test binaries in release, stripped of debug information, and returns cargo's
/// messages.
fn build_tests(workspace: &Path) -> Result<Vec<Value>, String> {
    let mut command = cargo(workspace);
    command.args(["test", "--workspace", "--all-features", "--release", "--no-run", "--message-format=json"]);
    for package in EXCLUDED {
        command.args(["--exclude", package]);
    }
    build(&mut command)
}

/// What [`build_target`] builds: a binary, or an example that is a `cdylib`.
#[derive(Clone, Copy)]
enum Target {
    Bin,
    CdylibExample,
}

/// Builds the binary `name` of `package` (the probe, the demo, the benchmarks, xtask) in release,
/// stripped of debug information, and returns where it is.
fn build_binary(workspace: &Path, package: &str, name: &str) -> Result<PathBuf, String> {
    build_target(workspace, package, name, Target::Bin)
}

/// The file name of the `dlpack_ffi` example's library, in the payload's `examples/`.
const DLPACK_FFI: &str = "libdlpack_ffi.so";

/// Builds `name` of `package`, a `kind`, in release, and returns where its file is (a binary's
/// executable, a `cdylib`'s shared library).
fn build_target(workspace: &Path, package: &str, name: &str, kind: Target) -> Result<PathBuf, String> {
    let mut command = cargo(workspace);
    let flag = match kind {
        Target::Bin => "--bin",
        Target::CdylibExample => "--example",
    };
    command.args(["build", "--release", "-p", package, flag, name, "--message-format=json"]);
    let messages = build(&mut command)?;
    let mut built =
        messages.iter().filter(|m| m.get("target").and_then(|t| t.get("name")).and_then(Value::as_str) == Some(name));
    let file = match kind {
        Target::Bin => built.find_map(|m| m.get("executable").and_then(Value::as_str)),
        Target::CdylibExample => built
            .flat_map(|m| m.get("filenames").and_then(Value::as_array).map_or(&[][..], Vec::as_slice))
            .filter_map(Value::as_str)
            .find(|f| f.ends_with(".so")),
    };
    file.map(PathBuf::from).ok_or_else(|| format!("cargo built no {name} {flag}"))
}

/// Whether the test binary at `path` holds any test (`--list` names one): cargo builds a harness
/// for every binary target, and those of the probe, the demo and the benchmarks are empty.
fn holds_tests(path: &Path) -> Result<bool, String> {
    let mut command = Command::new(path);
    command.arg("--list");
    let output = command.output().map_err(|e| format!("cannot run `{}`: {e}", describe(&command)))?;
    if !output.status.success() {
        return Err(format!("`{}` failed ({})", describe(&command), output.status));
    }
    Ok(lists_tests(&String::from_utf8_lossy(&output.stdout)))
}

/// Whether the output of a test binary's `--list` names a test (`name: test`).
fn lists_tests(list: &str) -> bool {
    list.lines().any(|line| line.ends_with(": test"))
}

/// Packs the contents of `dir` into the xz-compressed tar archive `archive` (ustar, which every
/// tar reads). xz, not gzip: its 64 MiB window finds what the test binaries share (the
/// standard library, our crates), which gzip's 32 KiB cannot: 21 MiB instead of 55 MiB for the
/// same files (2026-11-25). A machine without xz unpacks it with python3's `tarfile`.
fn pack_payload(dir: &Path, archive: &Path) -> Result<(), String> {
    let file = std::fs::File::create(archive).map_err(|e| format!("creating {}: {e}", archive.display()))?;
    let mut tar = Command::new("tar");
    tar.args(["--format=ustar", "-cf", "-", "-C"]).arg(dir).arg(".").stdout(Stdio::piped());
    let mut tar_child = tar.spawn().map_err(|e| format!("cannot run `{}`: {e}", describe(&tar)))?;
    let tar_out = tar_child.stdout.take().ok_or("tar has no stdout")?;
    // One thread: a multi-threaded xz compresses blocks apart and loses what they share.
    let mut xz = Command::new("xz");
    xz.args(["-9", "-T1", "-c"]).stdin(tar_out).stdout(file);
    let xz_status = xz.status().map_err(|e| format!("cannot run `{}`: {e}", describe(&xz)));
    let tar_status = tar_child.wait().map_err(|e| format!("waiting for `{}`: {e}", describe(&tar)))?;
    let xz_status = xz_status?;
    if !tar_status.success() {
        return Err(format!("`{}` failed ({tar_status})", describe(&tar)));
    }
    if !xz_status.success() {
        return Err(format!("`{}` failed ({xz_status})", describe(&xz)));
    }
    Ok(())
}

/// The simulator library, if a cargo message reports building it (it is a dev-dependency of
/// the crates whose tests use it).
fn simulator_library(message: &Value) -> Option<PathBuf> {
    message
        .get("filenames")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find(|f| Path::new(f).file_name().is_some_and(|n| n == SIMULATOR))
        .map(PathBuf::from)
}

/// The bundle folder: `--out DIR` (relative to the current folder) or `gpu-bundle/` in the
/// workspace.
fn parse_args(workspace: &Path, args: &[String]) -> Result<PathBuf, String> {
    let usage = "usage: cargo xtask gpu-test [--out DIR]";
    let out = match args {
        [] => workspace.join("gpu-bundle"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        [flag] if flag.starts_with("--out=") => PathBuf::from(&flag["--out=".len()..]),
        _ => return Err(usage.to_string()),
    };
    if out.as_os_str().is_empty() {
        return Err(usage.to_string());
    }
    let cwd = std::env::current_dir().map_err(|e| format!("the current folder: {e}"))?;
    Ok(cwd.join(out))
}

/// Empties the bundle folder, refusing to touch a folder that is neither empty nor a bundle.
fn prepare_dir(out: &Path) -> Result<(), String> {
    if out.exists() {
        let is_empty = std::fs::read_dir(out).map_err(|e| format!("reading {}: {e}", out.display()))?.next().is_none();
        let is_bundle = std::fs::read_to_string(out.join("run.sh"))
            .is_ok_and(|s| s.lines().nth(1).is_some_and(|l| l.starts_with(MARKER)));
        if !is_empty && !is_bundle {
            return Err(format!(
                "{} exists and is not a GPU test bundle; remove it or choose another --out",
                out.display()
            ));
        }
        std::fs::remove_dir_all(out).map_err(|e| format!("removing the old bundle {}: {e}", out.display()))?;
    }
    create_dir(out)
}

/// What the bundle's release builds strip (`CARGO_PROFILE_RELEASE_STRIP`).
const BUNDLE_STRIP: &str = "debuginfo";

/// Runs a cargo build that prints JSON messages, and returns them; compiler diagnostics go to
/// the terminal as they come. Release binaries are stripped of their debug information but keep
/// their symbols: backtraces then name functions (a test checks that a leak's backtrace names
/// its allocating function, as a user's would), for about 2 MiB more in the packed payload.
fn build(command: &mut Command) -> Result<Vec<Value>, String> {
    command.env("CARGO_PROFILE_RELEASE_STRIP", BUNDLE_STRIP).stdout(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("cannot run `{}`: {e}", describe(command)))?;
    let stdout = child.stdout.take().ok_or("cargo has no stdout")?;
    let mut messages = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading cargo's output: {e}"))?;
        let Ok(message) = crate::parse_json(&line) else {
            println!("{line}");
            continue;
        };
        if message.get("reason").and_then(Value::as_str) == Some("compiler-message")
            && let Some(rendered) = message.get("message").and_then(|m| m.get("rendered")).and_then(Value::as_str)
        {
            eprint!("{rendered}");
        }
        messages.push(message);
    }
    let status = child.wait().map_err(|e| format!("waiting for `{}`: {e}", describe(command)))?;
    if !status.success() {
        return Err(format!("`{}` failed ({status})", describe(command)));
    }
    Ok(messages)
}

/// Whether a cargo message is a built test binary (`"profile":{"test":true}`).
fn is_test_artifact(message: &Value) -> bool {
    message.get("reason").and_then(Value::as_str) == Some("compiler-artifact")
        && message.get("profile").and_then(|p| p.get("test")).and_then(Value::as_bool) == Some(true)
}

/// A test binary, named `<package>.<kind>.<target>` (`cuda-mem-sys.lib`,
/// `cuda-mem-integration.test.ipc`), unless it belongs to an excluded package or has no
/// executable.
fn artifact(message: &Value) -> Option<Artifact> {
    let path = PathBuf::from(message.get("executable")?.as_str()?);
    let package = package_name(message.get("package_id")?.as_str()?);
    if EXCLUDED.contains(&package.as_str()) {
        return None;
    }
    let target = message.get("target")?;
    let kind = target.get("kind")?.as_array()?.first()?.as_str()?;
    let name = match kind {
        "lib" => format!("{package}.lib"),
        _ => format!("{package}.{kind}.{}", target.get("name")?.as_str()?),
    };
    Some(Artifact { name, path })
}

/// The package name in a cargo package id: `path+file:///w/cuda-mem-sys#0.1.0`,
/// `path+file:///w/dir#name@0.1.0`, or the older `name 0.1.0 (path+file:///w/name)`.
fn package_name(id: &str) -> String {
    if let Some((name, _)) = id.split_once(' ') {
        return name.to_string();
    }
    let (url, fragment) = id.rsplit_once('#').unwrap_or((id, ""));
    if let Some((name, _)) = fragment.split_once('@') {
        return name.to_string();
    }
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url).to_string()
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map(drop).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}

/// The folder of the payload that holds the workspace's Python files in their places, for the
/// tests that run Python beside Rust (they find it through `CUDA_MEM_WORKSPACE`).
const PYTHON_SOURCES_DIR: &str = "workspace";

/// The folders of the workspace whose Python files those tests run.
const PYTHON_SOURCE_FOLDERS: [&str; 2] = ["python", "tests/python"];

/// Copies the `.py` files of [`PYTHON_SOURCE_FOLDERS`] from `workspace` to the same places under
/// `to`.
fn copy_python_sources(workspace: &Path, to: &Path) -> Result<(), String> {
    for folder in PYTHON_SOURCE_FOLDERS {
        let from = workspace.join(folder);
        let dest = to.join(folder);
        std::fs::create_dir_all(&dest).map_err(|e| format!("creating {}: {e}", dest.display()))?;
        let entries = std::fs::read_dir(&from).map_err(|e| format!("reading {}: {e}", from.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("reading {}: {e}", from.display()))?.path();
            if let (Some(name), true) = (path.file_name(), path.extension().is_some_and(|e| e == "py")) {
                copy(&path, &dest.join(name))?;
            }
        }
    }
    Ok(())
}

fn write_executable(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", path.display()))
}

/// `MANIFEST.txt`: what the bundle holds and where it was built.
fn write_manifest(out: &Path, tests: &[&Artifact], simulator: bool, compare: bool) -> Result<(), String> {
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut text = format!(
        "cuda-mem GPU test bundle, built by `cargo xtask gpu-test` with {rustc}\n\
         Run: bash run.sh [TEST-BINARY-ARGS...]   (RESULTS=dir, CUDA_MEM_DRIVER=lib, TEST_TIMEOUT=seconds,\n\
         PARTS=\"probe tests demo bench compare\", REHEARSE=1 for a rehearsal on the bundle's simulator)\n\n\
         payload.tar.xz (unpacked by run.sh into a temporary folder) holds:\n\
         probe (the open driver questions; probe.json, and probe-simulator.json beside, go to $RESULTS/)\n\
         demo\n\
         bench (the benchmarks; its files go to $RESULTS/bench/)\n\
         xtask (its compare-bundle command compares with cuda.core; compare.md goes to $RESULTS/bench/)\n"
    );
    if compare {
        text.push_str(&format!(
            "compare/ (cuda_core_bench.py, libraw_pairs.so, null/libcuda.so.1, wheels of {}, {} and what they import)\n",
            crate::compare::CUDA_CORE,
            crate::python_smoke::CUDA_BINDINGS
        ));
    }
    for test in tests {
        text.push_str(&format!("tests/{}\n", test.name));
    }
    if simulator {
        text.push_str(&format!(
            "\nbeside it, {SIMULATOR} (for the tests that exercise the loader against the simulator, and the probe's comparison)\n"
        ));
    }
    let path = out.join("MANIFEST.txt");
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The total size of the files under `dir`.
fn dir_size(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?;
        let metadata = entry.metadata().map_err(|e| format!("reading {}: {e}", entry.path().display()))?;
        total += if metadata.is_dir() { dir_size(&entry.path())? } else { metadata.len() };
    }
    Ok(total)
}

/// `path` relative to `base` when it lies under it.
fn relative(base: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(base).map_or_else(|_| path.to_path_buf(), Path::to_path_buf)
}

/// The bundle's `run.sh`: `xtask/gpu-bundle/run.sh`, a file of its own (`shellcheck` reads it;
/// `cargo xtask ci` runs it there), built into xtask so that the bundle's xtask has it too.
fn run_script() -> &'static str {
    include_str!("../gpu-bundle/run.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_packages_from_every_id_format() {
        assert_eq!(package_name("path+file:///w/cuda-mem-sys#0.1.0"), "cuda-mem-sys");
        assert_eq!(package_name("path+file:///w/tests#cuda-mem-integration@0.1.0"), "cuda-mem-integration");
        assert_eq!(package_name("cuda-sim 0.1.0 (path+file:///w/cuda-sim)"), "cuda-sim");
        assert_eq!(package_name("registry+https://github.com/rust-lang/crates.io-index#libc@0.2.1"), "libc");
    }

    #[test]
    fn the_run_script_carries_the_marker() {
        assert!(run_script().lines().nth(1).is_some_and(|l| l.starts_with(MARKER)));
    }

    #[test]
    fn the_run_script_runs_the_probe_first_by_default_and_keeps_its_report() {
        let script = run_script();
        assert!(script.contains(r#"parts=" ${PARTS:-probe tests demo bench compare} ""#));
        let probe = script.find("if wants probe; then").expect("a probe part");
        let tests = script.find("if wants tests; then").expect("a tests part");
        assert!(probe < tests, "the probe runs before the tests");
        assert!(script.contains(r#"env PROBE_OUT="$results" "$bundle/probe""#), "its report goes beside the logs");
    }

    #[test]
    fn the_run_script_unpacks_the_payload_and_runs_what_it_holds() {
        let script = run_script();
        let unpack = script.find(r#"unpack "$home/payload.tar.xz" "$bundle""#).expect("the payload is unpacked");
        let probe = script.find("if wants probe; then").expect("a probe part");
        assert!(unpack < probe, "before anything runs");
        assert!(script.contains(r#"trap 'rm -rf "$bundle"' EXIT"#), "and removed at exit");
        assert!(script.contains(r#"cp "$home/libcuda_sim.so" "$bundle/""#), "the simulator beside the tests' folder");
        assert!(script.contains(r#"for binary in "$bundle"/tests/*; do"#));
        assert!(script.contains(r#"echo "$total_passed passed, $total_failed failed""#));
    }

    /// Runs the run script of a bundle whose one test binary is `test_body` (a bash script), from
    /// a folder holding a stand-in driver `drv/libcuda_sim.so`, with `CUDA_MEM_DRIVER` set to
    /// `driver` (`{dir}` there is that folder), and returns whether it passed and what it printed.
    fn run_bundle_with_test(test_body: &str, driver: &str) -> (bool, String) {
        run_bundle_with_test_and_env(test_body, driver, &[])
    }

    /// [`run_bundle_with_test`] with `env` set too, and the bundle holding a stand-in simulator.
    fn run_bundle_with_test_and_env(test_body: &str, driver: &str, env: &[(&str, &str)]) -> (bool, String) {
        let temp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(temp.path().join("drv")).unwrap();
        std::fs::write(temp.path().join("drv").join("libcuda_sim.so"), b"not a real library").unwrap();
        let driver = driver.replace("{dir}", temp.path().to_str().unwrap());
        let test = format!("#!/usr/bin/env bash\n{test_body}\n");
        let bundle = make_bundle(temp.path(), &[("tests/fake.test.links", test.as_bytes())]);
        let output = Command::new("bash")
            .envs(env.iter().copied())
            .arg(bundle.join("run.sh"))
            .current_dir(temp.path())
            .env("PARTS", "tests")
            .env("RESULTS", temp.path().join("results"))
            .env("CUDA_MEM_DRIVER", &driver)
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.success(), text)
    }

    /// A bundle in `dir/bundle` whose payload holds `files` (path in the payload, contents; each
    /// made executable), beside `run.sh` and a stand-in simulator; returns its folder.
    fn make_bundle(dir: &Path, files: &[(&str, &[u8])]) -> PathBuf {
        let payload = dir.join("payload");
        for (path, contents) in files {
            let file = payload.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, contents).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let bundle = dir.join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        pack_payload(&payload, &bundle.join(PAYLOAD)).unwrap();
        std::fs::write(bundle.join("run.sh"), run_script()).unwrap();
        std::fs::write(bundle.join(SIMULATOR), b"not a real simulator").unwrap();
        bundle
    }

    /// A wheel of one module, `fakemod` (`VALUE = 7`), made as wheels are: a zip of the package
    /// and its metadata, in `dir`; returns its bytes.
    fn fake_wheel(dir: &Path) -> Vec<u8> {
        let wheel = dir.join("fake-1.0-py3-none-any.whl");
        let made = Command::new("python3")
            .args(["-c", "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as w:\n    w.writestr('fakemod/__init__.py', 'VALUE = 7\\n')\n    w.writestr('fake-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: fake\\nVersion: 1.0\\n')\n    w.writestr('fake-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n    w.writestr('fake-1.0.dist-info/RECORD', '')"])
            .arg(&wheel)
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::read(&wheel).unwrap()
    }

    /// Where the bundles of these tests put the fake wheel.
    const FAKE_WHEEL: &str = "compare/wheels/fake-1.0-py3-none-any.whl";

    /// Runs `bundle`'s `run.sh` from `dir` with `env`, the results in `dir/results`; returns
    /// whether it passed and what it printed.
    fn run_bundle(bundle: &Path, dir: &Path, env: &[(&str, &std::ffi::OsStr)]) -> (bool, String) {
        let output = Command::new("bash")
            .arg(bundle.join("run.sh"))
            .current_dir(dir)
            .env("RESULTS", dir.join("results"))
            .env("CUDA_MEM_DRIVER", "libcuda.so.1")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("PYTHONPATH")
            .env_remove("CUDA_MEM_PYTHON")
            .env_remove("CUDA_MEM_WORKSPACE")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            output.status.success(),
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)),
        )
    }

    #[test]
    fn the_comparison_installs_its_wheels_with_pip_or_without() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        // The comparison's stand-in: passes only where the wheel's module imports.
        let xtask =
            b"#!/usr/bin/env bash\npython3 -c 'import fakemod; assert fakemod.VALUE == 7' || exit 1\necho compared\n";
        let bundle = make_bundle(dir, &[(FAKE_WHEEL, &fake_wheel(dir)), ("xtask", xtask)]);
        let results = dir.join("results");
        std::fs::create_dir_all(results.join("bench")).unwrap();
        std::fs::write(results.join("bench").join("results.json"), b"{}").unwrap();
        // A Python without pip: `-m pip` fails as it does there, anything else is python3.
        let no_pip = dir.join("python-without-pip");
        std::fs::write(&no_pip, "#!/usr/bin/env bash\n[ \"$1 $2\" != \"-m pip\" ] || { echo 'No module named pip' >&2; exit 1; }\nexec python3 \"$@\"\n").unwrap();
        std::fs::set_permissions(&no_pip, std::fs::Permissions::from_mode(0o755)).unwrap();
        let run = |python: &Path, site: &str| {
            let tmp = dir.join(site);
            std::fs::create_dir_all(&tmp).unwrap();
            run_bundle(
                &bundle,
                dir,
                &[
                    ("PARTS", "compare".as_ref()),
                    ("TMPDIR", tmp.as_os_str()),
                    ("CUDA_MEM_COMPARE_PYTHON", python.as_os_str()),
                ],
            )
        };
        let python_is_3_12 = Command::new("python3")
            .args(["-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"])
            .status()
            .is_ok_and(|s| s.success());
        let (passed, text) = run(&no_pip, "unzipped");
        if python_is_3_12 {
            assert!(passed && text.contains("has no pip: unzipping") && text.contains("1 passed, 0 failed"), "{text}");
        } else {
            // Unzipped wheels of another Python would not import: refused before.
            assert!(!passed && text.contains("not the Python 3.12") && text.contains("0 passed, 1 failed"), "{text}");
        }
        let has_pip =
            Command::new("python3").args(["-m", "pip", "--version"]).output().is_ok_and(|o| o.status.success());
        if has_pip {
            let (passed, text) = run(Path::new("python3"), "pip");
            assert!(passed && !text.contains("has no pip") && text.contains("1 passed, 0 failed"), "{text}");
        }
        // The stand-in can fail: without the wheels' folder on the path the module is missing.
        let bare = Command::new("python3")
            .args(["-c", "import fakemod"])
            .env_remove("PYTHONPATH")
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(!bare.status.success());
    }

    #[test]
    fn the_tests_get_a_python_with_the_wheels_and_the_workspaces_python_files() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        // A test that passes only with both: the module imports in the Python named, and the
        // Python files are where the tests look.
        let test = format!(
            r#"#!/usr/bin/env bash
[ -n "${{CUDA_MEM_PYTHON:-}}" ] && "$CUDA_MEM_PYTHON" -c 'import fakemod' \
    && [ -f "$CUDA_MEM_WORKSPACE/tests/python/child.py" ] && [ -f "$CUDA_MEM_WORKSPACE/python/lib.py" ] \
    && [ "$(cat "$CUDA_MEM_DLPACK_FFI")" = library ] || {{ {FAILS}; }}
{PASSES}"#
        );
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let env = [("PARTS", "tests".as_ref()), ("TMPDIR", tmp.as_os_str())];
        let bundle = make_bundle(
            dir,
            &[
                (FAKE_WHEEL, &fake_wheel(dir)),
                ("workspace/tests/python/child.py", b"print('child')\n"),
                ("workspace/python/lib.py", b"VALUE = 1\n"),
                ("examples/libdlpack_ffi.so", b"library"),
                ("tests/fake.test.python", test.as_bytes()),
            ],
        );
        let (passed, text) = run_bundle(&bundle, dir, &env);
        assert!(passed && text.contains("Python beside Rust: /") && text.contains("1 passed, 0 failed"), "{text}");
        // Without the wheels the same test fails: the Python is not named.
        let other = dir.join("other");
        std::fs::create_dir_all(&other).unwrap();
        let bundle = make_bundle(
            &other,
            &[("workspace/python/lib.py", b"VALUE = 1\n"), ("tests/fake.test.python", test.as_bytes())],
        );
        let (passed, text) = run_bundle(&bundle, &other, &env);
        assert!(!passed && text.contains("those tests will say SKIP") && text.contains("0 passed, 1 failed"), "{text}");
    }

    /// What a test binary prints when its one test passed or failed, for the run script to count.
    const PASSES: &str = r#"echo "test result: ok. 1 passed; 0 failed; 0 ignored;""#;
    const FAILS: &str = r#"echo "test result: FAILED. 0 passed; 1 failed; 0 ignored;"; exit 101"#;

    #[test]
    fn a_driver_named_by_path_is_what_libraries_loading_it_by_name_find() {
        // As cudarc does: `libcuda.so` (and `.so.1`) looked up in the loader's path.
        let body = format!(
            r#"first="${{LD_LIBRARY_PATH%%:*}}"
for name in libcuda.so libcuda.so.1; do
    [ "$(readlink -f "$first/$name")" = "$(readlink -f "$CUDA_MEM_DRIVER")" ] || {{ {FAILS}; }}
done
{PASSES}"#
        );
        for driver in ["{dir}/drv/libcuda_sim.so", "drv/libcuda_sim.so"] {
            let (passed, text) = run_bundle_with_test(&body, driver);
            assert!(passed && text.contains("1 passed, 0 failed"), "{driver}: {text}");
        }
    }

    #[test]
    fn a_rehearsal_runs_on_the_bundles_simulator_with_its_controls_hidden() {
        let body = format!(
            r#"[ "$CUDA_SIM_HIDE_CONTROLS" = 1 ] && [ "$(basename "$CUDA_MEM_DRIVER")" = libcuda_sim.so ] \
    && [ -f "$CUDA_MEM_DRIVER" ] || {{ {FAILS}; }}
{PASSES}"#
        );
        let (passed, text) = run_bundle_with_test_and_env(&body, "libcuda.so.1", &[("REHEARSE", "1")]);
        assert!(passed && text.contains("1 passed, 0 failed") && text.contains("rehearsal:"), "{text}");
        // Without it, the driver named is the one used, controls shown.
        let (passed, text) = run_bundle_with_test_and_env(&body, "libcuda.so.1", &[]);
        assert!(!passed && text.contains("0 passed, 1 failed"), "{text}");
    }

    #[test]
    fn tests_that_could_not_run_here_are_counted_apart_from_failures() {
        let cannot = format!(
            r#"echo "test cannot run here and CUDA_MEM_REQUIRE_GPU=1: needs two devices"
{FAILS}"#
        );
        let (passed, text) = run_bundle_with_test(&cannot, "libcuda.so.1");
        assert!(!passed, "still not a pass: {text}");
        assert!(text.contains("CANNOT ") && text.contains("0 passed, 0 failed"), "{text}");
        assert!(
            text.contains("1 more could not run on this machine") && text.contains("1   needs two devices"),
            "{text}"
        );
        // A failure that is not one stays a failure.
        let (passed, text) = run_bundle_with_test(FAILS, "libcuda.so.1");
        assert!(!passed && text.contains("FAILED ") && !text.contains("could not run on this machine"), "{text}");
    }

    #[test]
    fn a_driver_named_by_file_name_is_left_to_the_loader() {
        let body = format!(
            r#"[[ "${{LD_LIBRARY_PATH:-}}" != *libcuda-links* ]] || {{ {FAILS}; }}
{PASSES}"#
        );
        let (passed, text) = run_bundle_with_test(&body, "libcuda.so.1");
        assert!(passed && text.contains("1 passed, 0 failed"), "{text}");
        // The check can fail: a body that fails is reported as failed.
        let (passed, text) = run_bundle_with_test(FAILS, "libcuda.so.1");
        assert!(!passed && text.contains("0 passed, 1 failed"), "{text}");
    }

    #[test]
    fn only_binaries_that_list_a_test_are_carried() {
        assert!(lists_tests("pool::tests::grows: test\nother: test\n\n2 tests, 0 benchmarks\n"));
        assert!(!lists_tests("0 tests, 0 benchmarks\n"));
        assert!(!lists_tests(""));
    }

    #[test]
    fn the_payload_is_an_xz_tar_that_tar_and_python_read_back() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let payload = dir.join("payload");
        std::fs::create_dir_all(payload.join("tests")).unwrap();
        std::fs::write(payload.join("tests").join("a.test.b"), b"binary").unwrap();
        let archive = dir.join(PAYLOAD);
        pack_payload(&payload, &archive).unwrap();
        assert_eq!(&std::fs::read(&archive).unwrap()[..6], b"\xfd7zXZ\0", "xz's magic");
        let listed = Command::new("tar").arg("-tJf").arg(&archive).output().unwrap();
        assert!(listed.status.success());
        assert!(String::from_utf8_lossy(&listed.stdout).lines().any(|l| l == "./tests/a.test.b"));
        // What run.sh does where xz is missing.
        let python = Command::new("python3")
            .args(["-c", "import sys, tarfile; print(tarfile.open(sys.argv[1]).getnames())"])
            .arg(&archive)
            .output()
            .unwrap();
        assert!(python.status.success(), "{}", String::from_utf8_lossy(&python.stderr));
        assert!(String::from_utf8_lossy(&python.stdout).contains("./tests/a.test.b"));
    }

    #[test]
    fn test_artifacts_are_named_by_package_kind_and_target() {
        let message = crate::parse_json(
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#cuda-mem-integration@0.1.0","target":{"kind":["test"],"name":"ipc"},"profile":{"test":true},"executable":"/w/target/release/deps/ipc-1"}"#,
        )
        .unwrap();
        assert!(is_test_artifact(&message));
        assert_eq!(artifact(&message).unwrap().name, "cuda-mem-integration.test.ipc");
        let sim = crate::parse_json(
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/cuda-sim#0.1.0","target":{"kind":["lib"],"name":"cuda_sim"},"profile":{"test":true},"executable":"/x"}"#,
        )
        .unwrap();
        assert!(artifact(&sim).is_none());
    }
}
