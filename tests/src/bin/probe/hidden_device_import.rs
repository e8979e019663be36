//! Question 40: importing a pool whose device the importing process does not see. The
//! exporter's pool is on device 1; the importer is started with `CUDA_VISIBLE_DEVICES=0`. The
//! simulator (`cuda_sim::conservative`) refuses the import with `CUDA_ERROR_INVALID_VALUE`, which
//! `cuda.h` documents for a bad handle; what a driver does it does not say.

use std::os::fd::AsFd;

use crate::capture::short;
use crate::child::{self, Input};
use crate::owned::OwnedPool;
use crate::raw::{code, destroy_pool, device_location, import_pool, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "hidden-device-import",
    question: "cuMemPoolImportFromShareableHandle of a pool on device 1 in a process started with \
               CUDA_VISIBLE_DEVICES=0 (which sees device 0 only): its result?",
    run,
    child: Some(child_side),
};

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    if setup.devices < 2 {
        return Ok("not applicable: it needs two devices".to_string());
    }
    let pool = OwnedPool::new(&pool_props(device_location(1), true, 0))?;
    let fd = pool.export()?;
    let seen = child::ask_with_env(QUESTION.name, b"", &[fd.as_fd()], &[("CUDA_VISIBLE_DEVICES", "0")])?;
    let import = seen.get("import").map_or_else(|| "not reached".to_string(), |c| short(c).to_string());
    details.absorb("importer", seen);
    Ok(format!("the import {import}"))
}

/// The importer: imports the pool, and destroys its import if it got one.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let pool = import_pool(input.fd(0)?);
    details.put("import", code(&pool));
    if let Ok(pool) = pool {
        details.put("destroy", code(&destroy_pool(pool)));
    }
    Ok(())
}
