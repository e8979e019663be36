//! Locating (and, when needed, fetching) the `cuda.h` the bindings are generated from.
//!
//! The header is pinned: it comes from the PyPI wheel `nvidia-cuda-runtime` at
//! [`WHEEL_VERSION`], unpacked under `.cuda-header/` in the workspace (ignored by git).
//! `CUDA_HOME` overrides it with a local toolkit's `include/` folder.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel version whose `cuda.h` the committed bindings were generated from (CUDA 13.0,
/// the version of the 580-series drivers this project is tested on).
pub const WHEEL_VERSION: &str = "13.0.96";

/// The folder holding `cuda.h` and `cudaTypedefs.h`, if one can be found without fetching.
pub fn find_include_dir(workspace: &Path) -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let dir = PathBuf::from(home).join("include");
        if dir.join("cuda.h").is_file() {
            return Some(dir);
        }
    }
    let pinned = pinned_dir(workspace);
    pinned.join("cuda.h").is_file().then_some(pinned)
}

fn pinned_dir(workspace: &Path) -> PathBuf {
    workspace.join(".cuda-header").join(WHEEL_VERSION).join("nvidia/cu13/include")
}

/// Finds the header, downloading and unpacking the pinned wheel with pip when it is absent.
pub fn fetch_include_dir(workspace: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = find_include_dir(workspace) {
        return Ok(dir);
    }
    let root = workspace.join(".cuda-header").join(WHEEL_VERSION);
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let wheel_dir = root.join("wheel");
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"])
        .args(["--platform", "manylinux_2_17_x86_64", "--python-version", "3.12"])
        .arg("-d")
        .arg(&wheel_dir)
        .arg(format!("nvidia-cuda-runtime=={WHEEL_VERSION}"))
        .status()
        .map_err(|e| format!("running pip: {e}"))?;
    if !status.success() {
        return Err(format!("pip could not download nvidia-cuda-runtime=={WHEEL_VERSION}"));
    }
    let wheel = std::fs::read_dir(&wheel_dir)
        .map_err(|e| format!("reading {}: {e}", wheel_dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("pip downloaded no wheel")?;
    // A wheel is a zip file; Python's zipfile module unpacks it without extra tools.
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&root)
        .status()
        .map_err(|e| format!("unpacking the wheel: {e}"))?;
    if !status.success() {
        return Err(format!("could not unpack {}", wheel.display()));
    }
    let dir = pinned_dir(workspace);
    if dir.join("cuda.h").is_file() { Ok(dir) } else { Err(format!("the wheel has no cuda.h under {}", dir.display())) }
}
