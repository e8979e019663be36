//! The command line: `bench` alone runs every case; `--child`, `--first-call` and
//! `--handoff-worker` are its own children, `--pool-pairs` is case (1) alone for `cargo xtask bench --compare`.

/// What `--help` prints, and what follows an unexpected argument.
pub(crate) const USAGE: &str = "usage: bench\n\nRuns the cuda-mem benchmarks (pools, sharing, VMM growth, registry and import \
                     cache, first driver call) and writes target/bench/results.{json,md} and SVG plots. The driver \
                     is the library CUDA_MEM_DRIVER names, else libcuda.so.1 when it finds a GPU, else the cuda-sim \
                     simulator. BENCH_OUT overrides the output folder.\n\n\
                     bench --pool-pairs: case 1 on one thread only, its last line JSON (for --compare).\n\
                     bench --sharing: case 2 (and 4's rates) only, printed, no files written.\n\
                     bench --vmm: case 3's growth series only, printed (no outputs written).\n\
                     bench --scaling: case 1b (pairs on 1, 2, 4 and 8 threads) only, printed (no outputs written).\n\
                     bench --resource-pairs: case 1c (64 KiB pairs per memory resource against raw) only, printed.\n\
                     bench --traces: case 8 (allocation traces replayed) only, printed; writes its trace_*.svg and \
                     trace_*.csv.\n\
                     bench --elastic: case 10 (elastic memory) only, printed (no outputs written).\n\
                     bench --handoff: case 11 (hand-off to workers) only, printed (no outputs written).";

/// The child of cases (2) and (4) (see [`crate::server`]).
pub(crate) const CHILD_ARG: &str = "--child";
/// A worker of case (11) (see [`crate::handoff_worker`]).
pub(crate) const HANDOFF_WORKER_ARG: &str = "--handoff-worker";
/// The child of case (5) (see [`crate::first_call`]).
pub(crate) const FIRST_CALL_ARG: &str = "--first-call";
/// Case (1) on one thread only, as one JSON line: `cargo xtask bench --compare` alternates it
/// with cuda.core's side, so that both are measured under the same load.
const POOL_PAIRS_ARG: &str = "--pool-pairs";
/// Case (2) alone, printed (its child also gives case (4)'s rates).
const SHARING_ARG: &str = "--sharing";
/// Case (3)'s growth series alone, printed.
const VMM_ARG: &str = "--vmm";
/// Case (1b)'s scaling curve alone, printed.
const SCALING_ARG: &str = "--scaling";

/// Case (1c) alone, printed.
const RESOURCE_PAIRS_ARG: &str = "--resource-pairs";
/// Case (8) alone, printed, its plots and CSV written.
const TRACES_ARG: &str = "--traces";
/// Case (10) alone, printed.
const ELASTIC_ARG: &str = "--elastic";
/// Case (11) alone, printed.
const HANDOFF_ARG: &str = "--handoff";

/// What this run of the program does.
pub(crate) enum Mode {
    /// Every case, and the outputs.
    Parent,
    /// The child of cases (2) and (4).
    Child,
    /// The child of case (5).
    FirstCall,
    /// A worker of case (11).
    HandoffWorker,
    /// Case (1) on one thread, as JSON.
    PoolPairs,
    /// Case (2) alone, printed.
    Sharing,
    /// Case (3)'s growth series, printed.
    Vmm,
    /// Case (1b)'s scaling curve, printed.
    Scaling,
    /// Case (1c), printed.
    ResourcePairs,
    /// Case (8), printed, its plots and CSV written.
    Traces,
    /// Case (10), printed.
    Elastic,
    /// Case (11), printed.
    Handoff,
    /// Print [`USAGE`].
    Help,
}

/// The mode the arguments (without the program's name) ask for, or the error to print.
pub(crate) fn parse(args: &[String]) -> Result<Mode, String> {
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => Ok(Mode::Parent),
        [CHILD_ARG] => Ok(Mode::Child),
        [FIRST_CALL_ARG] => Ok(Mode::FirstCall),
        [HANDOFF_WORKER_ARG] => Ok(Mode::HandoffWorker),
        [POOL_PAIRS_ARG] => Ok(Mode::PoolPairs),
        [SHARING_ARG] => Ok(Mode::Sharing),
        [VMM_ARG] => Ok(Mode::Vmm),
        [SCALING_ARG] => Ok(Mode::Scaling),
        [RESOURCE_PAIRS_ARG] => Ok(Mode::ResourcePairs),
        [TRACES_ARG] => Ok(Mode::Traces),
        [ELASTIC_ARG] => Ok(Mode::Elastic),
        [HANDOFF_ARG] => Ok(Mode::Handoff),
        ["--help" | "-h"] => Ok(Mode::Help),
        other => Err(format!("unexpected arguments {other:?}\n{USAGE}")),
    }
}
