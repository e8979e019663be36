//! Question 25: importing a descriptor that is no pool's. `cuda.h` lists what
//! `cuMemPoolImportFromShareableHandle` may return, not what a descriptor of another kind of
//! file gets; `cuda-mem-ipc` promises that a peer's wrong descriptor is a clear error that
//! leaves the process and its pools intact, and the simulator refuses each kind with
//! `CUDA_ERROR_INVALID_VALUE`. The parent makes one descriptor of each kind; a child imports
//! each (so that a driver that brought the process down would not take the probe with it),
//! destroys whatever it was given, and then makes a pool of its own to show it lives on.

use std::io::Write;
use std::os::fd::AsFd;

use rustix::fs::{MemfdFlags, memfd_create};

use crate::child::{self, Input};
use crate::raw::{code, destroy_pool, import_pool};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "pool-import-not-a-pool",
    question: "cuMemPoolImportFromShareableHandle of descriptors that are no pool's (/dev/null, a Unix socket, a \
               memfd of garbage, a regular file): what does the driver answer each, and does the importing process \
               live on?",
    run,
    child: Some(child_side),
};

/// The kinds of descriptor, in the order they are sent.
const KINDS: [&str; 4] = ["/dev/null", "a socket", "a memfd of garbage", "a regular file"];

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let null = std::fs::File::open("/dev/null")?;
    let (socket, _peer) = std::os::unix::net::UnixStream::pair()?;
    let mut garbage = std::fs::File::from(memfd_create("probe-not-a-pool", MemfdFlags::CLOEXEC)?);
    garbage.write_all(&[0xA5; 64 << 10])?;
    let path = std::env::temp_dir().join(format!("probe-not-a-pool-{}", std::process::id()));
    let mut regular = std::fs::File::options().read(true).write(true).create_new(true).open(&path)?;
    let written = regular.write_all(&[0x5A; 64 << 10]);
    let _ = std::fs::remove_file(&path);
    written?;
    let importer = child::ask(QUESTION.name, b"", &[null.as_fd(), socket.as_fd(), garbage.as_fd(), regular.as_fd()])?;
    let answer = summary(&importer);
    details.absorb("importer", importer);
    Ok(answer)
}

/// The answer, from what the importing child observed.
fn summary(importer: &Details) -> String {
    let each: Vec<String> = KINDS
        .iter()
        .enumerate()
        .map(|(index, kind)| format!("{kind} {}", importer.get(&format!("import_{index}")).unwrap_or("not tried")))
        .collect();
    let lived = child::lived_on(importer, "the process", importer.get("child").unwrap_or("no word"));
    format!("{}; {lived}", each.join(", "))
}

/// The importing child: each descriptor imported (and destroyed, if the driver took it), then a
/// pool of its own.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    for index in 0..KINDS.len() {
        let imported = import_pool(input.fd(index)?);
        details.put(format!("import_{index}"), code(&imported));
        if let Ok(pool) = imported {
            details.put(format!("destroy_{index}"), code(&destroy_pool(pool)));
        }
    }
    child::note_lived_on(details);
    Ok(())
}
