//! Copies with options, one at a time or many in one driver call (cuda.core 1.2's
//! `CopyOptions`, `Buffer.copy_to(…, options=…)` and `cuda.core.utils.copy_batch`).
//!
//! The overview and an example are on [`CopyOptions`].

use cuda_mem_sys::types::{CUmemLocation, CUmemcpyAttributes, CUmemcpyFlags, CUmemcpySrcAccessOrder, CUstream};
use cuda_mem_sys::{Driver, LoadError, StreamMode};

use crate::buffer::ScopedBuffer;
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::driver_version::DriverCapability;
use crate::error::{CopyError, Error, OverlapKind, Result};
use crate::ffi;
use crate::location::Location;
use crate::stream::Stream;
use crate::view::{DeviceView, DeviceViewMut};

/// When a copy may read its source (`CUmemcpySrcAccessOrder`; cuda.core's
/// `MemcpySrcAccessOrder`). The destination is always written in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[doc(alias = "MemcpySrcAccessOrder")]
pub enum SourceAccessOrder {
    /// In stream order: work enqueued earlier may still be writing the source.
    #[default]
    Stream,
    /// Out of stream order, all reads done before the call returns: the source may be reused
    /// at once (for short-lived host data). No earlier work may still be using the source.
    #[doc(alias = "DURING_API_CALL")]
    DuringApiCall,
    /// Out of stream order, possibly after the call returns: keep the source unchanged until the
    /// copy completes. No earlier work may still be using the source.
    Any,
}

/// Whether a copy should overlap with compute work (`CUmemcpyFlags`; cuda.core's
/// `MemcpyOverlapMode`). A hint the driver may ignore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[doc(alias = "MemcpyOverlapMode")]
pub enum OverlapMode {
    /// The driver's default scheduling.
    #[default]
    Default,
    /// Prefer overlapping with compute work on the SMs.
    PreferOverlapWithCompute,
}

/// How a copy is done (cuda.core's `CopyOptions`); the default is a plain stream-ordered copy.
/// Options change how the driver stages a transfer, not the bytes it produces, with one
/// exception the caller answers for: a source read out of stream order
/// ([`SourceAccessOrder::DuringApiCall`], [`SourceAccessOrder::Any`]) is read without waiting
/// for the work already enqueued, so bytes that work still writes may be read as they were.
///
/// - [`CopyOptions`]: the source access order ([`SourceAccessOrder`]), location hints for the
///   source and the destination (a [`Location`], honoured only for managed memory on devices
///   with concurrent managed access), and the overlap preference ([`OverlapMode`]). The
///   default is a plain stream-ordered copy.
/// - [`ScopedBuffer::copy_to_with`], [`ScopedBuffer::copy_from_with`] and
///   [`DeviceViewMut::copy_from_with`]: one copy through `cuMemcpyWithAttributesAsync` (a CUDA
///   13.2 driver).
/// - [`copy_batch`]: many copies ([`BatchCopy`]) in one `cuMemcpyBatchAsync` (a CUDA 13.0
///   driver), with one set of options for all or one per copy ([`BatchOptions`]).
///
/// Refused before any driver call, with a [`CopyError`] (inside [`Error::Copy`]): the legacy
/// default stream (both driver calls reject it; the per-thread default stream is a real stream
/// and is accepted), a capturing stream (no graph node represents these copies: copy without
/// options while capturing), copies of one batch that overlap (the driver runs them in any
/// order). As cuda.core does, a driver too old for the call when the options need it is
/// refused too. On an older driver the options fall back to plain `cuMemcpyAsync` copies, as cuda.core's do:
/// [`SourceAccessOrder::Stream`] and [`SourceAccessOrder::Any`] are honoured by a
/// stream-ordered copy and the hints are only hints, but
/// [`SourceAccessOrder::DuringApiCall`] promises that the source may be reused when the call
/// returns, which a stream-ordered copy cannot keep: it is refused with
/// [`Error::DriverTooOld`] ([`DriverCapability::CopyBatches`],
/// [`DriverCapability::CopiesWithAttributes`]), which names the version needed and the one
/// installed. A driver that reports a version new enough but lacks the function gives the
/// loader's error ([`CudaError::Load`](crate::sys::CudaError::Load)) instead. An empty
/// batch is [`Error::EmptyBatch`]; sizes that differ are [`Error::SizeMismatch`].
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{
///     BatchCopy, CopyOptions, Device, DeviceMemoryResource, PinnedMemoryResource, SourceAccessOrder, Stream,
///     StreamOptions, copy_batch,
/// };
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let pinned = PinnedMemoryResource::current()?;
/// let mut staging = pinned.allocate(8, &stream)?;
/// staging.host_slice_mut()?.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
/// let (mut a, mut b) = (pool.allocate(8, &stream)?, pool.allocate(4, &stream)?);
///
/// // Both copies in one cuMemcpyBatchAsync; the source is read before the call returns, so the
/// // staging buffer may be written again at once.
/// let during_call = CopyOptions::default().src_access_order(SourceAccessOrder::DuringApiCall);
/// copy_batch(
///     &stream,
///     [BatchCopy::new(&staging, &mut a)?, BatchCopy::range(&staging, 4, &mut b)?],
///     during_call,
/// )?;
/// staging.host_slice_mut()?.fill(0);
/// assert_eq!(a.to_vec::<u8>(&stream)?, [1, 2, 3, 4, 5, 6, 7, 8]);
/// assert_eq!(b.to_vec::<u8>(&stream)?, [5, 6, 7, 8]);
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CopyOptions {
    /// When the source may be read.
    pub src_access_order: SourceAccessOrder,
    /// Where the source is expected to be (managed memory only; not a prefetch, not advice).
    pub src_location_hint: Option<Location>,
    /// Where the destination is expected to be (as the source's hint).
    pub dst_location_hint: Option<Location>,
    /// Whether to prefer overlapping with compute work.
    pub overlap_mode: OverlapMode,
}

impl CopyOptions {
    /// With this source access order.
    pub fn src_access_order(mut self, order: SourceAccessOrder) -> Self {
        self.src_access_order = order;
        self
    }

    /// With this hint for the source's location.
    pub fn src_location_hint(mut self, location: impl Into<Location>) -> Self {
        self.src_location_hint = Some(location.into());
        self
    }

    /// With this hint for the destination's location.
    pub fn dst_location_hint(mut self, location: impl Into<Location>) -> Self {
        self.dst_location_hint = Some(location.into());
        self
    }

    /// With this overlap preference.
    pub fn overlap_mode(mut self, mode: OverlapMode) -> Self {
        self.overlap_mode = mode;
        self
    }

    /// The driver's form.
    fn raw(&self) -> CUmemcpyAttributes {
        use CUmemcpySrcAccessOrder as O;
        let hint = |location: Option<Location>| location.map_or_else(CUmemLocation::default, Location::raw);
        CUmemcpyAttributes {
            srcAccessOrder: match self.src_access_order {
                SourceAccessOrder::Stream => O::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                SourceAccessOrder::DuringApiCall => O::CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL,
                SourceAccessOrder::Any => O::CU_MEMCPY_SRC_ACCESS_ORDER_ANY,
            },
            srcLocHint: hint(self.src_location_hint),
            dstLocHint: hint(self.dst_location_hint),
            flags: match self.overlap_mode {
                OverlapMode::Default => CUmemcpyFlags::CU_MEMCPY_FLAG_DEFAULT.0,
                OverlapMode::PreferOverlapWithCompute => CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE.0,
            },
        }
    }
}

/// The options of a batch: one set for every copy, or one per copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOptions<'o> {
    /// The same options for every copy.
    Same(CopyOptions),
    /// Options `i` for copy `i` (as many as copies).
    PerCopy(&'o [CopyOptions]),
}

impl Default for BatchOptions<'_> {
    fn default() -> Self {
        BatchOptions::Same(CopyOptions::default())
    }
}

impl From<CopyOptions> for BatchOptions<'_> {
    fn from(options: CopyOptions) -> Self {
        BatchOptions::Same(options)
    }
}

impl<'o> From<&'o [CopyOptions]> for BatchOptions<'o> {
    fn from(options: &'o [CopyOptions]) -> Self {
        BatchOptions::PerCopy(options)
    }
}

impl<'o, const N: usize> From<&'o [CopyOptions; N]> for BatchOptions<'o> {
    fn from(options: &'o [CopyOptions; N]) -> Self {
        BatchOptions::PerCopy(options)
    }
}

/// One side of a copy: bytes of a buffer.
#[derive(Debug, Clone, Copy)]
struct Side<'a> {
    ptr: DevicePtr,
    len: usize,
    buffer: &'a ScopedBuffer<'a>,
}

/// One copy of a batch: a source range and a destination range of one size. The destination
/// is borrowed exclusively for as long as the copy is.
#[derive(Debug, Clone, Copy)]
pub struct BatchCopy<'a> {
    src: Side<'a>,
    dst: Side<'a>,
}

impl<'a> BatchCopy<'a> {
    /// All of `src` into all of `dst`, which must be of one size (a larger source is not cut
    /// short: copy a part of it with [`range`](BatchCopy::range)).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] unless the sizes agree, whichever is larger.
    pub fn new(src: &'a ScopedBuffer<'_>, dst: &'a mut ScopedBuffer<'_>) -> Result<BatchCopy<'a>> {
        check_sizes(src, dst)?;
        BatchCopy::range(src, 0, dst)
    }

    /// `src`'s bytes from `offset` on, as many as `dst` holds, into all of `dst`: a part of a
    /// larger source, named explicitly.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when `src` has fewer than that many bytes from `offset`.
    pub fn range(src: &'a ScopedBuffer<'_>, offset: usize, dst: &'a mut ScopedBuffer<'_>) -> Result<BatchCopy<'a>> {
        let available = src.size().saturating_sub(offset);
        if available < dst.size() || offset > src.size() {
            return Err(Error::SizeMismatch { what: "the source range", expected: dst.size(), actual: available });
        }
        let (src, dst): (&'a ScopedBuffer<'a>, &'a ScopedBuffer<'a>) = (shorten(src), shorten(dst));
        Ok(BatchCopy {
            src: Side { ptr: src.ptr() + offset as DevicePtr, len: dst.size(), buffer: src },
            dst: Side { ptr: dst.ptr(), len: dst.size(), buffer: dst },
        })
    }

    /// The elements of `src` into `dst` (views of buffers, any [`bytemuck::Pod`] `T`).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] unless the lengths agree.
    pub fn views<T: bytemuck::Pod>(
        src: &DeviceView<'a, T>,
        dst: &'a mut DeviceViewMut<'_, T>,
    ) -> Result<BatchCopy<'a>> {
        if src.len() != dst.len() {
            return Err(Error::SizeMismatch {
                what: "the destination view",
                expected: src.byte_len(),
                actual: dst.byte_len(),
            });
        }
        Ok(BatchCopy {
            src: Side { ptr: src.ptr(), len: src.byte_len(), buffer: src.buffer() },
            dst: Side { ptr: dst.ptr(), len: dst.byte_len(), buffer: shorten(dst.buffer()) },
        })
    }

    /// The number of bytes copied.
    pub fn len(&self) -> usize {
        self.dst.len
    }

    /// Whether it copies nothing.
    pub fn is_empty(&self) -> bool {
        self.dst.len == 0
    }
}

/// A buffer borrowed for `'a`, as one whose resource is borrowed for `'a` too (a buffer is
/// covariant in its resource's lifetime, and `'r` outlives the borrow).
fn shorten<'a, 'r: 'a>(buffer: &'a ScopedBuffer<'r>) -> &'a ScopedBuffer<'a> {
    buffer
}

/// The first pair of copies that overlap, if any: two destinations sharing a byte, or a
/// destination sharing one with another copy's source (a copy's own source and destination are
/// not compared; empty ranges overlap nothing). Each copy is `(destination, source, length)`.
pub(crate) fn find_overlap(copies: &[(u64, u64, usize)]) -> Option<(usize, usize, OverlapKind)> {
    let end = |start: u64, len: usize| start.saturating_add(len as u64);
    let mut dsts: Vec<(u64, u64, usize)> =
        copies.iter().enumerate().filter(|(_, c)| c.2 > 0).map(|(i, c)| (c.0, end(c.0, c.2), i)).collect();
    dsts.sort_unstable();
    for pair in dsts.windows(2) {
        if pair[1].0 < pair[0].1 {
            let (a, b) = (pair[0].2.min(pair[1].2), pair[0].2.max(pair[1].2));
            return Some((a, b, OverlapKind::Destinations));
        }
    }
    // The destinations are disjoint and sorted: the ones a source meets are consecutive.
    for (reader, &(_, src, len)) in copies.iter().enumerate().filter(|(_, c)| c.2 > 0) {
        let src_end = end(src, len);
        let first = dsts.partition_point(|&(_, dst_end, _)| dst_end <= src);
        let hit = dsts[first..].iter().take_while(|&&(start, _, _)| start < src_end).find(|d| d.2 != reader);
        if let Some(&(_, _, writer)) = hit {
            return Some((writer, reader, OverlapKind::DestinationAndSource));
        }
    }
    None
}

/// The first copy (of `(dst, src, len)` ranges) whose source and destination share a byte.
pub(crate) fn find_self_overlap(copies: &[(u64, u64, usize)]) -> Option<usize> {
    copies.iter().position(|&(dst, src, len)| {
        let end = |start: u64| start.saturating_add(len as u64);
        len > 0 && dst < end(src) && src < end(dst)
    })
}

/// The options of each copy, checked against the number of copies.
fn per_copy(options: BatchOptions<'_>, copies: usize) -> Result<Vec<CopyOptions>> {
    match options {
        BatchOptions::Same(options) => Ok(vec![options; copies]),
        BatchOptions::PerCopy(list) if list.len() != copies => {
            Err(CopyError::OptionsLengthMismatch { copies, options: list.len() }.into())
        }
        BatchOptions::PerCopy(list) => Ok(list.to_vec()),
    }
}

/// The driver's attribute table: each run of equal options once, with the index of its first
/// copy (`attrs`, `attrsIdxs`).
fn attribute_table(options: &[CopyOptions]) -> (Vec<CUmemcpyAttributes>, Vec<usize>) {
    let (mut table, mut first) = (Vec::new(), Vec::new());
    for (i, o) in options.iter().enumerate() {
        if i == 0 || options[i - 1] != *o {
            table.push(o.raw());
            first.push(i);
        }
    }
    (table, first)
}

/// The stream a copy with options runs on, checked: not the legacy default stream, not
/// capturing. Binds what the handle needs.
fn checked_stream<'s>(stream: &'s Stream, d: &Driver, operation: &'static str) -> Result<std::borrow::Cow<'s, Stream>> {
    let stream = stream.on_calling_thread();
    let handle = stream.handle();
    let legacy = handle == crate::stream::LEGACY || (handle.is_null() && d.options().stream_mode == StreamMode::Legacy);
    if legacy {
        return Err(CopyError::LegacyStream { operation }.into());
    }
    stream.bind_if_default()?;
    // The same knowledge the pools use: the driver is asked only where this crate cannot know.
    if stream.refuses_allocation()? {
        return Err(CopyError::Capturing { operation }.into());
    }
    Ok(stream)
}

/// The driver's entry point `get` gives when the driver has `capability`; `None` (the
/// plain-copy fallback) otherwise, or [`Error::DriverTooOld`] when the options need the entry
/// point. A driver that reports a version new enough but lacks the function falls back too, or,
/// when the options need it, gives the loader's error (which names the function): the version
/// is not what is missing.
fn entry_point<F>(
    d: &Driver,
    get: impl FnOnce(&Driver) -> std::result::Result<F, LoadError>,
    capability: DriverCapability,
    needed: bool,
) -> Result<Option<F>> {
    let installed = d.version()?;
    if installed < capability.needs() {
        return if needed { Err(capability.too_old(installed)) } else { Ok(None) };
    }
    match get(d) {
        Ok(f) => Ok(Some(f)),
        Err(error) if needed => Err(error.into()),
        Err(_) => Ok(None),
    }
}

/// Whether any of `options` reads its source during the call (which a fallback cannot keep).
fn needs_native(options: &[CopyOptions]) -> bool {
    options.iter().any(|o| o.src_access_order == SourceAccessOrder::DuringApiCall)
}

/// Enqueues `copies` (non-empty lengths, checked) with plain `cuMemcpyAsync` calls.
fn plain_copies(d: &Driver, copies: &[BatchCopy<'_>], stream: CUstream) -> Result<()> {
    for copy in copies {
        // SAFETY: both ranges lie in buffers that stay valid until they are freed, which is
        // ordered after this work.
        unsafe { ffi::memcpy_async(d, copy.dst.ptr, copy.src.ptr, copy.dst.len, stream) }?;
    }
    Ok(())
}

/// Copies many ranges in one `cuMemcpyBatchAsync` on `stream` (cuda.core's
/// `utils.copy_batch`): one set of options for all, or one per copy (equal neighbours reach the
/// driver once). Like every stream operation, the batch runs after the work enqueued before it;
/// its copies run in any order among themselves, so no two may overlap (one writing bytes the
/// other reads or writes).
///
/// On a driver older than CUDA 13.0 the copies are enqueued one `cuMemcpyAsync` at a time, as
/// cuda.core does, unless an option reads its source during the call (see [`CopyOptions`]).
///
/// # Errors
/// Before any driver call:
/// - [`Error::EmptyBatch`] for no copies.
/// - Inside [`Error::Copy`]: [`CopyError::OptionsLengthMismatch`], [`CopyError::SelfOverlap`] (a
///   copy that reads what it writes, which views made with `unsafe` can express),
///   [`CopyError::Overlap`], [`CopyError::LegacyStream`] and [`CopyError::Capturing`].
/// - [`Error::DriverTooOld`] ([`DriverCapability::CopyBatches`]) before CUDA 13.0 when an option
///   reads its source during the call.
///
/// Then a driver error (memory the stream's device cannot reach, an earlier asynchronous error).
///
/// # From cuda.core
///
/// What cuda.core 1.2 writes with `CopyOptions` and `copy_batch`:
///
/// ```python
/// during_call = CopyOptions(src_access_order=MemcpySrcAccessOrder.DURING_API_CALL)
/// copy_batch(stream, [staging, staging_tail], [a, b], options=during_call)
/// staging_host[:] = 0          # the sources were read before copy_batch returned
/// a.copy_to(c, stream=stream, options=CopyOptions(dst_location_hint=device))
/// ```
///
/// is, here (a range of the source instead of a second buffer; overlapping copies in one batch
/// are refused rather than left undefined):
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{
///     BatchCopy, CopyOptions, Device, DeviceMemoryResource, PinnedMemoryResource, SourceAccessOrder, Stream,
///     StreamOptions, copy_batch,
/// };
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let mut staging = PinnedMemoryResource::new(Default::default())?.allocate(8, &stream)?;
/// staging.host_slice_mut()?.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
/// let (mut a, mut b, mut c) = (pool.allocate(8, &stream)?, pool.allocate(4, &stream)?, pool.allocate(8, &stream)?);
///
/// let during_call = CopyOptions::default().src_access_order(SourceAccessOrder::DuringApiCall);
/// copy_batch(&stream, [BatchCopy::new(&staging, &mut a)?, BatchCopy::range(&staging, 4, &mut b)?], during_call)?;
/// staging.host_slice_mut()?.fill(0); // read before copy_batch returned
/// a.copy_to_with(&mut c, &stream, CopyOptions::default().dst_location_hint(device))?;
/// assert_eq!(c.to_vec::<u8>(&stream)?, [1, 2, 3, 4, 5, 6, 7, 8]);
/// assert_eq!(b.to_vec::<u8>(&stream)?, [5, 6, 7, 8]);
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
///
/// On drivers without the calls (`cuMemcpyBatchAsync` came with CUDA 13.0,
/// `cuMemcpyWithAttributesAsync` with 13.2), options that only stream order needs fall back to
/// plain copies, as cuda.core's do; [`SourceAccessOrder::DuringApiCall`] is refused, naming the
/// version needed.
#[doc(alias = "cuMemcpyBatchAsync")]
pub fn copy_batch<'a, 'o>(
    stream: &Stream,
    copies: impl IntoIterator<Item = BatchCopy<'a>>,
    options: impl Into<BatchOptions<'o>>,
) -> Result<()> {
    const OPERATION: &str = "copy_batch";
    let copies: Vec<BatchCopy<'a>> = copies.into_iter().collect();
    if copies.is_empty() {
        return Err(Error::EmptyBatch { operation: OPERATION });
    }
    let options = per_copy(options.into(), copies.len())?;
    let ranges: Vec<(u64, u64, usize)> = copies.iter().map(|c| (c.dst.ptr, c.src.ptr, c.dst.len)).collect();
    if let Some(copy) = find_self_overlap(&ranges) {
        return Err(CopyError::SelfOverlap { copy }.into());
    }
    if let Some((first, second, kind)) = find_overlap(&ranges) {
        return Err(CopyError::Overlap { first, second, kind }.into());
    }
    let d = driver()?;
    let stream = checked_stream(stream, d, OPERATION)?;
    // Zero-byte copies copy nothing; the driver's batch is not documented to take them.
    let (copies, options): (Vec<BatchCopy<'a>>, Vec<CopyOptions>) =
        copies.into_iter().zip(options).filter(|(c, _)| !c.is_empty()).unzip();
    let batch = entry_point(d, Driver::cuMemcpyBatchAsync_v2, DriverCapability::CopyBatches, needs_native(&options))?;
    // Noted before anything is enqueued: a batch refused half-way (the fallback's third copy,
    // say) leaves the copies before it running, and the buffers' frees must wait for them.
    for copy in &copies {
        copy.src.buffer.note_use(&stream);
        copy.dst.buffer.note_use(&stream);
    }
    match batch {
        _ if copies.is_empty() => {}
        Some(f) => {
            let mut dsts: Vec<DevicePtr> = copies.iter().map(|c| c.dst.ptr).collect();
            let mut srcs: Vec<DevicePtr> = copies.iter().map(|c| c.src.ptr).collect();
            let mut sizes: Vec<usize> = copies.iter().map(|c| c.dst.len).collect();
            let (mut table, mut first) = attribute_table(&options);
            // SAFETY: each array is valid for the length passed with it; the ranges lie in
            // buffers that stay valid until they are freed, which is ordered after this work,
            // and DuringApiCall sources are read before the call returns.
            let code = unsafe {
                f(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    copies.len(),
                    table.as_mut_ptr(),
                    first.as_mut_ptr(),
                    table.len(),
                    stream.handle(),
                )
            };
            d.check("cuMemcpyBatchAsync", code)?;
        }
        None => plain_copies(d, &copies, stream.handle())?,
    }
    Ok(())
}

/// Copies between ranges of one buffer in one driver call: each `(src, dst)` copies the bytes
/// of the range `src` to as many bytes from offset `dst` (as [`slice::copy_within`], many at
/// once). The buffer is borrowed exclusively, so nothing else reads or writes it meanwhile, and
/// every range is checked: no copy reaches past the end, no copy's source meets its own
/// destination, and no two copies meet where one of them writes. As [`copy_batch`] otherwise.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{CopyOptions, Device, DeviceMemoryResource, Stream, StreamOptions, copy_batch_within};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let mut buffer = pool.allocate(8, &stream)?;
/// buffer.copy_from_slice(&[1u8, 2, 3, 4, 0, 0, 0, 0], &stream)?;
/// // The first half into the second, reversed in two pieces.
/// copy_batch_within(&stream, &mut buffer, [(0..2, 6), (2..4, 4)], CopyOptions::default())?;
/// assert_eq!(buffer.to_vec::<u8>(&stream)?, [1, 2, 3, 4, 3, 4, 1, 2]);
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
///
/// # Errors
/// - [`CopyError::OutOfRange`] for a range past the buffer's end (or one whose start is past
///   its end), naming the copy.
/// - [`CopyError::SelfOverlap`] and [`CopyError::Overlap`] for ranges that meet.
/// - As [`copy_batch`]: an empty batch, options of another length, the legacy default stream,
///   a capturing stream, an old driver, a driver error.
pub fn copy_batch_within<'o>(
    stream: &Stream,
    buffer: &mut ScopedBuffer<'_>,
    copies: impl IntoIterator<Item = (std::ops::Range<usize>, usize)>,
    options: impl Into<BatchOptions<'o>>,
) -> Result<()> {
    // Both sides of every copy are this buffer, read through one shared borrow of the
    // exclusive one: nothing else reaches the buffer while the call runs.
    let shared = shorten(&*buffer);
    let size = shared.size();
    let side = |offset: usize, len: usize| Side { ptr: shared.ptr() + offset as DevicePtr, len, buffer: shared };
    let batch = copies
        .into_iter()
        .enumerate()
        .map(|(copy, (src, dst))| {
            let len = src.end.checked_sub(src.start).filter(|_| src.end <= size);
            let dst_end = len.and_then(|len| dst.checked_add(len)).filter(|&end| end <= size);
            match (len, dst_end) {
                (Some(len), Some(_)) => Ok(BatchCopy { src: side(src.start, len), dst: side(dst, len) }),
                (None, _) => Err(CopyError::OutOfRange { copy, start: src.start, end: src.end, size }.into()),
                (Some(len), None) => {
                    Err(CopyError::OutOfRange { copy, start: dst, end: dst.saturating_add(len), size }.into())
                }
            }
        })
        .collect::<Result<Vec<_>>>()?;
    copy_batch(stream, batch, options)
}

/// One copy with options: `cuMemcpyWithAttributesAsync`, or `cuMemcpyAsync` on an older driver
/// when the options allow it.
fn copy_with(copy: BatchCopy<'_>, stream: &Stream, options: CopyOptions, operation: &'static str) -> Result<()> {
    let d = driver()?;
    let stream = checked_stream(stream, d, operation)?;
    let native = entry_point(
        d,
        Driver::cuMemcpyWithAttributesAsync,
        DriverCapability::CopiesWithAttributes,
        options.src_access_order == SourceAccessOrder::DuringApiCall,
    )?;
    // Noted before the copy is enqueued, as in `copy_batch`.
    copy.src.buffer.note_use(&stream);
    copy.dst.buffer.note_use(&stream);
    match native {
        _ if copy.is_empty() => {}
        Some(f) => {
            let mut attributes = options.raw();
            // SAFETY: `attributes` is valid for the call; the ranges lie in buffers that stay
            // valid until they are freed, which is ordered after this work, and a DuringApiCall
            // source is read before the call returns.
            let code = unsafe { f(copy.dst.ptr, copy.src.ptr, copy.dst.len, &mut attributes, stream.handle()) };
            d.check("cuMemcpyWithAttributesAsync", code)?;
        }
        None => plain_copies(d, &[copy], stream.handle())?,
    }
    Ok(())
}

impl ScopedBuffer<'_> {
    /// Copies this buffer into `dst` on `stream` with `options` (cuda.core's
    /// `buffer.copy_to(dst, stream=s, options=…)`): `cuMemcpyWithAttributesAsync`, or a plain
    /// copy on a driver older than CUDA 13.2 (see [`CopyOptions`]).
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`].
    /// - [`CopyError::LegacyStream`], [`CopyError::Capturing`], and [`Error::DriverTooOld`]
    ///   ([`DriverCapability::CopiesWithAttributes`]) before CUDA 13.2 for
    ///   [`SourceAccessOrder::DuringApiCall`], before any driver call.
    /// - A driver error.
    pub fn copy_to_with(&self, dst: &mut ScopedBuffer<'_>, stream: &Stream, options: CopyOptions) -> Result<()> {
        copy_with(BatchCopy::new(self, dst)?, stream, options, "copy_to_with")
    }

    /// Copies `src` into this buffer on `stream` with `options` (cuda.core's
    /// `buffer.copy_from(src, stream=s, options=…)`), as [`copy_to_with`](ScopedBuffer::copy_to_with).
    ///
    /// # Errors
    /// As [`copy_to_with`](ScopedBuffer::copy_to_with).
    pub fn copy_from_with(&mut self, src: &ScopedBuffer<'_>, stream: &Stream, options: CopyOptions) -> Result<()> {
        copy_with(BatchCopy::new(src, self)?, stream, options, "copy_from_with")
    }
}

/// [`Error::SizeMismatch`] unless `src` and `dst` have one size (the wording of
/// [`ScopedBuffer::copy_to`]'s).
fn check_sizes(src: &ScopedBuffer<'_>, dst: &ScopedBuffer<'_>) -> Result<()> {
    if src.size() == dst.size() {
        Ok(())
    } else {
        Err(Error::SizeMismatch { what: "the destination buffer", expected: src.size(), actual: dst.size() })
    }
}

impl<T: bytemuck::Pod> DeviceViewMut<'_, T> {
    /// Copies `src` into this view on `stream` with `options`, as
    /// [`ScopedBuffer::copy_to_with`].
    ///
    /// # Errors
    /// As [`ScopedBuffer::copy_to_with`].
    pub fn copy_from_with(&mut self, src: &DeviceView<'_, T>, stream: &Stream, options: CopyOptions) -> Result<()> {
        copy_with(BatchCopy::views(src, self)?, stream, options, "copy_from_with")
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Whether two ranges share a byte, the plain way.
    fn meet(a: u64, b: u64, len_a: usize, len_b: usize) -> bool {
        len_a > 0 && len_b > 0 && a < b + len_b as u64 && b < a + len_a as u64
    }

    /// The overlap check's specification, pair by pair.
    fn any_overlap(copies: &[(u64, u64, usize)]) -> bool {
        copies.iter().enumerate().any(|(i, a)| {
            copies.iter().enumerate().any(|(j, b)| i != j && (meet(a.0, b.0, a.2, b.2) || meet(a.0, b.1, a.2, b.2)))
        })
    }

    proptest! {
        /// The check refuses exactly the batches where two destinations meet or a destination
        /// meets another copy's source, and names a pair that does.
        #[test]
        fn the_overlap_check_refuses_exactly_the_overlapping_batches(
            copies in proptest::collection::vec((0u64..512, 0u64..512, 0usize..64), 1..8),
        ) {
            let found = find_overlap(&copies);
            prop_assert_eq!(found.is_some(), any_overlap(&copies));
            if let Some((writer, other, kind)) = found {
                prop_assert_ne!(writer, other);
                let (w, o) = (copies[writer], copies[other]);
                match kind {
                    OverlapKind::Destinations => prop_assert!(meet(w.0, o.0, w.2, o.2)),
                    OverlapKind::DestinationAndSource => prop_assert!(meet(w.0, o.1, w.2, o.2)),
                }
            }
        }
    }

    #[test]
    fn a_copy_that_reads_what_it_writes_is_found() {
        assert_eq!(find_self_overlap(&[(0, 100, 10), (0, 5, 10)]), Some(1));
        assert_eq!(find_self_overlap(&[(10, 0, 10), (0, 10, 10)]), None, "adjacent ranges");
        assert_eq!(find_self_overlap(&[(0, 0, 0)]), None, "an empty copy meets nothing");
        assert_eq!(find_self_overlap(&[(u64::MAX - 4, u64::MAX - 2, 8)]), Some(0), "no wrap at the top");
    }

    #[test]
    fn overlap_examples() {
        assert_eq!(find_overlap(&[(0, 100, 10), (10, 100, 10)]), None, "adjacent destinations, shared source");
        assert_eq!(find_overlap(&[(0, 0, 10)]), None, "a copy's own ranges");
        assert_eq!(find_overlap(&[(0, 100, 10), (9, 200, 10)]), Some((0, 1, OverlapKind::Destinations)));
        assert_eq!(find_overlap(&[(300, 5, 4), (0, 100, 10)]), Some((1, 0, OverlapKind::DestinationAndSource)));
        assert_eq!(find_overlap(&[(0, 100, 0), (0, 100, 10)]), None, "an empty copy meets nothing");
    }

    #[test]
    fn equal_neighbours_reach_the_driver_once() {
        let during = CopyOptions::default().src_access_order(SourceAccessOrder::DuringApiCall);
        let plain = CopyOptions::default();
        let (table, first) = attribute_table(&[plain, plain, during, plain]);
        assert_eq!(first, [0, 2, 3]);
        assert_eq!(table.len(), 3);
        assert_eq!(table[1].srcAccessOrder, CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL);
        assert_eq!(table[0].srcLocHint.type_.0, 0, "no hint is the zeroed location");
        let hinted = CopyOptions::default()
            .dst_location_hint(Location::Host)
            .overlap_mode(OverlapMode::PreferOverlapWithCompute);
        let raw = hinted.raw();
        assert_eq!(raw.dstLocHint, Location::Host.raw());
        assert_eq!(raw.flags, 1);
        assert!(matches!(
            per_copy(BatchOptions::PerCopy(&[plain]), 2),
            Err(Error::Copy(CopyError::OptionsLengthMismatch { copies: 2, options: 1 }))
        ));
    }

    #[test]
    fn the_driver_too_old_error_says_which_versions_and_what_else_to_do() {
        let capability = DriverCapability::CopyBatches;
        let error = Error::DriverTooOld { capability, needs: capability.needs(), installed: 12080 };
        let text = error.to_string();
        assert!(text.contains("batched copies reading their source during the call need CUDA 13.0"), "{text}");
        assert!(text.contains("is CUDA 12.8") && text.contains("use SourceAccessOrder::Stream or Any"), "{text}");
    }
}
