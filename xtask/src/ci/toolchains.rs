//! The steps that build with another toolchain than the one running xtask, or with other
//! versions of the dependencies: the declared `rust-version` (MSRV), and the lowest versions the
//! manifests allow.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Outcome;
use super::publish::is_network_failure;
use crate::{cargo, describe, run_command};

/// The toolchain whose cargo has `-Z direct-minimal-versions`.
const NIGHTLY: &str = "nightly";

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
pub(super) fn msrv_check(workspace: &Path) -> Result<Outcome, String> {
    let version = declared_rust_version(workspace)?;
    if !installed(&version) {
        return Ok(Outcome::Skipped(format!(
            "Rust {version} (the declared rust-version) is not installed (`rustup toolchain install {version} \
             --profile minimal`); clippy's incompatible_msrv lint (step clippy) still checks the standard \
             library items used"
        )));
    }
    let mut command = toolchain_cargo(workspace, &version);
    command.args(["check", "--workspace", "--all-targets", "--all-features"]);
    run_command(&mut command).map(|()| Outcome::PassedWith(format!("Rust {version}")))
}

/// The lowest versions the manifests allow, built: `cargo +nightly update -Z
/// direct-minimal-versions` in a copy of the workspace under `target/minimal-versions/` (the
/// workspace's own `Cargo.lock` untouched), then `cargo check` of the copy with every feature.
/// Skipped, saying so, without a nightly toolchain or crates.io.
pub(super) fn minimal_versions(workspace: &Path) -> Result<Outcome, String> {
    if !installed(NIGHTLY) {
        return Ok(Outcome::Skipped(format!(
            "no {NIGHTLY} toolchain (`rustup toolchain install {NIGHTLY} --profile minimal`): the lowest versions \
             the manifests allow are not checked"
        )));
    }
    let scratch = workspace.join("target/minimal-versions");
    let copy = scratch.join("workspace");
    copy_sources(workspace, &copy)?;
    let mut update = toolchain_cargo(&copy, NIGHTLY);
    update.args(["update", "-Z", "direct-minimal-versions"]).stderr(Stdio::piped());
    let output = update.output().map_err(|e| format!("cannot run `{}`: {e}", describe(&update)))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    if !output.status.success() {
        if is_network_failure(&stderr) {
            return Ok(Outcome::Skipped("crates.io cannot be reached: the lowest versions are not checked".into()));
        }
        return Err(format!(
            "`{}` failed ({}): the manifests' lower bounds conflict",
            describe(&update),
            output.status
        ));
    }
    let mut check = cargo(workspace);
    check
        .current_dir(&copy)
        .args(["check", "--workspace", "--all-targets", "--all-features"])
        .env("CARGO_TARGET_DIR", scratch.join("target"));
    run_command(&mut check).map(|()| Outcome::PassedWith("every feature, on the lowest versions allowed".into()))
}

/// Whether rustup has `toolchain`.
fn installed(toolchain: &str) -> bool {
    Command::new("rustup")
        .args(["run", toolchain, "cargo", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// `toolchain`'s cargo, run in `dir`.
fn toolchain_cargo(dir: &Path, toolchain: &str) -> Command {
    let mut command = Command::new("rustup");
    command
        .current_dir(dir)
        .args(["run", toolchain, "cargo"])
        // The outer cargo's choices name its own toolchain.
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO");
    command
}

/// Copies the workspace's files (those git tracks or would, `git ls-files`: no `target/`) to a
/// fresh `to`.
fn copy_sources(workspace: &Path, to: &Path) -> Result<(), String> {
    let mut list = Command::new("git");
    list.current_dir(workspace).args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"]);
    let output = list.output().map_err(|e| format!("cannot run `{}`: {e}", describe(&list)))?;
    if !output.status.success() {
        return Err(format!("`{}` failed ({}): the workspace's files are not known", describe(&list), output.status));
    }
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| format!("removing {}: {e}", to.display()))?;
    }
    let names = output.stdout.split(|&b| b == 0).filter(|name| !name.is_empty());
    for name in names.map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned())) {
        let from = workspace.join(&name);
        // A tracked file deleted in the working tree is listed too.
        if !from.is_file() {
            continue;
        }
        let dest = to.join(&name);
        if let Some(parent) = dest.parent() {
            crate::create_dir(parent)?;
        }
        std::fs::copy(&from, &dest).map_err(|e| format!("copying {} to {}: {e}", from.display(), dest.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_holds_the_workspace_and_not_its_builds() {
        let temp = tempfile::tempdir().unwrap();
        let copy = temp.path().join("copy");
        copy_sources(&crate::workspace_root(), &copy).unwrap();
        assert!(copy.join("Cargo.toml").is_file() && copy.join("Cargo.lock").is_file());
        assert!(copy.join("xtask/src/ci/toolchains.rs").is_file());
        assert!(!copy.join("target").exists());
    }

    #[test]
    fn reads_the_declared_rust_version() {
        let version = declared_rust_version(&crate::workspace_root()).expect("the root manifest");
        assert!(version.split('.').all(|part| part.parse::<u32>().is_ok()), "{version}");
    }
}
