//! `python/` is the installable package `cuda-mem-exchange`, whose version is the versions of the
//! wire formats it speaks, frame.descriptor.event (`python/pyproject.toml`). They must be
//! cuda-mem-ipc's and the module's own constants: a Rust change to a format's version fails here
//! until the module and its package follow.
//!
//! The files are read as text. The one `version` key of a file we write needs no TOML parser (a
//! new dependency tree for the test crate), and the module's constants are plain assignments.

use std::io::Read;
use std::os::unix::net::UnixStream;

use cuda_mem_ipc::{Channel, wire};

fn read(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The version in `pyproject.toml`'s `[project]` table.
fn package_version() -> String {
    let pyproject = read("python/pyproject.toml");
    let project = pyproject.split("\n[project]\n").nth(1).expect("a [project] table");
    let table = project.split("\n[").next().unwrap_or_default();
    let line = table.lines().find(|l| l.starts_with("version = ")).expect("a version in [project]");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

/// The value of `NAME = <integer>` at the start of a line of the module.
fn module_constant(name: &str) -> u16 {
    let module = read("python/cuda_mem_exchange.py");
    let prefix = format!("{name} = ");
    let line = module.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {name} in the module"));
    line[prefix.len()..].trim().parse().unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The channel's frame version as a frame it sends carries it (bytes 8 and 9, after the magic),
/// which must be the one cuda-mem-ipc names.
fn frame_version() -> u16 {
    let (ours, mut theirs) = UnixStream::pair().expect("a socket pair");
    let channel = Channel::from_stream(ours).expect("a channel");
    channel.send(3, b"", &[]).expect("an empty frame");
    let mut header = [0u8; 24];
    theirs.read_exact(&mut header).expect("the frame's header");
    assert_eq!(header[..8], wire::FRAME_MAGIC);
    let version = u16::from_le_bytes([header[8], header[9]]);
    assert_eq!(version, wire::FRAME_VERSION, "the frame version sent is the one named");
    version
}

#[test]
fn the_package_version_is_the_wire_formats_versions() {
    let rust = (frame_version(), wire::BUFFER_DESCRIPTOR_VERSION, wire::EVENT_DESCRIPTOR_VERSION);
    let python = (
        module_constant("FRAME_VERSION"),
        module_constant("BUFFER_DESCRIPTOR_VERSION"),
        module_constant("EVENT_DESCRIPTOR_VERSION"),
    );
    assert_eq!(python, rust, "the module's (frame, descriptor, event) versions are cuda-mem-ipc's");
    // A release that changes no format is a post-release of the same three (`1.1.1.post1`).
    let version = package_version();
    let formats = version.split(".post").next().unwrap_or_default();
    assert_eq!(formats, format!("{}.{}.{}", rust.0, rust.1, rust.2), "python/pyproject.toml's version {version}");
}
