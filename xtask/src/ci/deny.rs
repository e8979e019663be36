//! The `deny` step: `cargo deny check` of the dependency graph against `deny.toml` (licences,
//! bans, sources, advisories), where cargo-deny is installed. The advisories need the RustSec
//! database from GitHub: where it cannot be fetched, the rest is still checked and the step says
//! the advisories were skipped.

use std::path::Path;
use std::process::{Command, Stdio};

use super::Outcome;
use crate::{cargo, describe, run_command};

/// The checks that need nothing from the network (the graph comes from the local cargo cache).
const OFFLINE_CHECKS: [&str; 3] = ["licenses", "bans", "sources"];

/// What cargo-deny says when it cannot get the advisory database.
const NO_DATABASE: [&str; 2] = ["failed to fetch advisory database", "failed to open advisory database"];

pub(super) fn deny(workspace: &Path) -> Result<Outcome, String> {
    let installed = cargo(workspace).args(["deny", "--version"]).output().is_ok_and(|o| o.status.success());
    if !installed {
        return Ok(Outcome::Skipped(
            "cargo-deny is not installed (`cargo install cargo-deny --locked`): licences, duplicate versions, \
             sources and advisories are not checked"
                .to_string(),
        ));
    }
    run_command(deny_check(workspace).args(OFFLINE_CHECKS))?;
    let mut command = deny_check(workspace);
    command.arg("advisories").stderr(Stdio::piped());
    let output = command.output().map_err(|e| format!("cannot run `{}`: {e}", describe(&command)))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    if output.status.success() {
        return Ok(Outcome::PassedWith("licences, bans, sources and advisories".to_string()));
    }
    match no_database(&stderr) {
        Some(why) => Ok(Outcome::PassedWith(format!(
            "licences, bans and sources; advisories skipped, the RustSec database cannot be had here ({why})"
        ))),
        None => Err(format!("`{}` failed ({})", describe(&command), output.status)),
    }
}

/// cargo-deny's words where it could not get the advisory database (from the sign to the
/// database's address), or `None` where it failed for another reason.
fn no_database(stderr: &str) -> Option<&str> {
    let (line, sign) = stderr
        .lines()
        .find_map(|line| NO_DATABASE.iter().find(|sign| line.contains(*sign)).map(|sign| (line, sign)))?;
    let from = &line[line.find(sign)?..];
    Some(from.split_once(" with ").map_or(from, |(words, _)| words))
}

/// `cargo deny check` with the settings of `deny.toml`, the inclusion graphs of its warnings left
/// out (the duplicates' trees run to pages).
fn deny_check(workspace: &Path) -> Command {
    let mut command = cargo(workspace);
    command.args(["deny", "check", "--hide-inclusion-graph"]);
    command
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_database_that_cannot_be_fetched_is_told_from_a_failed_check() {
        let fetch = "2026-12-07 13:56:31 [ERROR] failed to fetch advisory database https://github.com/RustSec/advisory-db \
                     with cli: failed to clone";
        assert_eq!(
            super::no_database(fetch),
            Some("failed to fetch advisory database https://github.com/RustSec/advisory-db")
        );
        assert_eq!(super::no_database("error[vulnerability]: Use-after-free in foo"), None);
    }

    #[test]
    fn the_configuration_allows_what_the_workspace_is_licensed_under() {
        let config = std::fs::read_to_string(crate::workspace_root().join("deny.toml")).unwrap();
        let allow = config.lines().find(|line| line.starts_with("allow = ")).unwrap_or_default();
        for licence in ["\"MIT\"", "\"Apache-2.0\""] {
            assert!(allow.contains(licence), "{allow}");
        }
        assert!(config.contains("multiple-versions = \"warn\""), "duplicate versions are warned");
    }
}
