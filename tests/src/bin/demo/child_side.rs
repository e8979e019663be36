//! `demo --child`, the child's side: opens device 0, says it is ready, then answers each
//! request (check and rewrite shared buffers, or a virtual buffer) with `ok …` or `error …`.

use std::process::ExitCode;
use std::sync::Arc;

use cuda_mem_core::{Event, EventOptions, FillPattern, PoolKind};
use cuda_mem_ipc::{Channel, IpcChannel, IpcError, Received};
use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions};

use crate::Error;
use crate::child::CHILD_TIMEOUT;
use crate::errors::{Context, describe};
use crate::gpu::Gpu;
use crate::narration::format_bytes;
use crate::protocol::{Patterns, Request};

/// `demo --child`: serves the parent's requests until it says quit.
pub(crate) fn child_main() -> ExitCode {
    match serve_parent() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("  [child {}] error: {}", std::process::id(), describe(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Takes the channel, opens device 0, says so, then answers each request with `ok …` or
/// `error …`.
fn serve_parent() -> Result<(), Error> {
    // SAFETY: started by the demo's parent through `spawn_with_channel`; nothing else adopts it.
    let ipc = IpcChannel::new(unsafe { Channel::from_env() }?);
    ipc.channel().set_read_timeout(Some(CHILD_TIMEOUT))?;
    let gpu = match Gpu::open().and_then(|gpu| Ok((gpu.device.name()?, gpu))) {
        Ok((name, gpu)) => {
            ipc.send_data(format!("ok pid {} is ready on {} ({name})", std::process::id(), gpu.device).as_bytes())?;
            gpu
        }
        Err(e) => {
            let _ = ipc.send_data(format!("error {}", describe(e.as_ref())).as_bytes());
            return Err(e);
        }
    };
    let mut vmm = None;
    // Hands the child's writes to the parent (recorded after them, sent, waited for there); one
    // for the whole run, re-recorded each time, and alive until the parent has opened it.
    let written = Event::new(gpu.device, EventOptions::default().interprocess())?;
    loop {
        let request = match ipc.recv(&gpu.stream) {
            Ok(Received::Data(bytes)) => Request::parse(&bytes)?,
            Ok(_) => return Err("the parent sent a pool or buffers where a request was due".into()),
            Err(IpcError::PeerClosed) => {
                return Err("the parent closed the channel without asking the child to quit".into());
            }
            Err(e) => return Err(e.into()),
        };
        let outcome = match request {
            Request::Quit => return Ok(()),
            Request::Buffers(patterns) => child_check_buffers(&ipc, &gpu, &written, &patterns),
            Request::Vmm(patterns) => child_check_virtual_buffer(&ipc, &gpu, &mut vmm, &written, patterns),
        };
        let reply = match outcome {
            Ok(summary) => format!("ok {summary}"),
            Err(e) => format!("error {}", describe(e.as_ref())),
        };
        ipc.send_data(reply.as_bytes())?;
    }
}

/// Receives the pool and the buffers (the stream waits for the parent's event that came with
/// them), checks each buffer's pattern and writes the new one, then sends `written`, recorded
/// after the writes.
fn child_check_buffers(ipc: &IpcChannel, gpu: &Gpu, written: &Event, patterns: &[Patterns]) -> Result<String, Error> {
    let pid = std::process::id();
    // The imported pools: buffers can only be mapped while their pool is alive here.
    let mut pools = Vec::new();
    let mut buffers = loop {
        match ipc.recv(&gpu.stream).context("receiving the pool and the buffers")? {
            Received::Resource(pool) => {
                let kind = match pool.kind() {
                    PoolKind::Device(device) => format!("memory of {device}"),
                    PoolKind::Pinned => "pinned host memory".to_string(),
                    other => other.to_string(),
                };
                println!("  [child {pid}] imported the pool {} ({kind})", pool.uuid());
                pools.push(pool);
            }
            Received::Buffers(buffers) => break buffers,
            Received::Data(_) => return Err("a request arrived where buffers were due".into()),
            _ => return Err("a virtual buffer arrived where buffers were due".into()),
        }
    };
    if buffers.len() != patterns.len() {
        return Err(format!("{} buffers arrived for {} patterns", buffers.len(), patterns.len()).into());
    }
    for (index, (buffer, p)) in buffers.iter_mut().zip(patterns).enumerate() {
        gpu.expect_words(buffer, buffer.size(), p.expect, &format!("imported buffer {index}"))?;
        buffer.fill(FillPattern::U32(p.write), &gpu.stream)?;
    }
    written.record(&gpu.stream)?;
    let addresses: Vec<String> = buffers.iter().map(|b| format!("{:#x}", b.ptr())).collect();
    println!(
        "  [child {pid}] mapped {} buffers (at {}), checked each pattern, wrote new ones, sent an event after them",
        buffers.len(),
        addresses.join(", ")
    );
    ipc.send_event(written).context("sending the event after the writes")?;
    Ok(format!("{} buffers checked and rewritten", buffers.len()))
}

/// Receives a virtual buffer on the same channel as the pools and buffers, maps it with a
/// resource of its own (registered on the channel the first time), checks it and writes it, then
/// sends `written`, recorded after the write.
fn child_check_virtual_buffer(
    ipc: &IpcChannel,
    gpu: &Gpu,
    vmm: &mut Option<Arc<VirtualMemoryResource>>,
    written: &Event,
    patterns: Patterns,
) -> Result<String, Error> {
    if vmm.is_none() {
        let resource = VirtualMemoryResource::new(gpu.device, VirtualMemoryResourceOptions::default())?;
        ipc.import_virtual_buffers_into(Arc::clone(vmm.insert(resource)));
    }
    let mut buffer = match ipc.recv(&gpu.stream).context("receiving the virtual buffer")? {
        Received::VirtualBuffer(buffer) => buffer,
        _ => return Err("something else arrived where a virtual buffer was due".into()),
    };
    gpu.expect_words(buffer.as_buffer(), buffer.size(), patterns.expect, "the imported virtual buffer")?;
    buffer.fill(FillPattern::U32(patterns.write), &gpu.stream)?;
    written.record(&gpu.stream)?;
    println!(
        "  [child {}] mapped the virtual buffer ({} in {} chunks) at {:#x}, checked it, wrote {:#010x}, sent an event after it",
        std::process::id(),
        format_bytes(buffer.size() as u64),
        buffer.chunk_count(),
        buffer.ptr(),
        patterns.write
    );
    ipc.send_event(written).context("sending the event after the write")?;
    Ok("virtual buffer checked and rewritten".to_string())
}
