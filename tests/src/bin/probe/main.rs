//! `probe`: asks the driver the questions its documentation leaves open and the workspace
//! depends on (`cargo xtask probe`; part `probe` of the GPU bundle's `run.sh`).
//!
//! `cuda-sim` takes a reading wherever `cuda.h` is silent (`cuda_sim::conservative`), and the
//! libraries rely on some behaviours no document states. Each question here is answered with raw
//! driver calls (`cuda_mem_sys`, the process-wide driver chosen as the demo chooses it: the library
//! `CUDA_MEM_DRIVER` names, else `libcuda.so.1` when it sees a device, else the simulator), on
//! device 0, and printed as one line, `PROBE <name>: <answer>`, with the observations it was
//! drawn from indented below. Questions about importing are asked from a child process (this
//! program again, `--child NAME`), as another process would import.
//!
//! Each probe reports errors as its answer (`error: …`), releases what it created, and does
//! not depend on the others: one that fails does not stop the rest. The report goes to
//! `probe.json` in `$PROBE_OUT` (default `target/probe/`, or `./probe-results` outside the
//! workspace). On a real driver the same questions are then asked of the simulator
//! (`libcuda_sim.so` beside this program, or `CUDA_SIM_LIB`) with as many simulated devices as
//! the GPU machine has, and the report shows its answer beside each (`probe-simulator.json`
//! holds its details; `PROBE_COMPARE=0` skips this, `PROBE_COMPARE=1` does it on the simulator
//! too, which checks that its answers do not vary from run to run). The program exits non-zero
//! when a probe could not answer.
//!
//! Modules: [`runner`] (running the questions, the comparison with the simulator), [`driver`]
//! (which driver, and what the report says of it), [`report`] (answers, lines and JSON),
//! [`child`] (the child processes), [`raw`] (call outcomes and shared queries), [`owned`] (what
//! a probe creates, released on drop), [`gate`] (holding a stream busy), and a module per
//! question: [`pool_import`], [`pointer_import`], [`imported_access`], [`capture`],
//! [`failed_alloc`], [`destroy_pending`], [`address_hint`], [`per_thread_capture`],
//! [`peer_leftover`], [`zero_byte`], [`host_pool_access`], [`pci_bus_id`], [`free_pending`],
//! [`ipc_event`], [`managed_ranges`], [`managed_ids`], [`managed_pool`], [`managed_discard`],
//! [`batch_copy_edges`], [`graph_memory`], [`graph_launch_capture`], [`pool_alloc_capture`],
//! [`unsafe_calls`], [`user_object`], [`pool_import_not_a_pool`], [`exporter_frees_first`],
//! [`fabric_channel`], [`zero_byte_capture`], [`graph_memory_release`], [`capture_dependencies`],
//! [`call_edges`], [`capture_edges`], [`context_edges`], [`address_range`],
//! [`peer_copy_pool`], [`vmm_map_past`], [`gone_stream_work`], [`unsafe_edges`],
//! [`visible_devices`], [`hidden_device_import`].

mod address_hint;
mod address_range;
mod batch_copy_edges;
mod call_edges;
mod capture;
mod capture_dependencies;
mod capture_edges;
mod child;
mod context_edges;
mod destroy_pending;
mod driver;
mod exporter_frees_first;
mod fabric_channel;
mod failed_alloc;
mod free_pending;
mod gate;
mod gone_stream_work;
mod graph_launch_capture;
mod graph_memory;
mod graph_memory_release;
mod hidden_device_import;
mod host_pool_access;
mod imported_access;
mod ipc_event;
mod managed_discard;
mod managed_ids;
mod managed_pool;
mod managed_ranges;
mod owned;
mod pci_bus_id;
mod peer_copy_pool;
mod peer_leftover;
mod per_thread_capture;
mod pointer_import;
mod pool_alloc_capture;
mod pool_import;
mod pool_import_not_a_pool;
mod raw;
mod report;
mod runner;
mod unsafe_calls;
mod unsafe_edges;
mod user_object;
mod visible_devices;
mod vmm_map_past;
mod zero_byte;
mod zero_byte_capture;

use std::process::ExitCode;

use crate::child::{CHILD_ARG, ChildSide};
use crate::report::Details;
use crate::runner::{SIMULATOR_SIDE_ARG, Setup};

/// Any failure of a probe, printed with its causes.
type Error = Box<dyn std::error::Error>;

/// What `--help` prints.
const USAGE: &str = "usage: probe [NAME...]     ask every question (or those named) of the driver\n       probe --list        \
                     the questions\n\nThe driver is the library CUDA_MEM_DRIVER names, else libcuda.so.1 when it finds a \
                     GPU, else the cuda-sim simulator (CUDA_SIM_LIB, or libcuda_sim.so beside this program, with \
                     CUDA_SIM_DEVICES=2 unless it is set). Prints `PROBE <name>: <answer>` per question and writes \
                     probe.json to $PROBE_OUT (default target/probe/). On a real driver it then asks the simulator \
                     the same questions and shows its answers beside (PROBE_COMPARE=0 skips that, PROBE_COMPARE=1 does it \
                     on the simulator too). Exits non-zero when a question could not be answered.";

/// One question.
pub(crate) struct Question {
    /// Its name in the output and the report.
    pub(crate) name: &'static str,
    /// The question, in words.
    pub(crate) question: &'static str,
    /// Asks it: records the observations and returns the answer, one line.
    pub(crate) run: fn(&Setup<'_>, &mut Details) -> Result<String, Error>,
    /// What a child process does for it, if it asks one (run with `--child NAME`).
    pub(crate) child: Option<ChildSide>,
}

/// Every question, in the order they are asked.
pub(crate) const QUESTIONS: [Question; 40] = [
    pool_import::QUESTION,
    pointer_import::QUESTION,
    imported_access::QUESTION,
    capture::QUESTION,
    failed_alloc::QUESTION,
    destroy_pending::QUESTION,
    address_hint::QUESTION,
    per_thread_capture::QUESTION,
    peer_leftover::QUESTION,
    zero_byte::QUESTION,
    host_pool_access::QUESTION,
    pci_bus_id::QUESTION,
    free_pending::QUESTION,
    ipc_event::QUESTION,
    managed_ranges::QUESTION,
    managed_ids::QUESTION,
    managed_pool::QUESTION,
    managed_discard::QUESTION,
    batch_copy_edges::QUESTION,
    graph_memory::QUESTION,
    graph_launch_capture::QUESTION,
    pool_alloc_capture::QUESTION,
    unsafe_calls::QUESTION,
    user_object::QUESTION,
    pool_import_not_a_pool::QUESTION,
    exporter_frees_first::QUESTION,
    fabric_channel::QUESTION,
    zero_byte_capture::QUESTION,
    graph_memory_release::QUESTION,
    capture_dependencies::QUESTION,
    call_edges::QUESTION,
    capture_edges::QUESTION,
    context_edges::QUESTION,
    address_range::QUESTION,
    peer_copy_pool::QUESTION,
    vmm_map_past::QUESTION,
    gone_stream_work::QUESTION,
    unsafe_edges::QUESTION,
    visible_devices::QUESTION,
    hidden_device_import::QUESTION,
];

/// The child side of the question `name`.
pub(crate) fn child_side(name: &str) -> Option<ChildSide> {
    QUESTIONS.iter().find(|q| q.name == name).and_then(|q| q.child)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["--list"] => {
            for question in &QUESTIONS {
                println!("{}: {}", question.name, question.question);
            }
            ExitCode::SUCCESS
        }
        [flag, name] if *flag == CHILD_ARG => child::child_main(name),
        [flag, names @ ..] if *flag == SIMULATOR_SIDE_ARG => runner::main(names, true),
        names => runner::main(names, false),
    }
}
