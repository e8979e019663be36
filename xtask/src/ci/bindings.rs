//! The `bindgen --check` step, and where libclang is found for it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Outcome;

/// The binding check, or why it cannot run here.
pub(super) fn bindgen_check(workspace: &Path, have_header: bool) -> Result<Outcome, String> {
    if !have_header {
        return Ok(Outcome::Skipped("cuda.h not available (see the `fetch cuda.h` step)".to_string()));
    }
    let Some(libclang) = find_libclang() else {
        return Ok(Outcome::Skipped(
            "libclang not found (install libclang-dev, or set LIBCLANG_PATH to its folder)".to_string(),
        ));
    };
    println!("libclang: {}", libclang.display());
    crate::run_bindgen(workspace, true).map(|()| Outcome::Passed)
}

/// A libclang shared library bindgen can load: in `LIBCLANG_PATH`, in the dynamic loader's
/// cache, or in an LLVM installation under `/usr/lib`.
fn find_libclang() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LIBCLANG_PATH") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Some(path);
        }
        if let Some(found) = libclang_in(&path) {
            return Some(found);
        }
    }
    if let Ok(output) = Command::new("ldconfig").arg("-p").stderr(Stdio::null()).output() {
        let listing = String::from_utf8_lossy(&output.stdout);
        // Lines read `\tlibclang-14.so.13 (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-14.so.13`.
        let found = listing.lines().find_map(|line| {
            let name = line.split_whitespace().next()?;
            let path = line.rsplit_once("=> ")?.1.trim();
            is_libclang(name).then(|| PathBuf::from(path))
        });
        if found.is_some() {
            return found;
        }
    }
    let mut llvm_dirs = std::fs::read_dir("/usr/lib").ok()?.filter_map(Result::ok).filter_map(|entry| {
        let name = entry.file_name();
        name.to_string_lossy().starts_with("llvm").then(|| entry.path().join("lib"))
    });
    llvm_dirs.find_map(|dir| libclang_in(&dir))
}

/// The first libclang library in `dir`.
fn libclang_in(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|entry| is_libclang(&entry.file_name().to_string_lossy()))
        .map(|entry| entry.path())
}

/// `libclang.so`, `libclang.so.N`, `libclang-N.so`, `libclang-N.so.M` (not `libclang-cpp`).
fn is_libclang(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("libclang") else {
        return false;
    };
    let Some(at) = rest.find(".so") else {
        return false;
    };
    let (version, suffix) = rest.split_at(at);
    let version_ok = version.is_empty()
        || version
            .strip_prefix('-')
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'));
    version_ok && (suffix == ".so" || suffix.starts_with(".so."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_libclang_names() {
        for name in ["libclang.so", "libclang.so.1", "libclang-14.so", "libclang-14.so.13", "libclang-17.0.6.so"] {
            assert!(is_libclang(name), "{name}");
        }
        for name in ["libclang-cpp.so.14", "libclangBasic.a", "libclang.a", "libclang-14.sox"] {
            assert!(!is_libclang(name), "{name}");
        }
    }
}
