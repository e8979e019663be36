//! Gives the simulator a build id: a hash of its sources, compiled into both the shared library
//! and the `rlib` test suites link, so that `testing::driver()` can tell a library built from
//! these sources from a stale one found elsewhere (`cuSimBuildId`).

use std::path::Path;

/// FNV-1a, 64 bits: enough to tell builds apart; no dependency for one hash.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for byte in bytes {
        *hash ^= u64::from(*byte);
        *hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// Hashes every file under `dir` (names and contents), in a stable order.
fn hash_tree(dir: &Path, root: &Path, hash: &mut u64) -> std::io::Result<()> {
    let mut entries = std::fs::read_dir(dir)?.collect::<std::io::Result<Vec<_>>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            hash_tree(&path, root, hash)?;
        } else {
            let name = path.strip_prefix(root).unwrap_or(&path);
            fnv1a(hash, name.to_string_lossy().as_bytes());
            fnv1a(hash, &std::fs::read(&path)?);
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut hash = 0xcbf2_9ce4_8422_2325;
    hash_tree(&root.join("src"), root, &mut hash)?;
    fnv1a(&mut hash, &std::fs::read(root.join("Cargo.toml"))?);
    println!("cargo:rustc-env=CUDA_SIM_BUILD_ID={hash:016x}");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    Ok(())
}
