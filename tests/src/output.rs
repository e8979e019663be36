//! Where the binaries of this crate write their files.

use std::path::{Path, PathBuf};

/// The folder a binary writes its files to: the one the environment variable `env` names, or
/// `target/<name>` under the workspace (`CARGO_TARGET_DIR` respected), or `./<name>-results`
/// when the program runs outside the workspace (in the GPU bundle).
pub fn output_dir(env: &str, name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(env) {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("target"));
    if target.is_dir() { target.join(name) } else { PathBuf::from(format!("{name}-results")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_variable_the_workspace_target_folder_is_used() {
        // A variable no one sets, so that the test does not race with others over the
        // environment.
        let dir = output_dir("CUDA_MEM_TEST_OUTPUT_DIR_UNSET", "probe");
        assert!(dir.ends_with("target/probe") || dir.ends_with("probe-results"), "{}", dir.display());
    }
}
