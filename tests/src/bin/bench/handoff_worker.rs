//! `bench --handoff-worker`, a worker of case (11) (see [`crate::handoff`]): takes its channel
//! from the environment, and a second one the parent sends on it first (the parent's async server
//! uses that one, its blocking server the first, so that both serve the same processes); then
//! hands every buffer it is lent on either straight back (`recv` → `give_back`), until the Data
//! message [`STOP`] (or the parent closing a channel). After the Data message [`RAW`] on the first
//! channel it serves the raw baseline there instead: frames of export data, imported, freed and
//! answered by hand through the driver, until a [`RAW_END_KIND`] frame.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use cuda_mem_core::sys::types::{CUmemAllocationHandleType, CUmemPoolPtrExportData, CUmemoryPool};
use cuda_mem_core::sys::{Driver, cu_call};
use cuda_mem_core::{Device, DevicePtr, Stream, StreamOptions};
use cuda_mem_ipc::{Channel, IpcChannel, IpcError, MappedMemoryResource, Received};

use crate::Error;

/// The Data message that ends a worker.
pub(crate) const STOP: &[u8] = b"stop";
/// The Data message that switches a worker to the raw baseline.
pub(crate) const RAW: &[u8] = b"raw";
/// A raw hand-off: 64 bytes of `cuMemPoolExportPointer` data, of the first pool the worker
/// received through our layer (the parent's main pool).
pub(crate) const RAW_HANDOFF_KIND: u16 = 110;
/// A raw first send: the pool's descriptor (`cuMemPoolExportToShareableHandle`) and 64 bytes of
/// export data of one of its buffers.
pub(crate) const RAW_FIRST_KIND: u16 = 111;
/// The worker's answer to a raw frame: the same 64 bytes, once its import is freed and done.
pub(crate) const RAW_RETURNED_KIND: u16 = 112;
/// Back from the raw baseline to our layer.
pub(crate) const RAW_END_KIND: u16 = 113;
/// The first message on the first channel: the second channel's socket.
pub(crate) const SECOND_CHANNEL_KIND: u16 = 114;

/// The driver's handle type for a pool shared by file descriptor.
const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Serves the parent until [`STOP`], then destroys the pools the raw first sends imported.
pub(crate) fn handoff_worker_main() -> Result<(), Error> {
    // SAFETY: started by case (11) through `spawn_with_channel`; nothing else adopts it.
    let first = unsafe { Channel::from_env() }?;
    let message = first.recv()?;
    let fd = message.fds.into_iter().next().ok_or("the second channel did not come")?;
    if message.kind != SECOND_CHANNEL_KIND {
        return Err(format!("expected the second channel, got a frame of kind {}", message.kind).into());
    }
    let second = Channel::from_stream(UnixStream::from(fd))?;
    let device = Device::new(0)?;
    device.set_current()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let mut worker = Worker {
        d: cuda_mem_core::driver()?,
        ipc: [IpcChannel::new(first), IpcChannel::new(second)],
        stream,
        main: None,
        raw_pools: Vec::new(),
    };
    let served = worker.serve();
    worker.destroy_raw_pools();
    served
}

/// A worker's state: its channel and stream, the pool the raw hand-offs import from, and the
/// pools the raw first sends imported (with the descriptor each keeps open).
struct Worker {
    d: &'static Driver,
    /// The blocking server's channel (and the raw baseline's), and the async server's.
    ipc: [IpcChannel; 2],
    stream: Stream,
    /// The first pool received through our layer: the one the parent's raw hand-offs export from.
    main: Option<Arc<MappedMemoryResource>>,
    raw_pools: Vec<(CUmemoryPool, OwnedFd)>,
}

impl Worker {
    /// Our layer's loop: waits for either channel, then serves one message of it; pools are
    /// kept (by the channel), buffers handed back at once.
    fn serve(&mut self) -> Result<(), Error> {
        loop {
            let readable = {
                let flags = rustix::event::PollFlags::IN;
                let mut fds = self.ipc.each_ref().map(|ipc| rustix::event::PollFd::new(ipc.channel(), flags));
                rustix::event::poll(&mut fds, None)?;
                fds.map(|fd| !fd.revents().is_empty())
            };
            for which in (0..2).filter(|&i| readable[i]) {
                let ipc = &self.ipc[which];
                match ipc.recv(&self.stream) {
                    Ok(Received::Resource(resource)) => {
                        self.main.get_or_insert(resource);
                    }
                    Ok(Received::Buffers(buffers)) => ipc.give_back(buffers, &self.stream)?,
                    Ok(Received::Data(bytes)) if bytes == STOP => return Ok(()),
                    Ok(Received::Data(bytes)) if bytes == RAW && which == 0 => self.raw()?,
                    Ok(_) => return Err("a hand-off worker got a message it does not serve".into()),
                    // The parent went away: nothing is lent any more (its loans end with it).
                    Err(IpcError::PeerClosed) => return Ok(()),
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }

    /// The raw baseline's loop: each frame's buffer imported with `cuMemPoolImportPointer`,
    /// freed with `cuMemFreeAsync`, the stream synchronized (the driver's rule before the
    /// exporter may free), then answered.
    fn raw(&mut self) -> Result<(), Error> {
        let d = self.d;
        loop {
            // Waited for as the loop of our layer waits (so neither pays a call the other does not).
            let mut fds = [rustix::event::PollFd::new(self.ipc[0].channel(), rustix::event::PollFlags::IN)];
            rustix::event::poll(&mut fds, None)?;
            let message = self.ipc[0].channel().recv()?;
            let pool = match message.kind {
                RAW_END_KIND => return Ok(()),
                RAW_HANDOFF_KIND => {
                    self.main.as_ref().ok_or("a raw hand-off before any pool")?.imported_pool().handle()
                }
                RAW_FIRST_KIND => {
                    let fd = message.fds.into_iter().next().ok_or("a raw first send without its pool")?;
                    let mut pool: CUmemoryPool = std::ptr::null_mut();
                    // The driver takes the descriptor as a pointer-sized integer.
                    let raw_fd = fd.as_raw_fd() as isize as *mut std::ffi::c_void;
                    // SAFETY: a valid out-pointer; `fd` is open for the call (and the pool's life).
                    unsafe { cu_call!(d, cuMemPoolImportFromShareableHandle(&mut pool, raw_fd, POSIX_FD, 0)) }?;
                    self.raw_pools.push((pool, fd));
                    pool
                }
                other => return Err(format!("unexpected raw frame kind {other}").into()),
            };
            let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
            if message.payload.len() != data.reserved.len() {
                return Err(format!("a raw frame of {} bytes, not 64", message.payload.len()).into());
            }
            data.reserved.copy_from_slice(&message.payload);
            let mut ptr: DevicePtr = 0;
            // SAFETY: valid out-pointer and export data; `pool` is a live imported pool.
            unsafe { cu_call!(d, cuMemPoolImportPointer(&mut ptr, pool, &mut data)) }?;
            // SAFETY: an imported pointer, used by no work, freed once.
            unsafe { cu_call!(d, cuMemFreeAsync(ptr, self.stream.handle())) }?;
            // SAFETY: a live stream.
            unsafe { cu_call!(d, cuStreamSynchronize(self.stream.handle())) }?;
            self.ipc[0].channel().send(RAW_RETURNED_KIND, &message.payload, &[])?;
        }
    }

    /// Destroys the raw first sends' pools (nothing of them is mapped any more), then closes their
    /// descriptors.
    fn destroy_raw_pools(&mut self) {
        for (pool, fd) in self.raw_pools.drain(..) {
            // SAFETY: imported by `raw`, destroyed once; every import from it was freed.
            let _ = unsafe { cu_call!(self.d, cuMemPoolDestroy(pool)) };
            drop(fd);
        }
    }
}
