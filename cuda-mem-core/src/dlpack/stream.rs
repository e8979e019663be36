//! DLPack's stream exchange: the consumer names the stream it will use the tensor on
//! ([`ConsumerStream`]), and the producer makes that stream wait for the work that wrote the
//! data.

use cuda_mem_sys::types::CUstream;

use crate::buffer::Buffer;
use crate::device::Device;
use crate::error::Result;
use crate::stream::Stream;

/// The stream a DLPack consumer will use an exported tensor on, as the Python array API's
/// `__dlpack__(stream=…)` names it (and cuda.core's `Buffer.__dlpack__`, which takes the same
/// argument).
///
/// Unless it is [`NoSync`](ConsumerStream::NoSync), the export makes that stream wait (with an
/// event on each) for the work enqueued so far through the buffer, on its allocation stream and
/// every stream it was used on; and the buffer records the consumer's stream as a use, so that
/// when the consumer calls the tensor's deleter the memory is freed only after the work the
/// consumer enqueued on that stream.
#[derive(Debug, Clone, Copy, Default)]
pub enum ConsumerStream<'s> {
    /// No synchronization (the protocol's `-1`): the consumer orders its work after the
    /// producer's, and its work before calling the deleter, itself.
    NoSync,
    /// The legacy default stream of the memory's device (the protocol's `1`, and what `None`
    /// means for CUDA).
    #[default]
    LegacyDefault,
    /// The exporting thread's per-thread default stream (the protocol's `2`).
    PerThreadDefault,
    /// A stream of this crate.
    Stream(&'s Stream),
    /// A raw stream handle (the protocol's other integers: a `cudaStream_t`).
    Raw(RawStream),
}

/// A raw stream handle a DLPack consumer passes (a `CUstream`/`cudaStream_t`, as an integer in
/// Python), vouched for by whoever makes it.
#[derive(Debug, Clone, Copy)]
pub struct RawStream(CUstream);

impl RawStream {
    /// Wraps a consumer's stream handle.
    ///
    /// # Safety
    /// `handle` is a live stream of the memory's device (its primary context) and stays alive
    /// until the tensor's deleter has been called: the export enqueues a wait on it, and the
    /// buffer's free records an event on it.
    pub unsafe fn new(handle: CUstream) -> RawStream {
        RawStream(handle)
    }

    /// The handle.
    pub fn handle(&self) -> CUstream {
        self.0
    }
}

impl ConsumerStream<'_> {
    /// The consumer's stream, on `device`; `None` for [`NoSync`](ConsumerStream::NoSync).
    fn resolve(&self, device: Device) -> Option<Stream> {
        match *self {
            ConsumerStream::NoSync => None,
            ConsumerStream::LegacyDefault => Some(Stream::legacy_default(device)),
            ConsumerStream::PerThreadDefault => Some(Stream::per_thread_default(device)),
            ConsumerStream::Stream(stream) => Some(stream.clone()),
            // SAFETY: the maker of the `RawStream` vouched that it is a live stream of the
            // memory's device that outlives every use through the returned value (the wait
            // below, and the buffer's free, which the deleter causes).
            ConsumerStream::Raw(raw) => Some(unsafe { Stream::from_raw(raw.0, device) }),
        }
    }
}

/// Makes the consumer's stream wait for the work enqueued so far through `buffer`, and records
/// it as a use of the buffer. `device` names the default streams (the memory's device, or for
/// host memory the allocation stream's).
pub(crate) fn hand_over(buffer: &Buffer, consumer: ConsumerStream<'_>, device: Device) -> Result<()> {
    match consumer.resolve(device) {
        Some(stream) => buffer.order_before(&stream),
        None => Ok(()),
    }
}
