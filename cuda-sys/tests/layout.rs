//! The structures we pass to the driver have the same size and field offsets in the Rust
//! bindings as in C: a small C program compiled against `cuda.h` (with the `cc` crate's choice
//! of compiler) prints the C layout, and each line is compared with Rust's.
//!
//! The header is found in `CUDA_MEM_CUDA_INCLUDE`, `$CUDA_HOME/include`, or the copy that
//! `cargo xtask ci` fetches into `.cuda-header/`; without one the test says it was skipped.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_mem_sys::types::*;

fn include_dir() -> Option<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.to_path_buf();
    let candidates = [
        std::env::var_os("CUDA_MEM_CUDA_INCLUDE").map(PathBuf::from),
        std::env::var_os("CUDA_HOME").map(|home| PathBuf::from(home).join("include")),
        Some(workspace.join(".cuda-header/13.0.96/nvidia/cu13/include")),
    ];
    candidates.into_iter().flatten().find(|dir| dir.join("cuda.h").is_file())
}

/// Compiles and runs `layout.c`, returning "name → number" for each line it prints.
fn c_layout(include: &Path) -> BTreeMap<String, usize> {
    let out_dir = std::env::temp_dir().join(format!("cuda-mem-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let target = if cfg!(target_arch = "aarch64") { "aarch64-unknown-linux-gnu" } else { "x86_64-unknown-linux-gnu" };
    let compiler = cc::Build::new()
        .target(target)
        .host(target)
        .opt_level(0)
        .out_dir(&out_dir)
        .cargo_metadata(false)
        .get_compiler();
    let exe = out_dir.join("layout");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/layout.c");
    let status = compiler
        .to_command()
        .arg(format!("-I{}", include.display()))
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap();
    assert!(status.success(), "compiling layout.c against {} failed", include.display());
    let output = Command::new(&exe).output().unwrap();
    assert!(output.status.success());
    let _ = std::fs::remove_dir_all(&out_dir);
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn structures_match_the_c_layout() {
    let Some(include) = include_dir() else {
        eprintln!("skipped: no cuda.h found (set CUDA_MEM_CUDA_INCLUDE or run `cargo xtask ci`)");
        return;
    };
    let c = c_layout(&include);
    let rust: Vec<(&str, usize)> = vec![
        ("CUmemLocation", size_of::<CUmemLocation>()),
        ("CUmemLocation.type", offset_of!(CUmemLocation, type_)),
        ("CUmemLocation.id", offset_of!(CUmemLocation, id)),
        ("CUmemPoolProps", size_of::<CUmemPoolProps>()),
        ("CUmemPoolProps.allocType", offset_of!(CUmemPoolProps, allocType)),
        ("CUmemPoolProps.handleTypes", offset_of!(CUmemPoolProps, handleTypes)),
        ("CUmemPoolProps.location", offset_of!(CUmemPoolProps, location)),
        ("CUmemPoolProps.win32SecurityAttributes", offset_of!(CUmemPoolProps, win32SecurityAttributes)),
        ("CUmemPoolProps.maxSize", offset_of!(CUmemPoolProps, maxSize)),
        ("CUmemPoolProps.usage", offset_of!(CUmemPoolProps, usage)),
        ("CUmemPoolProps.reserved", offset_of!(CUmemPoolProps, reserved)),
        ("CUmemAllocationProp", size_of::<CUmemAllocationProp>()),
        ("CUmemAllocationProp.type", offset_of!(CUmemAllocationProp, type_)),
        ("CUmemAllocationProp.requestedHandleTypes", offset_of!(CUmemAllocationProp, requestedHandleTypes)),
        ("CUmemAllocationProp.location", offset_of!(CUmemAllocationProp, location)),
        ("CUmemAllocationProp.win32HandleMetaData", offset_of!(CUmemAllocationProp, win32HandleMetaData)),
        ("CUmemAllocationProp.allocFlags", offset_of!(CUmemAllocationProp, allocFlags)),
        (
            "CUmemAllocationProp.allocFlags.compressionType",
            offset_of!(CUmemAllocationProp, allocFlags)
                + offset_of!(CUmemAllocationProp_st__bindgen_ty_1, compressionType),
        ),
        (
            "CUmemAllocationProp.allocFlags.gpuDirectRDMACapable",
            offset_of!(CUmemAllocationProp, allocFlags)
                + offset_of!(CUmemAllocationProp_st__bindgen_ty_1, gpuDirectRDMACapable),
        ),
        (
            "CUmemAllocationProp.allocFlags.usage",
            offset_of!(CUmemAllocationProp, allocFlags) + offset_of!(CUmemAllocationProp_st__bindgen_ty_1, usage),
        ),
        ("CUmemAccessDesc", size_of::<CUmemAccessDesc>()),
        ("CUmemAccessDesc.location", offset_of!(CUmemAccessDesc, location)),
        ("CUmemAccessDesc.flags", offset_of!(CUmemAccessDesc, flags)),
        ("CUmemPoolPtrExportData", size_of::<CUmemPoolPtrExportData>()),
        ("CUmemPoolPtrExportData.reserved", offset_of!(CUmemPoolPtrExportData, reserved)),
        ("CUuuid", size_of::<CUuuid>()),
        ("CUdeviceptr", size_of::<CUdeviceptr>()),
        ("CUresult", size_of::<CUresult>()),
    ];
    assert_eq!(c.len(), rust.len(), "layout.c and this test list different items");
    for (name, value) in rust {
        assert_eq!(c.get(name), Some(&value), "{name}: C says {:?}, Rust says {value}", c.get(name));
    }
}
