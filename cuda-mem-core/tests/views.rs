//! Typed views and Rust data: round trips of several element types through every kind of
//! buffer, sub-range views, every refusal, `copy_to_new`, and ownership leaving a buffer
//! (`into_raw`, `leak`) and coming back.

mod common;

use std::fmt::Debug;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use cuda_mem_core::{
    Buffer, DeviceMemoryResource, Error, FillPattern, ForeignMemory, LegacyPinnedMemoryResource, ManagedMemoryResource,
    MemoryResource, MemoryResourceExt, PinnedMemoryResource, ScopedBuffer, Stream, SynchronousMemoryResource,
    ViewError,
};
use proptest::prelude::*;

/// An element type of the application's own.
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
#[repr(C)]
struct Particle {
    position: [f32; 3],
    id: u32,
}

/// Every kind of resource this crate has (VMM is tested in `cuda-mem-vmm`).
fn resources(stream: &Stream) -> Vec<(&'static str, Arc<dyn MemoryResource>)> {
    let device = stream.device();
    vec![
        ("device pool", DeviceMemoryResource::new(device, Default::default()).unwrap()),
        ("pinned pool", PinnedMemoryResource::new(Default::default()).unwrap()),
        ("managed pool", ManagedMemoryResource::new(Default::default()).unwrap()),
        ("cuMemAlloc", SynchronousMemoryResource::new(device)),
        ("cuMemAllocHost", LegacyPinnedMemoryResource::new(device)),
    ]
}

/// Writes `data` into a buffer of `resource` and reads it back every way there is.
fn round_trip<T: Pod + PartialEq + Debug>(what: &str, resource: &Arc<dyn MemoryResource>, data: &[T], stream: &Stream) {
    let mut buffer = resource.allocate(size_of_val(data), stream).unwrap();
    buffer.copy_from_slice(data, stream).unwrap();
    assert_eq!(buffer.to_vec::<T>(stream).unwrap(), data, "{what}: buffer to_vec");
    let mut out = vec![T::zeroed(); data.len()];
    buffer.copy_to_slice(&mut out, stream).unwrap();
    assert_eq!(out, data, "{what}: buffer copy_to_slice");

    // Through views: the second half rewritten from the first, then read back in pieces.
    let half = data.len() / 2;
    let mut view = buffer.view_mut::<T>().unwrap();
    assert_eq!((view.len(), view.byte_len()), (data.len(), size_of_val(data)));
    view.slice_mut(half..2 * half).unwrap().copy_from_slice(&data[..half], stream).unwrap();
    let mut expected = data.to_vec();
    expected.copy_within(..half, half);
    assert_eq!(view.to_vec(stream).unwrap(), expected, "{what}: view write of a sub-range");
    let tail = view.slice(half..).unwrap();
    assert_eq!(tail.ptr(), buffer_ptr_plus(view.ptr(), half * size_of::<T>()));
    assert_eq!(tail.to_vec(stream).unwrap(), expected[half..], "{what}: sub-range read");

    // Device to device, between views of two buffers; and `copy_to_new`.
    let copy = buffer.copy_to_new(stream).unwrap();
    assert!(Arc::ptr_eq(copy.resource().unwrap(), resource), "{what}: allocated from the same resource");
    let mut other = resource.allocate(size_of_val(data), stream).unwrap();
    other.view_mut::<T>().unwrap().copy_from(&copy.view::<T>().unwrap(), stream).unwrap();
    assert_eq!(other.to_vec::<T>(stream).unwrap(), expected, "{what}: view-to-view copy");
}

fn buffer_ptr_plus(ptr: cuda_mem_core::DevicePtr, bytes: usize) -> cuda_mem_core::DevicePtr {
    ptr + bytes as cuda_mem_core::DevicePtr
}

#[test]
fn every_element_type_round_trips_through_every_kind_of_buffer() {
    let device = common::device();
    let stream = common::stream(device);
    let bytes: Vec<u8> = (0..=255).collect();
    let halves: Vec<u16> = (0..300).map(|i| i * 211).collect();
    let floats: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let doubles: Vec<f64> = (0..333).map(|i| f64::from(i).sqrt()).collect();
    let particles: Vec<Particle> =
        (0..64).map(|i| Particle { position: [i as f32, -(i as f32), 0.25], id: i * 3 }).collect();
    for (what, resource) in resources(&stream) {
        round_trip(what, &resource, &bytes, &stream);
        round_trip(what, &resource, &halves, &stream);
        round_trip(what, &resource, &floats, &stream);
        round_trip(what, &resource, &doubles, &stream);
        round_trip(what, &resource, &particles, &stream);
    }
}

#[test]
fn a_vec_reaches_a_pool_buffer_and_comes_back() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let data: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let mut buffer = pool.allocate(data.len() * 4, &stream).unwrap();
    buffer.copy_from_slice(&data, &stream).unwrap();
    drop(data); // the copy returned: nothing reads the source any more
    let back: Vec<f32> = buffer.to_vec(&stream).unwrap();
    assert!(back.iter().enumerate().all(|(i, &x)| x == i as f32));
}

#[test]
fn fills_set_every_element_whatever_its_size() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(96, &stream).unwrap();
    buffer.view_mut::<u16>().unwrap().fill(0x1234, &stream).unwrap();
    assert_eq!(buffer.to_vec::<u16>(&stream).unwrap(), vec![0x1234; 48]);
    buffer.view_mut::<f32>().unwrap().fill(1.5, &stream).unwrap();
    assert_eq!(buffer.to_vec::<f32>(&stream).unwrap(), vec![1.5; 24]);
    buffer.view_mut::<f64>().unwrap().fill(-2.25, &stream).unwrap();
    assert_eq!(buffer.to_vec::<f64>(&stream).unwrap(), vec![-2.25; 12]);
    let particle = Particle { position: [1.0, 2.0, 3.0], id: 9 };
    buffer.view_mut::<Particle>().unwrap().slice_mut(1..).unwrap().fill(particle, &stream).unwrap();
    let first: Particle = bytemuck::cast([-2.25f64; 2]);
    assert_eq!(buffer.to_vec::<Particle>(&stream).unwrap(), [first, particle, particle, particle, particle, particle]);
    buffer.view_mut::<f64>().unwrap().fill(0.0, &stream).unwrap();
    assert_eq!(buffer.to_vec::<u8>(&stream).unwrap(), vec![0; 96]);
}

#[test]
fn fills_of_elements_aligned_below_their_size_set_every_element() {
    // `[u8; 2]` and `[u16; 2]` views may start at an odd or a 2-byte address, where the 2- and
    // 4-byte memsets would be refused: such fills take the host's way there.
    let stream = common::stream(common::device());
    let device = stream.device();
    let mut buffer = DeviceMemoryResource::new(device, Default::default()).unwrap().allocate(64, &stream).unwrap();
    for offset in [1, 2, 3] {
        buffer.fill(FillPattern::U8(0), &stream).unwrap();
        let len = 60;
        // SAFETY: `len` bytes from `offset` lie inside `buffer`, which outlives the view and is
        // used by nothing else meanwhile; both are used on `stream` only.
        let mut view = unsafe {
            Buffer::from_raw(buffer_ptr_plus(buffer.ptr(), offset), len, ForeignMemory::device_memory(device))
        };
        if offset % 2 == 1 {
            view.view_mut::<[u8; 2]>().unwrap().fill([1, 2], &stream).unwrap();
        } else {
            view.view_mut::<[u16; 2]>().unwrap().fill([0x0201, 0x0403], &stream).unwrap();
        }
        drop(view);
        let pattern: &[u8] = if offset % 2 == 1 { &[1, 2] } else { &[1, 2, 3, 4] };
        let mut expected = vec![0u8; 64];
        for chunk in expected[offset..offset + len].chunks_mut(pattern.len()) {
            chunk.copy_from_slice(pattern);
        }
        assert_eq!(buffer.to_vec::<u8>(&stream).unwrap(), expected, "at offset {offset}");
    }
}

#[test]
fn sizes_that_are_not_whole_elements_are_refused() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(10, &stream).unwrap();
    let refused = buffer.view::<f64>();
    assert!(matches!(refused, Err(Error::View(ViewError::Size { element_size: 8, size: 10, .. }))), "{refused:?}");
    assert!(matches!(buffer.view_mut::<u32>(), Err(Error::View(ViewError::Size { element_size: 4, size: 10, .. }))));
    assert!(matches!(buffer.to_vec::<Particle>(&stream), Err(Error::View(ViewError::Size { element_size: 16, .. }))));
    assert_eq!(buffer.view::<u16>().unwrap().len(), 5);
}

#[test]
fn misaligned_views_are_refused() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let owner = pool.allocate(64, &stream).unwrap();
    // SAFETY: 32 bytes one past the start of `owner`'s 64, which outlives the view.
    let odd = unsafe { Buffer::from_raw(owner.ptr() + 1, 32, ForeignMemory::device_memory(device)) };
    let refused = odd.view::<f32>();
    assert!(matches!(refused, Err(Error::View(ViewError::Alignment { align: 4, .. }))), "{refused:?}");
    assert!(matches!(odd.to_vec::<u16>(&stream), Err(Error::View(ViewError::Alignment { align: 2, .. }))));
    assert_eq!(odd.view::<u8>().unwrap().len(), 32, "bytes fit anywhere");
}

#[test]
fn out_of_range_slices_are_refused() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(40, &stream).unwrap();
    let view = buffer.view::<u32>().unwrap();
    assert!(matches!(view.slice(5..11), Err(Error::View(ViewError::SliceOutOfRange { start: 5, end: 11, len: 10 }))));
    assert!(matches!(view.slice(11..), Err(Error::View(ViewError::SliceOutOfRange { .. }))));
    assert!(view.slice(10..).unwrap().is_empty());
    let mut view = buffer.view_mut::<u32>().unwrap();
    assert!(matches!(
        view.slice_mut(..=10),
        Err(Error::View(ViewError::SliceOutOfRange { start: 0, end: 11, len: 10 }))
    ));
    let mut middle = view.slice_mut(2..8).unwrap();
    assert!(
        matches!(middle.slice_mut(..7), Err(Error::View(ViewError::SliceOutOfRange { len: 6, .. }))),
        "ranges are the sub-view's"
    );
}

#[test]
fn lengths_that_do_not_match_are_refused_never_truncated() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(16, &stream).unwrap();
    buffer.copy_from_slice(&[7u32; 4], &stream).unwrap();
    let short = buffer.copy_from_slice(&[1u32; 3], &stream);
    assert!(matches!(short, Err(Error::SizeMismatch { expected: 16, actual: 12, .. })), "{short:?}");
    let long = buffer.copy_to_slice(&mut [0u32; 5], &stream);
    assert!(matches!(long, Err(Error::SizeMismatch { expected: 16, actual: 20, .. })), "{long:?}");
    let mut view = buffer.view_mut::<u32>().unwrap();
    assert!(matches!(view.copy_from_slice(&[0; 5], &stream), Err(Error::SizeMismatch { .. })));
    assert!(matches!(view.copy_to_slice(&mut [0; 3], &stream), Err(Error::SizeMismatch { .. })));
    let other = pool.allocate(8, &stream).unwrap();
    let refused = view.copy_from(&other.view::<u32>().unwrap(), &stream);
    assert!(matches!(refused, Err(Error::SizeMismatch { expected: 8, actual: 16, .. })), "{refused:?}");
    assert_eq!(buffer.to_vec::<u32>(&stream).unwrap(), [7; 4], "nothing was written by a refused copy");
}

#[test]
fn empty_buffers_have_empty_views() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut empty = pool.allocate(0, &stream).unwrap();
    assert!(empty.to_vec::<f64>(&stream).unwrap().is_empty());
    empty.copy_from_slice::<f64>(&[], &stream).unwrap();
    empty.view_mut::<Particle>().unwrap().fill(Particle::zeroed(), &stream).unwrap();
    assert!(empty.copy_to_new(&stream).unwrap().is_empty());
}

#[test]
fn copy_to_new_needs_a_shared_resource() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut scoped: ScopedBuffer<'_> = pool.allocate_scoped(64, &stream).unwrap();
    scoped.copy_from_slice(&[3u8; 64], &stream).unwrap();
    let refused = scoped.copy_to_new(&stream);
    assert!(matches!(refused, Err(Error::NoSharedResource { size: 64, .. })), "{refused:?}");
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("copy_to"), "{message}");
    // SAFETY: `scoped`'s memory outlives the view.
    let view = unsafe { Buffer::from_raw(scoped.ptr(), 64, ForeignMemory::device_memory(device)) };
    assert!(matches!(view.copy_to_new(&stream), Err(Error::NoSharedResource { .. })));
}

#[test]
fn ownership_leaves_with_into_raw_and_comes_back_with_from_raw_owned() {
    let device = common::device();
    let stream = common::stream(device);
    let other_stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(1024, &stream).unwrap();
    buffer.view_mut::<u32>().unwrap().fill(0x0101_0101 * 5, &other_stream).unwrap();
    let raw = buffer.into_raw().unwrap();
    assert_eq!(raw.size, 1024);
    let used = pool.pool().attributes().unwrap().used_mem_current;
    assert!(used >= 1024, "into_raw freed nothing");
    // SAFETY: the parts `into_raw` gave, given back once.
    let back = unsafe { Buffer::from_raw_owned(raw.ptr, raw.size, raw.resource, &raw.stream) };
    assert_eq!(back.to_vec::<u8>(&stream).unwrap(), vec![5; 1024], "the fill on the other stream was ordered");
    drop(back);
    stream.synchronize().unwrap();
    assert_eq!(pool.pool().attributes().unwrap().used_mem_current, 0, "the memory came back and was freed");
}

#[test]
fn buffers_that_own_nothing_refuse_into_raw_and_are_handed_back() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let owner = pool.allocate(64, &stream).unwrap();
    // SAFETY: `owner`'s memory outlives the view.
    let view = unsafe { Buffer::from_raw(owner.ptr(), 64, ForeignMemory::device_memory(device)) };
    let refused = view.into_raw().unwrap_err();
    assert!(matches!(refused.error(), Error::NotOwning { size: 64, .. }), "{refused:?}");
    assert_eq!(refused.into_buffer().ptr(), owner.ptr(), "the view is handed back");
}

#[test]
fn a_leaked_buffer_keeps_its_memory_and_its_pool() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(256, &stream).unwrap();
    buffer.copy_from_slice(&[9u8; 256], &stream).unwrap();
    let ptr = buffer.leak();
    let weak = Arc::downgrade(&pool);
    drop(pool);
    assert!(weak.upgrade().is_some(), "the leaked buffer keeps its pool alive");
    // SAFETY: leaked memory stays valid for the rest of the process.
    let view = unsafe { Buffer::from_raw(ptr, 256, ForeignMemory::device_memory(device)) };
    assert_eq!(view.to_vec::<u8>(&stream).unwrap(), vec![9; 256]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A sub-range written from the host, then any sub-range read back, matches a host model.
    #[test]
    fn slices_and_copies_match_a_host_model(
        initial in prop::collection::vec(any::<u32>(), 1..200),
        write in (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        read in (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        seed in any::<u32>(),
    ) {
        let device = common::device();
        let stream = common::stream(device);
        let pool = DeviceMemoryResource::current(device).unwrap();
        let len = initial.len();
        let (a, b) = (write.0.index(len + 1), write.1.index(len + 1));
        let (w0, w1) = (a.min(b), a.max(b));
        let (c, d) = (read.0.index(len + 1), read.1.index(len + 1));
        let (r0, r1) = (c.min(d), c.max(d));

        let mut buffer = pool.allocate(len * 4, &stream).unwrap();
        buffer.copy_from_slice(&initial, &stream).unwrap();
        let mut model = initial.clone();
        let update: Vec<u32> = (0..w1 - w0).map(|i| seed.wrapping_add(i as u32)).collect();
        buffer.view_mut::<u32>().unwrap().slice_mut(w0..w1).unwrap().copy_from_slice(&update, &stream).unwrap();
        model[w0..w1].copy_from_slice(&update);

        let view = buffer.view::<u32>().unwrap();
        prop_assert_eq!(view.slice(r0..r1).unwrap().to_vec(&stream).unwrap(), &model[r0..r1]);
        prop_assert_eq!(buffer.to_vec::<u32>(&stream).unwrap(), model);
        let past_the_end = view.slice(r0..len + 1);
        prop_assert!(matches!(past_the_end, Err(Error::View(ViewError::SliceOutOfRange { .. }))), "{:?}", past_the_end);
    }
}
