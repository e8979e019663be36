//! An async server that owns a pool and lends its blocks to four workers, which write into them
//! and hand them back: three Rust workers and, when a Python with cuda.core is named, one
//! Python worker (`tests/python/serve_worker.py`).
//!
//! ```sh
//! cargo run -p cuda-mem-ipc --features tokio --example 07_serve_workers        # on the simulator
//! CUDA_MEM_PYTHON=/path/to/python-with-cuda.core cargo run -p cuda-mem-ipc --features tokio --example 07_serve_workers
//! ```
//!
//! 1. The server listens on a name in Linux's abstract namespace
//!    ([`AsyncChannelListener::bind_abstract`]); the default policy admits this user's
//!    processes only.
//! 2. Workers start on their own and connect by that name ([`Channel::connect_abstract`]; the
//!    Python one with `Channel.connect_abstract`). Each says which byte it writes.
//! 3. The server serves each worker on a task of its own, over an [`AsyncIpcChannel`]: it
//!    lends blocks ([`AsyncIpcChannel::lend`]: the pool goes first, once per worker), and keeps
//!    them while the worker holds them. The worker fills each block with its byte and hands it
//!    back ([`IpcChannel::give_back`]: freed on its stream, the frees waited for); the server
//!    receives its own buffers again ([`Received::Returned`]) and checks the bytes.
//! 4. A worker that went away holding blocks would leave them in
//!    [`AsyncIpcChannel::into_outstanding`], back once its process has exited.
//!
//! Without `CUDA_MEM_DRIVER` it runs on the `cuda-sim` simulator; the Python worker then loads
//! the same simulator as its `libcuda.so.1`, so both sides simulate one machine.

use std::error::Error;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, LegacyPinnedMemoryResource, Stream,
    StreamOptions,
};
use cuda_mem_ipc::{AsyncChannelListener, AsyncIpcChannel, Channel, IpcChannel, Received};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// Blocks lent to each worker, in rounds of [`IN_FLIGHT`].
const BLOCKS_PER_WORKER: usize = 24;
const IN_FLIGHT: usize = 3;
const BLOCK: usize = 256 << 10;
/// The Python with cuda.core for the fourth worker.
const PYTHON_ENV: &str = "CUDA_MEM_PYTHON";

fn main() -> Result<()> {
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    let device = Device::new(0)?;
    device.set_current()?;
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") => {
            let (Some(name), Some(byte)) = (args.get(2), args.get(3).and_then(|b| b.parse::<u8>().ok())) else {
                return Err("usage: 07_serve_workers worker NAME BYTE".into());
            };
            rust_worker(device, name, byte)
        }
        _ => server(device),
    }
}

fn server(device: Device) -> Result<()> {
    let name = format!("cuda-mem-example-07-{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    runtime.block_on(async {
        let listener = AsyncChannelListener::bind_abstract(&name)?;
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
        let mut workers = Vec::new();
        for byte in [0x11u8, 0x22, 0x33] {
            workers.push(start(Command::new(std::env::current_exe()?).args(["worker", &name, &byte.to_string()]))?);
        }
        match std::env::var_os(PYTHON_ENV) {
            Some(python) => workers.push(start(&mut python_worker(&python, &name, 0x44)?)?),
            None => println!("[server] {PYTHON_ENV} is not set: no Python worker this time (three Rust workers)"),
        }
        println!("[server] pid {}, listening on @{name} for {} workers", std::process::id(), workers.len());

        // One task per worker, each served as it connects.
        let mut serving = tokio::task::JoinSet::new();
        for _ in 0..workers.len() {
            let channel = AsyncIpcChannel::new(listener.accept().await?);
            serving.spawn(serve(channel, Arc::clone(&pool), device));
        }
        while let Some(served) = serving.join_next().await {
            let (byte, blocks) = served??;
            println!("[server] worker {byte:#04x}: {blocks} blocks lent, written and handed back, checked");
        }
        for mut worker in workers {
            let status = worker.wait()?;
            if !status.success() {
                return Err(format!("a worker failed: {status}").into());
            }
        }
        let used = pool.pool().attributes()?.used_mem_current;
        println!("[server] done; the pool has {used} bytes in use");
        Ok::<_, Box<dyn Error + Send + Sync>>(())
    })
}

/// Serves one worker: lends it blocks, checks what comes back, then tells it to stop.
async fn serve(channel: AsyncIpcChannel, pool: Arc<DeviceMemoryResource>, device: Device) -> Result<(u8, usize)> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pid = channel.channel().peer_process_id();
    // The worker's first word: the byte it writes.
    let byte = match channel.recv(&stream).await? {
        Received::Data(hello) if hello.len() == 1 => hello[0],
        other => return Err(format!("worker {pid:?}: expected its byte, got {other:?}").into()),
    };
    let mut lent = 0;
    let mut back = 0;
    while back < BLOCKS_PER_WORKER {
        while lent < BLOCKS_PER_WORKER && lent - back < IN_FLIGHT {
            channel.lend(vec![pool.allocate(BLOCK, &stream)?]).await?;
            lent += 1;
        }
        match channel.recv(&stream).await? {
            Received::Returned(blocks) => {
                for block in &blocks {
                    check(block, byte, &stream)?;
                }
                back += blocks.len();
            }
            other => return Err(format!("worker {pid:?}: expected blocks back, got {other:?}").into()),
        }
    }
    channel.send_data(b"stop").await?;
    Ok((byte, back))
}

/// A Rust worker: connects by name, says its byte, fills and gives back what it is lent.
fn rust_worker(device: Device, name: &str, byte: u8) -> Result<()> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let channel = IpcChannel::new(Channel::connect_abstract(name)?);
    channel.send_data(&[byte])?;
    let mut filled = 0;
    loop {
        match channel.recv(&stream)? {
            Received::Resource(_) => {}
            Received::Buffers(mut blocks) => {
                for block in &mut blocks {
                    block.fill(FillPattern::U8(byte), &stream)?;
                }
                filled += blocks.len();
                channel.give_back(blocks, &stream)?;
            }
            Received::Data(word) if word == b"stop" => break,
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    println!("[worker {byte:#04x}] pid {}: filled and gave back {filled} blocks", std::process::id());
    Ok(())
}

fn start(command: &mut Command) -> Result<Child> {
    Ok(command.stdin(Stdio::null()).spawn()?)
}

/// The Python worker's command: `serve_worker.py NAME BYTE`, on the simulator this process
/// loads (as its `libcuda.so.1`), or the system's driver.
fn python_worker(python: &std::ffi::OsStr, name: &str, byte: u8) -> Result<Command> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/serve_worker.py");
    let mut command = Command::new(python);
    command.args([script, name, &byte.to_string()]);
    if cuda_sim::testing::on_simulator() {
        let dir = cuda_sim::testing::libcuda_dir()?;
        let mut path = std::ffi::OsString::from(dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        command.env("LD_LIBRARY_PATH", path);
    }
    Ok(command)
}

/// Checks that every byte of `block` is `byte`, through a pinned host copy.
fn check(block: &Buffer, byte: u8, stream: &Stream) -> Result<()> {
    let mut host = LegacyPinnedMemoryResource::new(stream.device()).allocate(block.size(), stream)?;
    host.copy_from(block, stream)?;
    stream.synchronize()?;
    match host.host_slice()?.iter().position(|&b| b != byte) {
        None => Ok(()),
        Some(at) => Err(format!("byte {at} of a block is not the worker's {byte:#04x}").into()),
    }
}
