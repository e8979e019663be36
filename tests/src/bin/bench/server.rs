//! `bench --child`, the child of cases (2) and (4): takes the control socket from the data
//! channel, then answers each command on it (`resource`, `ours N`, `raw N`, `hold N`,
//! `resend N`, `release`, `lookups`, `exit`)
//! with a line: the nanoseconds its side took, the rates, or `error: …`.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::CUmemPoolPtrExportData;
use cuda_mem_core::{Buffer, Device, DevicePtr, Stream, StreamOptions};
use cuda_mem_ipc::{Channel, IpcChannel, MappedMemoryResource, Received, buffer_descriptor, registry};

use crate::Error;
use crate::child::RAW_KIND;
use crate::rates::{rate, rate_with_stream};
use crate::stats::{Stats, elapsed_ns};

/// Serves the parent until it says `exit`; an error is also sent to it as `error: …`.
pub(crate) fn child_main() -> Result<(), Error> {
    // SAFETY: started by the bench's parent through `spawn_with_channel`; nothing else adopts it.
    let ipc = IpcChannel::new(unsafe { Channel::from_env() }?);
    let message = ipc.channel().recv()?;
    let fd = message.fds.into_iter().next().ok_or("the control socket did not come")?;
    let mut control = BufReader::new(UnixStream::from(fd));
    let mut reply_to = control.get_ref().try_clone()?;
    let result = serve(&ipc, &mut control, &mut reply_to);
    if let Err(error) = &result {
        let _ = reply_to.write_all(format!("error: {}\n", error.to_string().replace('\n', " ")).as_bytes());
    }
    result
}

/// What the commands share: the channel, the stream they work on, the pool received and the
/// buffers `hold` keeps (which `resend` finds again).
struct Server<'a> {
    ipc: &'a IpcChannel,
    device: Device,
    stream: Stream,
    resource: Option<Arc<MappedMemoryResource>>,
    held: Vec<Buffer>,
}

/// The command loop.
fn serve(ipc: &IpcChannel, control: &mut BufReader<UnixStream>, reply: &mut UnixStream) -> Result<(), Error> {
    let device = Device::new(0)?;
    device.set_current()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let mut server = Server { ipc, device, stream, resource: None, held: Vec::new() };
    let mut line = String::new();
    loop {
        line.clear();
        if control.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut words = line.split_whitespace();
        let answer = match (words.next(), words.next().map(str::parse::<usize>)) {
            (Some("resource"), None) => server.resource()?,
            (Some("ours"), Some(Ok(batch))) => server.ours(batch)?,
            (Some("hold"), Some(Ok(batch))) => server.hold(batch)?,
            (Some("resend"), Some(Ok(batch))) => server.resend(batch)?,
            (Some("release"), None) => server.release()?,
            (Some("raw"), Some(Ok(batch))) => server.raw(batch)?,
            (Some("lookups"), None) => server.lookups()?,
            (Some("exit"), None) => return Ok(()),
            _ => return Err(format!("unknown command {:?}", line.trim_end()).into()),
        };
        reply.write_all(format!("{answer}\n").as_bytes())?;
    }
}

impl Server<'_> {
    /// `resource`: receives the pool.
    fn resource(&mut self) -> Result<String, Error> {
        let Received::Resource(r) = self.ipc.recv(&self.stream)? else { return Err("expected the pool".into()) };
        self.resource = Some(r);
        Ok("ok".to_string())
    }

    /// The next message's buffers, `batch` of them.
    fn buffers(&self, batch: usize) -> Result<Vec<Buffer>, Error> {
        let Received::Buffers(buffers) = self.ipc.recv(&self.stream)? else { return Err("expected buffers".into()) };
        if buffers.len() != batch {
            return Err(format!("expected {batch} buffers, got {}", buffers.len()).into());
        }
        Ok(buffers)
    }

    /// `ours N`: receives N buffers through our layer and frees them; answers the receive's time.
    fn ours(&mut self, batch: usize) -> Result<String, Error> {
        let start = Instant::now();
        let buffers = self.buffers(batch)?;
        let took = elapsed_ns(start);
        drop(buffers);
        self.stream.synchronize()?;
        Ok(format!("{took:.0}"))
    }

    /// `hold N`: receives N buffers and keeps them.
    fn hold(&mut self, batch: usize) -> Result<String, Error> {
        self.held = self.buffers(batch)?;
        Ok("ok".to_string())
    }

    /// `resend N`: the buffers `hold` keeps, sent again: found, not imported.
    fn resend(&mut self, batch: usize) -> Result<String, Error> {
        let start = Instant::now();
        let Received::Buffers(buffers) = self.ipc.recv(&self.stream)? else { return Err("expected buffers".into()) };
        let took = elapsed_ns(start);
        if buffers.len() != batch || buffers.iter().zip(&self.held).any(|(again, kept)| again.ptr() != kept.ptr()) {
            return Err(format!("expected the {batch} held buffers again").into());
        }
        drop(buffers);
        self.stream.synchronize()?;
        Ok(format!("{took:.0}"))
    }

    /// `release`: frees what `hold` kept.
    fn release(&mut self) -> Result<String, Error> {
        self.held.clear();
        self.stream.synchronize()?;
        Ok("ok".to_string())
    }

    /// `raw N`: N exports of 64 bytes in one message, imported with the raw driver call and
    /// freed; answers the receive and imports' time.
    fn raw(&mut self, batch: usize) -> Result<String, Error> {
        let d = cuda_mem_core::driver()?;
        let pool = self.resource.as_ref().ok_or("no pool yet")?.imported_pool().handle();
        let start = Instant::now();
        let message = self.ipc.channel().recv()?;
        let mut pointers = Vec::with_capacity(batch);
        for chunk in message.payload.chunks_exact(64) {
            let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
            data.reserved.copy_from_slice(chunk);
            let mut ptr: DevicePtr = 0;
            // SAFETY: valid out-pointer and export data; `pool` is a live imported pool.
            unsafe { cu_call!(d, cuMemPoolImportPointer(&mut ptr, pool, &mut data)) }?;
            pointers.push(ptr);
        }
        let took = elapsed_ns(start);
        if message.kind != RAW_KIND || pointers.len() != batch {
            return Err(format!("expected {batch} raw exports, got {}", pointers.len()).into());
        }
        for ptr in pointers {
            // SAFETY: an imported pointer, unmapped once, used by no work.
            unsafe { cu_call!(d, cuMemFreeAsync(ptr, self.stream.handle())) }?;
        }
        self.stream.synchronize()?;
        Ok(format!("{took:.0}"))
    }

    /// `lookups`: with one buffer received, the registry's lookups and the duplicate imports per
    /// second on 1 and 8 threads, answered as [`push_rate`] writes them.
    fn lookups(&mut self) -> Result<String, Error> {
        let resource = self.resource.as_ref().ok_or("no pool yet")?;
        let held = self.buffers(1)?.pop().ok_or("expected a buffer")?;
        let descriptor = buffer_descriptor(&held)?;
        let uuid = resource.uuid();
        let mut out = String::new();
        for threads in [1usize, 8] {
            let rate = rate(threads, 200_000, |_| {
                let found = registry().get(uuid)?;
                std::hint::black_box(found);
                Ok(())
            })?;
            push_rate(&mut out, "lookup", threads, &rate);
            let rate = rate_with_stream(self.device, threads, 20_000, |stream| {
                let again = resource.import_buffer(&descriptor, stream)?;
                drop(again);
                Ok(())
            })?;
            push_rate(&mut out, "import", threads, &rate);
        }
        drop(held);
        self.stream.synchronize()?;
        Ok(out)
    }
}

/// Appends one rate to the `lookups` reply: `WHAT,THREADS,MEDIAN,P10,P90,N;`.
fn push_rate(out: &mut String, what: &str, threads: usize, rate: &Stats) {
    let _ = write!(out, "{what},{threads},{:.0},{:.0},{:.0},{};", rate.median, rate.p10, rate.p90, rate.n);
}
