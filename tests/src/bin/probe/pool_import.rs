//! Question 1: importing one pool twice in one process. `cuda.h` does not say whether a second
//! `cuMemPoolImportFromShareableHandle` of a pool returns the first import's handle or a new
//! one; `cuda-mem-core` guards against the first reading (`SharingError::PoolAlreadyOwned`), and the
//! simulator models both (`CUDA_SIM_POOL_IMPORT`). The parent exports a device pool; a child
//! imports its descriptor twice, then a duplicate of it, and destroys the later imports before
//! asking whether the first still works.

use std::os::fd::{AsFd, AsRawFd};

use cuda_mem_sys::CudaError;
use cuda_mem_sys::types::{CUmemPool_attribute, CUmemoryPool};

use crate::child::{self, Input};
use crate::owned::OwnedPool;
use crate::raw::{code, destroy_pool, device_location, import_pool, pool_attribute, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "pool-import-twice",
    question: "A second cuMemPoolImportFromShareableHandle of the same pool fd (and of a dup of it) in one process: \
               the first import's CUmemoryPool or a new one? Does destroying the later imports leave the first usable?",
    run,
    child: Some(child_side),
};

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let pool = OwnedPool::new(&pool_props(device_location(0), true, 0))?;
    let fd = pool.export()?;
    let importer = child::ask(QUESTION.name, b"", &[fd.as_fd()])?;
    let answer = summary(&importer);
    details.absorb("importer", importer);
    Ok(answer)
}

/// The answer, from what the importing child observed.
fn summary(importer: &Details) -> String {
    match importer.get("import_1") {
        Some("CUDA_SUCCESS") => {}
        Some(code) => return format!("the first import failed: {code}"),
        None => return format!("the child did not import ({})", importer.get("child").unwrap_or("no word")),
    }
    let again = handle_answer(importer, "import_2");
    let dup = handle_answer(importer, "import_dup");
    let first = match importer.get("first_after_destroying_the_others") {
        Some("CUDA_SUCCESS") => "destroying the later imports leaves the first usable".to_string(),
        Some(code) => format!("after destroying the later imports the first answers {code}"),
        None => format!("the first was not tried again ({})", importer.get("child").unwrap_or("no word")),
    };
    format!("same fd again: {again}; a dup of the fd: {dup}; {first}")
}

/// What one import returned: the first import's handle, a new one, or its error.
fn handle_answer(importer: &Details, key: &str) -> String {
    match (importer.get(key), importer.get(&format!("{key}_handle"))) {
        (Some("CUDA_SUCCESS"), Some(handle)) => handle.to_string(),
        (Some(code), _) => format!("refused ({code})"),
        (None, _) => "not tried".to_string(),
    }
}

/// The importing child: two imports of the descriptor and one of a duplicate, then the later
/// ones destroyed and the first asked for an attribute.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let fd = input.fd(0)?;
    let first = import_pool(fd);
    details.put("import_1", code(&first));
    let Ok(first) = first else { return Ok(()) };
    let mut later: Vec<CUmemoryPool> = Vec::new();
    let second = import_pool(fd);
    record_import(details, "import_2", &second, first);
    later.extend(second.ok());
    let dup = input.fds.first().ok_or("no descriptor")?.try_clone()?;
    let third = import_pool(dup.as_raw_fd());
    record_import(details, "import_dup", &third, first);
    later.extend(third.ok());
    for (index, pool) in later.into_iter().enumerate().rev() {
        details.put(format!("destroy_later_import_{}", index + 1), code(&destroy_pool(pool)));
    }
    let usable = pool_attribute(first, CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    details.put("first_after_destroying_the_others", code(&usable));
    details.put("destroy_first", code(&destroy_pool(first)));
    Ok(())
}

/// Records an import's outcome and whether its handle is the first import's.
fn record_import(details: &mut Details, key: &str, import: &Result<CUmemoryPool, CudaError>, first: CUmemoryPool) {
    details.put(key, code(import));
    if let Ok(pool) = import {
        let same = if *pool == first { "the first import's handle" } else { "a new handle" };
        details.put(format!("{key}_handle"), same);
    }
}
