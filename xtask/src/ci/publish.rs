//! The `publish --dry-run` step: every published crate packaged, and its package built as a user
//! would get it; offline where crates.io cannot be reached.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::Outcome;
use crate::{cargo, describe, run_command};

/// The crates published to crates.io, in the order they can be published.
const PUBLISHED: &[&str] = &["cuda-mem-sys", "cuda-sim", "cuda-mem-core", "cuda-mem-vmm", "cuda-mem-ipc"];

/// `cargo publish --dry-run` of every published crate (packaged, then built from the package);
/// where it fails, `cargo package --offline` of them, which packages and builds them the same way
/// without asking crates.io: if that passes, what failed was the registry (unreachable, or an
/// answer of its), and the step passes saying so with the cause; if it fails too, both causes
/// are the step's error.
pub(super) fn publish_dry_run(workspace: &Path) -> Result<Outcome, String> {
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
pub(super) fn is_network_failure(stderr: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
