//! The `no libcuda link` step: the driver is only ever opened at run time.

use std::path::Path;
use std::process::Command;

use super::Outcome;

/// Fails if any built binary or shared library asks the dynamic loader for libcuda: the driver
/// must only ever be opened at run time.
pub(super) fn no_libcuda_link(workspace: &Path) -> Result<Outcome, String> {
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
