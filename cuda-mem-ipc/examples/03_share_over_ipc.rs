//! Two processes sharing a memory pool and its buffers, ordered by interprocess events.
//!
//! ```sh
//! cargo run -p cuda-mem-ipc --example 03_share_over_ipc                   # on the simulator
//! CUDA_MEM_DRIVER=libcuda.so.1 cargo run -p cuda-mem-ipc --example 03_share_over_ipc   # on a GPU
//! ```
//!
//! Without `CUDA_MEM_DRIVER` it runs on the `cuda-sim` simulator (`libcuda_sim.so`, which cargo
//! builds beside the example); with it, on the library it names.
//!
//! 1. The parent creates an IPC-enabled device pool, allocates two buffers and fills them.
//! 2. It records an interprocess event after the fills: the child's stream will wait for it on
//!    the GPU, so neither side waits on the host.
//! 3. It starts itself again as the child, connected by a channel ([`spawn_with_channel`]).
//! 4. It sends the buffers with the event ([`IpcChannel::send_buffers_after`]): the pool goes
//!    first, as a file descriptor, then the buffers' descriptors.
//! 5. The child maps them with one [`IpcChannel::recv_buffers`]; its stream waits for the event.
//!    It checks what the parent wrote and writes a new pattern into the first buffer.
//! 6. The child records its own event and sends it ([`IpcChannel::send_event`]). The parent's
//!    stream waits for it, and the parent checks that it sees the child's write.
//! 7. Who frees first: the driver wants every importer to free a buffer before its exporter
//!    does. The child drops its buffers before it exits, and the parent drops its own after
//!    `wait` (see [`IpcChannel`], *Who frees first*).
//!
//! What cuda.core writes for the hand-over, with its descriptor pickled across by the user:
//!
//! ```python
//! done = stream.record(options=EventOptions(ipc_enabled=True))  # timing off
//! send(done.ipc_descriptor)                                      # the sender
//! stream.wait(Event.from_ipc_descriptor(receive()))              # the receiver: on the GPU
//! ```
//!
//! is here `Event::new(device, EventOptions::default().interprocess())`, `record`, and
//! `send_buffers_after` or `send_event` on one side, and `recv_buffers` or `recv` on the other.

use std::error::Error;
use std::process::Command;

use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Event, EventOptions, FillPattern,
    LegacyPinnedMemoryResource, Stream, StreamOptions,
};
use cuda_mem_ipc::{Channel, IpcChannel, Received, spawn_with_channel};

/// Set in the child's environment.
const CHILD: &str = "SHARE_OVER_IPC_EXAMPLE_CHILD";
const SIZE: usize = 1 << 20;
const FIRST: u32 = 0xC0FF_EE00;
const SECOND: u32 = 0x1234_5678;
const FROM_CHILD: u32 = 0x5EED_5EED;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    let who = if std::env::var_os(CHILD).is_some() { "child " } else { "parent" };
    let driver = match std::env::var(cuda_mem_core::sys::DRIVER_ENV) {
        Ok(library) => library,
        Err(_) => "the cuda-sim simulator".to_string(),
    };
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    let device = Device::new(0)?;
    device.set_current()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    println!("[{who}] pid {}, {} on {driver}", std::process::id(), device.name()?);
    if who == "parent" { parent(device, &stream) } else { child(device, &stream) }
}

fn parent(device: Device, stream: &Stream) -> Result<()> {
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    let mut first = pool.allocate(SIZE, stream)?;
    let mut second = pool.allocate(SIZE, stream)?;
    first.fill(FillPattern::U32(FIRST), stream)?;
    second.fill(FillPattern::U32(SECOND), stream)?;
    // What the child reads must be written first: an interprocess event after the fills, which
    // the child's stream waits for (no host synchronization here).
    let filled = Event::new(device, EventOptions::default().interprocess())?;
    filled.record(stream)?;
    println!("[parent] enqueued fills of two buffers of {SIZE} bytes with {FIRST:#010x} and {SECOND:#010x}");

    let (mut process, channel) = spawn_with_channel(Command::new(std::env::current_exe()?).env(CHILD, "1"))?;
    let channel = IpcChannel::new(channel);
    channel.send_buffers_after(&filled, &[&first, &second])?;
    println!("[parent] sent the pool, both buffers and the event after the fills to the child (pid {})", process.id());

    // The child's event: our stream waits for its write before we read.
    let Received::Event(_) = channel.recv(stream)? else {
        return Err("expected the child's event".into());
    };
    match channel.recv(stream)? {
        Received::Data(text) => println!("[parent] the child says: {}", String::from_utf8_lossy(&text)),
        other => return Err(format!("expected the child's word, got {other:?}").into()),
    }
    check(&first, FROM_CHILD, stream)?;
    check(&second, SECOND, stream)?;
    println!("[parent] the first buffer now holds the child's {FROM_CHILD:#010x}; the second is unchanged");
    // The child holds its event until we have used it.
    channel.send_data(b"bye")?;

    let status = process.wait()?;
    if !status.success() {
        return Err(format!("the child failed: {status}").into());
    }
    drop((first, second));
    stream.synchronize()?;
    println!("[parent] done; the pool has {} bytes in use", pool.pool().attributes()?.used_mem_current);
    Ok(())
}

fn child(device: Device, stream: &Stream) -> Result<()> {
    // SAFETY: this process was started by `parent` through `spawn_with_channel`, and nothing in
    // it but this call adopts inherited descriptors.
    let channel = IpcChannel::new(unsafe { Channel::from_env() }?);
    // The pool, then the buffers; the stream waits (on the GPU) for the parent's event before
    // they are handed over.
    let mut buffers = channel.recv_buffers(stream)?;
    let pool = buffers[0].memory_resource().and_then(|r| r.memory_pool()).ok_or("a buffer of a pool")?;
    let at: Vec<String> = buffers.iter().map(|b| format!("{:#x}", b.ptr())).collect();
    println!("[child ] mapped a {} and {} buffers of it, at {}", pool.kind(), buffers.len(), at.join(" and "));
    check(&buffers[0], FIRST, stream)?;
    check(&buffers[1], SECOND, stream)?;
    println!("[child ] both hold what the parent wrote");

    buffers[0].fill(FillPattern::U32(FROM_CHILD), stream)?;
    // The parent reads it after our event, which its stream waits for.
    let written = Event::new(device, EventOptions::default().interprocess())?;
    written.record(stream)?;
    channel.send_event(&written)?;
    channel.send_data(format!("enqueued {FROM_CHILD:#010x} into the first buffer").as_bytes())?;
    // Keep the event (and the mapped buffers) until the parent is done with them.
    let Received::Data(_) = channel.recv(stream)? else {
        return Err("expected the parent's goodbye".into());
    };
    Ok(())
}

/// Checks that every 32-bit word of `buffer` is `value`, through a pinned host copy.
fn check(buffer: &Buffer, value: u32, stream: &Stream) -> Result<()> {
    let mut host = LegacyPinnedMemoryResource::new(stream.device()).allocate(buffer.size(), stream)?;
    host.copy_from(buffer, stream)?;
    let bytes = host.host_slice()?;
    match bytes.chunks_exact(4).position(|w| w != value.to_ne_bytes()) {
        None => Ok(()),
        Some(i) => Err(format!(
            "word {i} of the buffer at {:#x} is {:02x?}, expected {value:#010x}",
            buffer.ptr(),
            &bytes[4 * i..4 * i + 4]
        )
        .into()),
    }
}
