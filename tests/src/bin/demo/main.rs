//! `demo`: the first thing to run on a new machine (`cargo xtask demo`).
//!
//! It tells the workspace's story in a few timed, checked steps, with the high-level crates:
//!
//! 1. the driver: the library `CUDA_MEM_DRIVER` names; else the real driver when it sees a GPU;
//!    else the `cuda-sim` simulator, with two simulated devices unless `CUDA_SIM_DEVICES` is set
//!    (so that the peer-access step has a peer);
//! 2. the devices and what they support (`cuda-mem-core`);
//! 3. a device pool: allocate, fill on the device, copy to pinned memory and check every word,
//!    with the pool's attributes before, during and after;
//! 4. peer access (two devices or more): device 1 becomes a peer of device 0's pool, copies into
//!    it on its own stream, and loses its access again;
//! 5. a child process: this program again, with `--child`, connected by
//!    `cuda_mem_ipc::spawn_with_channel`;
//! 6. sharing (`cuda-mem-ipc`): an IPC-enabled pool and several buffers go to the child, which
//!    checks each pattern and writes a new one that this process then reads;
//! 7. VMM (`cuda-mem-vmm`): a buffer grows in place, then is made to move (the addresses after
//!    it are reserved first with a raw `cuMemAddressReserve`), and its data stays intact through
//!    the old and the new buffers; then it goes to the child on the same `IpcChannel` as the
//!    pools, and the child maps it and writes it;
//! 8. the child's exit, and a check that nothing failed while being released.
//!
//! It ends with a table of the steps and how long each took, and exits non-zero on any error or
//! mismatch. `demo --child` is the child's side; it is not meant to be run by hand.
//!
//! Modules: [`story`] (the steps in order), a module per part of the story ([`driver`],
//! [`devices`], [`pool`], [`peers`], [`child`], [`sharing`], [`vmm`]), [`child_side`] (the child's
//! side) with [`protocol`] (their requests), [`gpu`] (device 0 and reading results back),
//! [`errors`], [`narration`] (how things are printed) and [`report`] (the table of steps).

mod child;
mod child_side;
mod devices;
mod driver;
mod errors;
mod gpu;
mod narration;
mod peers;
mod pool;
mod protocol;
mod report;
mod sharing;
mod story;
mod vmm;

use std::process::ExitCode;

/// Any failure of the demo, printed with its causes.
type Error = Box<dyn std::error::Error>;

/// What `--help` prints, and what follows an unexpected argument.
const USAGE: &str = "usage: demo\n\nShows and checks what the cuda-mem crates do: a device pool, peer access, sharing \
                     pools and buffers with a child process, and growing and sharing virtual memory. The driver is \
                     the library CUDA_MEM_DRIVER names, else libcuda.so.1 when it finds a GPU, else the cuda-sim \
                     simulator (CUDA_SIM_LIB, or libcuda_sim.so beside this program), with CUDA_SIM_DEVICES=2 unless \
                     it is set.";

/// The argument that makes this program the child of another demo.
const CHILD_ARG: &str = "--child";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => story::parent_main(),
        [CHILD_ARG] => child_side::child_main(),
        ["--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("demo: unexpected arguments {other:?}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}
