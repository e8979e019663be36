//! `bench`: the benchmarks of the cuda-mem crates (`cargo xtask bench`), with a harness of its
//! own: warm-up, many repetitions, and per case the median and the spread (p10/p90).
//!
//! 1. pool allocate+free pairs at 256 B, 64 KiB and 4 MiB, through the safe API (shared and scoped buffers) and through raw
//!    `cuMemAllocFromPoolAsync`/`cuMemFreeAsync`, on one thread and on 4 threads (4 streams);
//!    (1b) the same pairs (256 B) on 1, 2, 4 and 8 threads at once, a stream each, as pairs per
//!    second of all threads together (`--scaling`: this case alone, printed); (1c) 64 KiB pairs
//!    through each memory resource of [`contenders`] on 1, 2 and as many threads as CPUs, against
//!    the raw driver pool pair in the same run (`--resource-pairs`: this case alone, printed);
//! 2. sharing buffers with a child process (this program with `--child`), through
//!    `IpcChannel` and through the two raw driver calls, for batches of 1, 64 and 1,024, and a
//!    re-send of the 1,024 already sent against the raw path (its target: ≤ 1/10 of raw);
//! 3. VMM growth from 2 MiB to 1 GiB in 2 MiB steps, in place, forced to move and with the
//!    device's memory reserved ahead, timed per step, with the driver calls per step counted on
//!    the simulator (`--vmm`: this case alone, printed);
//! 4. registry lookups and duplicate-import cache hits per second, in the child, on 1 and 8
//!    threads;
//! 5. the time from spawning a process to its first driver call returning (`--first-call`);
//! 6. each memory-resource adaptor's allocate+free pair against the bare pool resource;
//! 7. slice copies host ↔ device (`copy_from_slice` + `copy_to_slice`/`to_vec`) against the raw
//!    `cuMemcpyHtoDAsync` + `cuMemcpyDtoHAsync` + `cuStreamSynchronize`, on the same pageable memory;
//! 8. allocation traces of an LLM-serving-like and a training-like workload ([`trace`]), replayed
//!    against each memory resource of [`contenders`] ([`replay`]): peak reserved against peak
//!    allocated, time per step, and a plot and CSV of both over the trace (`--traces`: this case
//!    alone, printed, its plots and CSV written);
//! 9. a pool pair with the memory history's recording off, on and on with backtraces, and a
//!    snapshot (taken, as JSON, as the viewer's page) against the live allocations ([`snapshots`]);
//! 10. elastic memory: a group's offload and restore against the pinned copies of the same
//!     bytes, a discard and the wake after it with their VMM calls, and an on-demand range's
//!     mapping of one more page against how many are mapped ([`elastic`]);
//! 11. hand-off to workers: 1 MiB buffers lent to 1, 4 and 16 worker processes (this program with
//!     `--handoff-worker`) and handed back, per second, through the async channel (one Tokio
//!     thread) and the blocking one (a thread per worker) against the same round trip by raw
//!     driver calls and frames; and one hand-off's latency, first send and re-sends apart
//!     ([`handoff`], `--handoff`: this case alone, printed).
//!
//! The driver is chosen as the demo chooses it (`cuda_mem_integration::driver_choice`). Results go to
//! `target/bench/` (`results.json`, `results.md`, the SVG plots, the traces' CSV); the Markdown tables are printed
//! at the end. `bench --child`, `bench --first-call` and `bench --handoff-worker` are its own
//! children.
//!
//! Modules: [`cli`] (the command line), [`parent`] (the full run and `--pool-pairs`), [`stats`]
//! and [`units`] (the harness's numbers), one per case ([`pools`] and [`pacing`], [`scaling`], [`sharing`]
//! with [`child`], [`server`] and [`rates`], [`vmm`] with [`call_count`], [`first_call`],
//! [`adaptors`] for (6) and (7), [`resource_pairs`] for (1c), [`trace`] and [`replay`] for (8),
//! [`snapshots`] for (9), [`elastic`] with [`elastic_raw`] for (10), [`handoff`] with
//! [`handoff_worker`] for (11),
//! both over [`contenders`]), and
//! [`report`] (the JSON, Markdown and SVG outputs).

mod adaptors;
mod call_count;
mod child;
mod cli;
mod contenders;
mod elastic;
mod elastic_raw;
mod first_call;
mod handoff;
mod handoff_worker;
mod pacing;
mod parent;
mod pools;
mod rates;
mod replay;
mod report;
mod resource_pairs;
mod scaling;
mod server;
mod sharing;
mod snapshots;
mod stats;
mod trace;
mod units;
mod vmm;

use std::process::ExitCode;
use std::time::Instant;

use cli::Mode;

/// Any failure of the benchmarks.
type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let started = Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match cli::parse(&args) {
        Ok(Mode::Parent) => parent::parent_main(),
        Ok(Mode::Child) => server::child_main(),
        Ok(Mode::FirstCall) => first_call::first_call_main(started),
        Ok(Mode::HandoffWorker) => handoff_worker::handoff_worker_main(),
        Ok(Mode::PoolPairs) => parent::pool_pairs_main(),
        Ok(Mode::Sharing) => parent::sharing_main(),
        Ok(Mode::Vmm) => parent::vmm_main(),
        Ok(Mode::Scaling) => parent::scaling_main(),
        Ok(Mode::ResourcePairs) => parent::resource_pairs_main(),
        Ok(Mode::Traces) => parent::traces_main(),
        Ok(Mode::Elastic) => parent::elastic_main(),
        Ok(Mode::Handoff) => parent::handoff_main(),
        Ok(Mode::Help) => {
            println!("{}", cli::USAGE);
            Ok(())
        }
        Err(unexpected) => Err(unexpected.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error}");
            ExitCode::FAILURE
        }
    }
}
