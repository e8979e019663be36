//! The steps that build with another toolchain than the one running xtask: the declared
//! `rust-version` (MSRV).

use std::path::Path;
use std::process::{Command, Stdio};

use super::Outcome;
use crate::run_command;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_declared_rust_version() {
        let version = declared_rust_version(&crate::workspace_root()).expect("the root manifest");
        assert!(version.split('.').all(|part| part.parse::<u32>().is_ok()), "{version}");
    }
}
