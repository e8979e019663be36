//! What both processes use: device 0, a stream on it, and pinned host memory to read results
//! back through, with the check that a buffer holds a word over and over.

use std::sync::Arc;

use cuda_mem_core::{
    Buffer, Device, LegacyPinnedMemoryResource, MemoryResource, MemoryResourceExt, PinnedMemoryResource, Stream,
    StreamOptions,
};

use crate::Error;
use crate::errors::Context;

/// What a host buffer holds before a download, so that a copy that never happened shows.
const SENTINEL: u8 = 0xA5;

/// Device 0, a stream on it, and pinned host memory to read results back through.
pub(crate) struct Gpu {
    /// Device 0.
    pub(crate) device: Device,
    /// A non-blocking stream on it.
    pub(crate) stream: Stream,
    /// Where results are read back through.
    staging: Arc<dyn MemoryResource>,
    /// What `staging` is, in words.
    pub(crate) staging_kind: &'static str,
}

impl Gpu {
    /// Device 0 (its primary context made current), a non-blocking stream, and the current
    /// pinned pool (or `cuMemAllocHost` where the driver has no pinned pools).
    pub(crate) fn open() -> Result<Gpu, Error> {
        let device = Device::new(0)?;
        device.set_current()?;
        let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
        let (staging, staging_kind): (Arc<dyn MemoryResource>, _) = match PinnedMemoryResource::current() {
            Ok(pinned) => (pinned, "the current pinned pool (PinnedMemoryResource::current)"),
            Err(_) => (
                LegacyPinnedMemoryResource::new(device),
                "cuMemAllocHost (LegacyPinnedMemoryResource: this driver has no pinned pools)",
            ),
        };
        Ok(Gpu { device, stream, staging, staging_kind })
    }

    /// Copies `buffer` to pinned host memory and checks that its first `len` bytes hold `word`
    /// over and over.
    pub(crate) fn expect_words(&self, buffer: &Buffer, len: usize, word: u32, what: &str) -> Result<(), Error> {
        let mut host = self.staging.allocate(buffer.size(), &self.stream).context("allocating pinned memory")?;
        host.host_slice_mut()?.fill(SENTINEL);
        host.copy_from(buffer, &self.stream).context(format!("copying {what} to pinned memory"))?;
        let bytes = host.host_slice()?;
        let prefix = bytes.get(..len).ok_or_else(|| format!("{what}: {len} bytes to check in {}", bytes.len()))?;
        check_words(prefix, word).map_err(|e| format!("{what}: {e}").into())
    }
}

/// Checks that `bytes` is `word` repeated, describing the mismatches.
fn check_words(bytes: &[u8], word: u32) -> Result<(), String> {
    let expected = word.to_ne_bytes();
    let mut mismatches = bytes.chunks(4).enumerate().filter(|(_, w)| *w != expected.as_slice());
    let Some((first, got)) = mismatches.next() else {
        return Ok(());
    };
    let count = 1 + mismatches.count();
    let got_hex: String = got.iter().rev().map(|b| format!("{b:02x}")).collect();
    let sentinel = if got.iter().all(|&b| b == SENTINEL) { " (the sentinel: nothing was copied there)" } else { "" };
    Err(format!(
        "{count} of {} words differ; the first at byte {}: got 0x{got_hex}, expected {word:#010x}{sentinel}",
        bytes.len().div_ceil(4),
        first * 4
    ))
}
