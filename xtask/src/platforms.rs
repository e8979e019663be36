//! The `ci` step that checks the README's "Platforms" table on targets other than this
//! machine's: `cargo check` of the crates that build there, and, for the Linux-only crates, that
//! the build stops with their one `compile_error!` saying so. Check only: no linker or C
//! toolchain for the target is needed, just its standard library (`rustup target add TARGET`).
//! A target whose standard library is not installed is skipped, saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ci::Outcome;
use crate::{cargo, describe, run_command};

/// The crates that build everywhere the driver API exists (and on macOS, which has none).
const PORTABLE: &[&str] = &["cuda-mem-sys", "cuda-mem-core", "cuda-mem-vmm"];

/// The crates that build on Linux only, each with the start of its `compile_error!`.
const LINUX_ONLY: &[(&str, &str)] =
    &[("cuda-mem-ipc", "cuda-mem-ipc builds on Linux only"), ("cuda-sim", "cuda-sim builds on Linux only")];

/// One target and what is claimed for it.
struct Target {
    triple: &'static str,
    /// Whether the Linux-only crates build there (otherwise they must refuse, saying so).
    linux: bool,
}

/// The targets checked: Windows (the driver is `nvcuda.dll`), macOS (no driver, but the portable
/// crates build), and a second Linux architecture.
const TARGETS: &[Target] = &[
    Target { triple: "x86_64-pc-windows-gnu", linux: false },
    Target { triple: "x86_64-apple-darwin", linux: false },
    Target { triple: "aarch64-unknown-linux-gnu", linux: true },
];

/// `cargo xtask platforms`: the step on its own.
pub fn run(workspace: &Path) -> Result<(), String> {
    match check(workspace)? {
        Outcome::Skipped(reason) | Outcome::Unavailable(reason) => println!("skipped: {reason}"),
        Outcome::PassedWith(note) => println!("ok: {note}"),
        Outcome::Passed => println!("ok"),
        Outcome::Failed(message) => return Err(message),
    }
    Ok(())
}

/// Runs the step.
pub fn check(workspace: &Path) -> Result<Outcome, String> {
    let sysroot = sysroot(workspace)?;
    let (installed, missing): (Vec<&Target>, Vec<&Target>) =
        TARGETS.iter().partition(|target| sysroot.join("lib/rustlib").join(target.triple).join("lib").is_dir());
    let missing: Vec<&str> = missing.iter().map(|target| target.triple).collect();
    if installed.is_empty() {
        return Ok(Outcome::Skipped(format!(
            "no other target's standard library is installed (`rustup target add {}`)",
            missing.join(" ")
        )));
    }
    for target in &installed {
        let crates = if target.linux {
            PORTABLE.iter().copied().chain(LINUX_ONLY.iter().map(|(name, _)| *name)).collect()
        } else {
            PORTABLE.to_vec()
        };
        println!("checking {} for {}", crates.join(", "), target.triple);
        let mut command = cargo(workspace);
        command.args(["check", "--all-features", "--target", target.triple]);
        for name in &crates {
            command.args(["-p", name]);
        }
        run_command(&mut command)?;
        if !target.linux {
            for (name, message) in LINUX_ONLY {
                expect_refusal(workspace, target.triple, name, message)?;
            }
        }
    }
    let checked: Vec<&str> = installed.iter().map(|target| target.triple).collect();
    let mut note = format!("checked for {}", checked.join(", "));
    if !missing.is_empty() {
        note.push_str(&format!("; skipped, not installed: {} (`rustup target add` them)", missing.join(", ")));
    }
    Ok(Outcome::PassedWith(note))
}

/// Fails unless `cargo check -p name --target triple` fails with `message`.
fn expect_refusal(workspace: &Path, triple: &str, name: &str, message: &str) -> Result<(), String> {
    let mut command = cargo(workspace);
    command.args(["check", "--all-features", "--message-format=short", "--target", triple, "-p", name]);
    let output = command.output().map_err(|e| format!("cannot run `{}`: {e}", describe(&command)))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        return Err(format!("`{}` passed: the README says {name} does not build for {triple}", describe(&command)));
    }
    if !stderr.contains(message) {
        return Err(format!("`{}` failed without {name}'s own message (\"{message}\"):\n{stderr}", describe(&command)));
    }
    let errors = stderr.lines().filter(|line| line.contains("error:") && !line.starts_with("error: could not compile"));
    let count = errors.count();
    if count != 1 {
        return Err(format!("{name} for {triple} stopped with {count} errors, not its one message:\n{stderr}"));
    }
    println!("{name} for {triple}: refused, as documented (\"{message}\")");
    Ok(())
}

/// The sysroot of the toolchain cargo uses here (where `rustup target add` puts each target's
/// standard library).
fn sysroot(workspace: &Path) -> Result<PathBuf, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut command = Command::new(rustc);
    command.current_dir(workspace).args(["--print", "sysroot"]);
    let output = command.output().map_err(|e| format!("cannot run `{}`: {e}", describe(&command)))?;
    if !output.status.success() {
        return Err(format!("`{}` failed ({})", describe(&command), output.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}
