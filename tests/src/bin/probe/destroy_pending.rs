//! Question 6: destroying a pool whose last free is still pending on a stream. `cuda.h` says
//! `cuMemPoolDestroy` returns at once and the pool's resources go "once there are no more
//! outstanding allocations"; when does its memory come back, and can its exported descriptor
//! still be imported meanwhile and after? A host function holds the stream ([`Gate`]) so that
//! the free is pending when the pool is destroyed. Two rounds: free memory (`cuMemGetInfo`) at
//! each step, with no other process about; then a child imports the descriptor while the free
//! is pending and again after the stream's work.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::child::{self, Input};
use crate::gate::Gate;
use crate::owned::{OwnedPool, OwnedStream, PoolAllocation};
use crate::raw::{code, destroy_pool, device_location, import_pool, memory_info, pool_props, pool_usage};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "destroy-with-pending-free",
    question: "cuMemPoolDestroy while the pool's last free is still pending on a stream: does it wait, when is the \
               pool's memory released (at once, after the stream's work, when the exported fd closes), and can \
               the exported fd still be imported meanwhile and after?",
    run,
    child: Some(child_side),
};

/// The allocation whose free is pending.
const SIZE: usize = 64 << 20;
/// How long the gate holds the stream at most (a destroy that waits for the stream returns
/// after this).
const GATE_LIMIT: Duration = Duration::from_secs(10);

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let (waited, memory) = memory_round(details)?;
    let (while_pending, after) = import_round(details)?;
    Ok(format!(
        "cuMemPoolDestroy {waited}; its memory comes back {memory}; the exported fd imports while the free is pending: \
         {while_pending}, after the stream's work: {after}"
    ))
}

/// A shareable pool with one allocation, its descriptor, and a stream held by a gate with the
/// allocation's free enqueued behind it: the pool is ready to be destroyed.
struct Pending {
    gate: Gate,
    fd: OwnedFd,
    pool: OwnedPool,
}

/// Sets up [`Pending`] on `stream`, recording the free's outcome.
fn pending(stream: &OwnedStream, details: &mut Details, round: &str) -> Result<Pending, Error> {
    let pool = OwnedPool::new(&pool_props(device_location(0), true, 0))?;
    let fd = pool.export()?;
    let mut allocation = PoolAllocation::new(pool.raw(), SIZE, stream)?;
    stream.synchronize()?;
    let gate = Gate::hold(stream.raw(), GATE_LIMIT)?;
    details.put(format!("{round}.free_async"), code(&allocation.free()));
    Ok(Pending { gate, fd, pool })
}

/// Destroys the pool, recording the outcome and whether the call waited for the stream.
fn destroy(pending: &mut Pending, details: &mut Details, round: &str) -> String {
    let start = Instant::now();
    let destroyed = pending.pool.destroy();
    let waited = start.elapsed() >= GATE_LIMIT.mul_f32(0.9);
    details.put(format!("{round}.destroy"), code(&destroyed));
    details.put(format!("{round}.destroy_seconds"), format!("{:.3}", start.elapsed().as_secs_f64()));
    let when = if waited { "waited for the stream's work" } else { "returned at once" };
    format!("{when} ({})", code(&destroyed))
}

/// Round one: the device's free memory before, with the allocation, after the destroy, after
/// the stream's work and after the descriptor is closed.
fn memory_round(details: &mut Details) -> Result<(String, String), Error> {
    let stream = OwnedStream::new(false)?;
    let (before, _) = memory_info()?;
    let mut pending = pending(&stream, details, "memory")?;
    let in_use = |details: &mut Details, step: &str| -> Result<i128, Error> {
        let used = before as i128 - memory_info()?.0 as i128;
        details.put(format!("memory.in_use_mib.{step}"), used >> 20);
        Ok(used)
    };
    let allocated = in_use(details, "with_the_allocation")?;
    let waited = destroy(&mut pending, details, "memory");
    let Pending { gate, fd, pool: _pool } = pending;
    let after_destroy = in_use(details, "after_the_destroy")?;
    gate.open();
    details.put("memory.stream_synchronize", code(&stream.synchronize()));
    let after_work = in_use(details, "after_the_stream_work")?;
    drop(fd);
    let after_close = in_use(details, "after_closing_the_fd")?;
    let back = |used: i128| used <= allocated - (SIZE as i128) / 2;
    let memory = if allocated < SIZE as i128 / 2 {
        "(not measurable: cuMemGetInfo did not show the allocation)".to_string()
    } else if back(after_destroy) {
        "at the destroy".to_string()
    } else if back(after_work) {
        "after the stream's work".to_string()
    } else if back(after_close) {
        "once the exported fd is closed".to_string()
    } else {
        "not within the probe".to_string()
    };
    Ok((waited, memory))
}

/// Round two: a child imports the descriptor while the free is pending, and after.
fn import_round(details: &mut Details) -> Result<(String, String), Error> {
    let stream = OwnedStream::new(false)?;
    let mut pending = pending(&stream, details, "import")?;
    destroy(&mut pending, details, "import");
    let while_pending = import_in_child(details, "while_pending", &pending.fd);
    pending.gate.open();
    details.put("import.stream_synchronize", code(&stream.synchronize()));
    let after = import_in_child(details, "after_the_stream_work", &pending.fd);
    Ok((while_pending, after))
}

/// Has a child import `fd`; its outcome.
fn import_in_child(details: &mut Details, step: &str, fd: &OwnedFd) -> String {
    match child::ask(QUESTION.name, b"", &[fd.as_fd()]) {
        Ok(importer) => {
            let outcome = importer.get("import").unwrap_or("not reached").to_string();
            details.absorb(&format!("import.{step}"), importer);
            outcome
        }
        Err(e) => format!("the child could not be asked ({e})"),
    }
}

/// The importing child: imports the pool, reads its usage, destroys its import.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let pool = import_pool(input.fd(0)?);
    details.put("import", code(&pool));
    if let Ok(pool) = pool {
        details.put("usage", pool_usage(pool));
        details.put("destroy", code(&destroy_pool(pool)));
    }
    Ok(())
}
