//! Buffers: allocation, fills, copies, host access, ownership and release.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, DevicePtr, Error, FillPattern, ForeignMemory,
    LegacyPinnedMemoryResource, MemoryResource, MemoryResourceExt, PinnedMemoryResource, PinnedMemoryResourceOptions,
    Result, ScopedBuffer, Stream, SynchronousMemoryResource, take_drop_errors,
};

fn pinned() -> Arc<PinnedMemoryResource> {
    PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap()
}

#[test]
fn fill_copy_and_read_back_every_pattern_width() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::current(device).unwrap();
    let host = pinned();
    for (pattern, expected) in [
        (FillPattern::U8(0xab), vec![0xab; 4]),
        (FillPattern::U16(0x1234), 0x1234u16.to_ne_bytes().repeat(2)),
        (FillPattern::U32(0xdead_beef), 0xdead_beefu32.to_ne_bytes().to_vec()),
    ] {
        let mut d = dmr.allocate(4096, &stream).unwrap();
        d.fill(pattern, &stream).unwrap();
        let mut h = host.allocate(4096, &stream).unwrap();
        h.copy_from(&d, &stream).unwrap();
        let bytes = h.host_slice().unwrap();
        assert!(bytes.chunks(4).all(|c| c == expected.as_slice()), "{pattern:?}");
    }
}

#[test]
fn host_writes_round_trip_through_device_memory() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::current(device).unwrap();
    let host = pinned();
    let mut src = host.allocate(1000, &stream).unwrap();
    for (i, b) in src.host_slice_mut().unwrap().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut d = dmr.allocate(1000, &stream).unwrap();
    src.copy_to(&mut d, &stream).unwrap();
    let mut back = host.allocate(1000, &stream).unwrap();
    d.copy_to(&mut back, &stream).unwrap();
    let expected: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
    assert_eq!(back.host_slice().unwrap(), expected.as_slice());
}

#[test]
fn size_mismatch_and_bad_fill_width_are_errors() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::current(device).unwrap();
    let a = dmr.allocate(64, &stream).unwrap();
    let mut b = dmr.allocate(65, &stream).unwrap();
    let err = a.copy_to(&mut b, &stream).unwrap_err();
    assert!(matches!(err, Error::SizeMismatch { expected: 64, actual: 65, .. }), "{err}");
    assert_eq!(err.to_string(), "size mismatch: the destination buffer is 65 bytes, expected 64");
    let err = b.fill(FillPattern::U16(1), &stream).unwrap_err();
    assert!(matches!(err, Error::FillPatternWidth { width: 2, size: 65 }), "{err}");
    assert!(err.to_string().contains("divisible by 2"), "{err}");
    let err = b.fill(FillPattern::U32(1), &stream).unwrap_err();
    assert!(matches!(err, Error::FillPatternWidth { width: 4, size: 65 }), "{err}");
    assert!(err.to_string().contains("divisible by 4"), "{err}");
}

#[test]
fn device_memory_is_not_lent_to_the_host() {
    let device = common::device();
    let stream = common::stream(device);
    let d = DeviceMemoryResource::current(device).unwrap().allocate(16, &stream).unwrap();
    let err = d.host_slice().unwrap_err();
    assert!(matches!(err, Error::NotHostAccessible { size: 16, ptr } if ptr == d.ptr()), "{err}");
    assert!(err.to_string().contains("copy it to a host-accessible buffer first"), "{err}");
    assert!(!d.is_host_accessible() && d.is_device_accessible());
    assert_eq!(d.device(), Some(device));
}

#[test]
fn memory_other_processes_may_write_is_not_lent_as_a_slice() {
    let device = common::device();
    let stream = common::stream(device);
    let shared = PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .unwrap();
    assert!(shared.may_be_written_externally());
    let mut buffer = shared.allocate(256, &stream).unwrap();
    buffer.fill(FillPattern::U8(0x42), &stream).unwrap();
    let err = buffer.host_slice().unwrap_err();
    assert!(matches!(err, Error::WritableElsewhere { size: 256, .. }), "{err}");
    assert!(err.to_string().contains("copy_to_slice"), "the message says what to do: {err}");
    let err = buffer.host_slice_mut().unwrap_err();
    assert!(matches!(err, Error::WritableElsewhere { .. }), "{err}");
    // Copying out is safe: no reference to the shared bytes is lent.
    let mut out = vec![0u8; 256];
    buffer.copy_to_slice(&mut out, &stream).unwrap();
    assert!(out.iter().all(|&b| b == 0x42));
    let err = buffer.copy_to_slice(&mut [0u8; 255], &stream).unwrap_err();
    assert!(matches!(err, Error::SizeMismatch { expected: 256, actual: 255, .. }), "{err}");
    // SAFETY: the pool's handle was never exported, so nothing else can write its memory.
    unsafe { buffer.host_slice_mut_assume_exclusive() }.unwrap().fill(7);
    // SAFETY: as above.
    assert!(unsafe { buffer.host_slice_assume_exclusive() }.unwrap().iter().all(|&b| b == 7));
    // Device memory of an IPC-enabled pool is refused as device memory, as ever.
    let device_shared =
        DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let on_device = device_shared.allocate(64, &stream).unwrap();
    assert!(matches!(on_device.host_slice().unwrap_err(), Error::NotHostAccessible { .. }));
    // A pinned pool that is not IPC-enabled still lends its bytes.
    let local = pinned();
    assert!(!local.may_be_written_externally());
    let mut mine = local.allocate(256, &stream).unwrap();
    mine.fill(FillPattern::U8(0x24), &stream).unwrap();
    assert!(mine.host_slice().unwrap().iter().all(|&b| b == 0x24));
    mine.host_slice_mut().unwrap().fill(1);
}

#[test]
fn device_memory_is_copied_to_the_host() {
    let device = common::device();
    let stream = common::stream(device);
    let mut on_device = DeviceMemoryResource::current(device).unwrap().allocate(4096, &stream).unwrap();
    on_device.fill(FillPattern::U32(0xDEC0_ADDE), &stream).unwrap();
    let out = on_device.to_vec::<u32>(&stream).unwrap();
    assert!(out.iter().all(|&w| w == 0xDEC0_ADDE));
    let empty = DeviceMemoryResource::current(device).unwrap().allocate(0, &stream).unwrap();
    empty.copy_to_slice::<u8>(&mut [], &stream).unwrap();
}

#[test]
fn zero_size_buffers_need_no_driver_call() {
    let device = common::device();
    let stream = common::stream(device);
    let counting = Arc::new(Counting::default());
    let b = counting.allocate(0, &stream).unwrap();
    assert!(b.is_empty());
    assert_eq!(b.ptr(), 0);
    drop(b);
    assert_eq!(counting.allocations.load(Ordering::SeqCst), 0);
    assert_eq!(counting.frees.load(Ordering::SeqCst), 0);
}

/// A user resource over `cuMemAllocHost` that counts its calls.
#[derive(Debug, Default)]
struct Counting {
    allocations: AtomicUsize,
    frees: AtomicUsize,
}

// SAFETY: forwards to `LegacyPinnedMemoryResource`, which keeps the promises.
unsafe impl MemoryResource for Counting {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        self.allocations.fetch_add(1, Ordering::SeqCst);
        LegacyPinnedMemoryResource::new(stream.device()).allocate_raw(size, stream)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        self.frees.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded; the pointer came from the same kind of resource.
        unsafe { LegacyPinnedMemoryResource::new(stream.device()).deallocate_raw(ptr, size, stream) }
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        true
    }

    fn device(&self) -> Option<Device> {
        None
    }
}

#[test]
fn user_resources_are_freed_exactly_once_by_drop_or_close() {
    let device = common::device();
    let stream = common::stream(device);
    let counting = Arc::new(Counting::default());
    let a = counting.allocate(100, &stream).unwrap();
    let b = counting.allocate(100, &stream).unwrap();
    drop(a);
    b.close(Some(&stream)).unwrap();
    assert_eq!(counting.allocations.load(Ordering::SeqCst), 2);
    assert_eq!(counting.frees.load(Ordering::SeqCst), 2);
    // Closing released the buffer's hold on the resource too.
    assert_eq!(Arc::strong_count(&counting), 1);
}

#[test]
fn raw_owned_buffers_call_the_resource_and_views_free_nothing() {
    let device = common::device();
    let stream = common::stream(device);
    let counting = Arc::new(Counting::default());
    let ptr = counting.allocate_raw(64, &stream).unwrap();
    let resource: Arc<dyn MemoryResource> = counting.clone();
    // SAFETY: `ptr` came from `counting` and is owned by nothing else.
    let owned = unsafe { Buffer::from_raw_owned(ptr, 64, resource, &stream) };
    {
        // SAFETY: the view does not outlive `owned`, which keeps the memory alive.
        let view = unsafe { Buffer::from_raw(ptr, 64, ForeignMemory::pinned()) };
        assert!(!view.is_owning());
        assert_eq!(view.host_slice().unwrap().len(), 64);
    }
    assert_eq!(counting.frees.load(Ordering::SeqCst), 0);
    drop(owned);
    assert_eq!(counting.frees.load(Ordering::SeqCst), 1);
}

#[test]
fn buffers_keep_their_resource_alive_and_free_on_another_thread_without_a_context() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let weak = Arc::downgrade(&pool);
    let mut buffers: Vec<Buffer> = (0..8).map(|_| pool.allocate(1 << 16, &stream).unwrap()).collect();
    buffers[0].fill(FillPattern::U8(7), &stream).unwrap();
    drop(pool);
    assert!(weak.upgrade().is_some(), "buffers keep the pool alive");
    std::thread::spawn(move || {
        // This thread never made a context current.
        drop(buffers);
    })
    .join()
    .unwrap();
    assert!(weak.upgrade().is_none(), "the last buffer released the pool");
    let errors = take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn default_stream_buffers_free_on_another_thread() {
    let device = common::device();
    let legacy = device.default_stream();
    let buffer = DeviceMemoryResource::current(device).unwrap().allocate(256, &legacy).unwrap();
    std::thread::spawn(move || drop(buffer)).join().unwrap();
    let errors = take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn deallocation_stream_can_be_replaced() {
    let device = common::device();
    let (s1, s2) = (common::stream(device), common::stream(device));
    let mut buffer = DeviceMemoryResource::current(device).unwrap().allocate(64, &s1).unwrap();
    assert_eq!(buffer.deallocation_stream(), Some(&s1));
    buffer.set_deallocation_stream(&s2);
    assert_eq!(buffer.deallocation_stream(), Some(&s2));
    s1.synchronize().unwrap();
    buffer.close(None).unwrap();
}

#[test]
fn legacy_and_synchronous_resources() {
    let device = common::device();
    let stream = common::stream(device);
    let mut host = LegacyPinnedMemoryResource::new(device).allocate(512, &stream).unwrap();
    host.host_slice_mut().unwrap().fill(3);
    let mut d = SynchronousMemoryResource::new(device).allocate(512, &stream).unwrap();
    d.copy_from(&host, &stream).unwrap();
    let mut back = LegacyPinnedMemoryResource::new(device).allocate(512, &stream).unwrap();
    back.copy_from(&d, &stream).unwrap();
    assert!(back.host_slice().unwrap().iter().all(|&b| b == 3));
}

#[test]
fn scoped_buffers_borrow_instead_of_sharing_and_free_exactly_once() {
    let device = common::device();
    let stream = common::stream(device);
    let counting = Arc::new(Counting::default());
    {
        let mut a = counting.allocate_scoped(128, &stream).unwrap();
        let b = counting.allocate_scoped(128, &stream).unwrap();
        // No share of the resource was taken: the borrow keeps it alive.
        assert_eq!(Arc::strong_count(&counting), 1);
        assert!(a.is_owning() && a.resource().is_none());
        assert!(a.memory_resource().is_some_and(|r| r.is_host_accessible()));
        assert_eq!(a.deallocation_stream(), Some(&stream));
        a.host_slice_mut().unwrap().fill(9);
        drop(a);
        b.close(None).unwrap();
    }
    // A resource that is not in an `Arc` allocates scoped buffers too.
    let plain = Counting::default();
    let c = ScopedBuffer::allocate_scoped(&plain, 64, &stream).unwrap();
    let empty = ScopedBuffer::allocate_scoped(&plain, 0, &stream).unwrap();
    assert!(empty.is_empty());
    drop((c, empty));
    assert_eq!(counting.allocations.load(Ordering::SeqCst), 2);
    assert_eq!(counting.frees.load(Ordering::SeqCst), 2);
    assert_eq!(plain.allocations.load(Ordering::SeqCst), 1);
    assert_eq!(plain.frees.load(Ordering::SeqCst), 1);
}

#[test]
fn scoped_and_shared_buffers_copy_into_each_other() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let host = pinned();
    let mut source: Buffer = host.allocate(4096, &stream).unwrap();
    source.host_slice_mut().unwrap().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let mut on_device = pool.allocate_scoped(4096, &stream).unwrap();
    on_device.copy_from(&source, &stream).unwrap();
    on_device.fill(FillPattern::U8(0x5a), &stream).unwrap();
    let mut back = host.allocate_scoped(4096, &stream).unwrap();
    on_device.copy_to(&mut back, &stream).unwrap();
    assert!(back.host_slice().unwrap().iter().all(|&b| b == 0x5a));
    source.copy_from(&back, &stream).unwrap();
    assert!(source.host_slice().unwrap().iter().all(|&b| b == 0x5a));
    drop((on_device, back));
    assert_eq!(pool.pool().attributes().unwrap().used_mem_current, 0, "the scoped buffer freed its memory");
}

#[test]
fn a_scoped_buffer_freed_on_another_stream_orders_after_its_uses() {
    let device = common::device();
    let (s1, s2) = (common::stream(device), common::stream(device));
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate_scoped(1 << 16, &s1).unwrap();
    buffer.fill(FillPattern::U32(1), &s1).unwrap();
    // The new stream is kept as a share: it may outlive the borrow of the first.
    buffer.set_deallocation_stream(&s2);
    assert_eq!(buffer.deallocation_stream(), Some(&s2));
    std::thread::scope(|scope| {
        // Scoped buffers move to other threads inside the scope of their borrows.
        scope.spawn(move || drop(buffer));
    });
    s2.synchronize().unwrap();
    assert_eq!(pool.pool().attributes().unwrap().used_mem_current, 0);
    let errors = take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn typed_allocations_take_an_element_count_or_a_slice() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
    // Dirty the pool's memory first, so that a zeroed buffer cannot be zero by chance.
    let mut dirty = pool.allocate(1024 * 4, &stream).unwrap();
    dirty.fill(FillPattern::U8(0xAB), &stream).unwrap();
    drop(dirty);
    let zeroed = pool.allocate_zeroed::<f32>(1024, &stream).unwrap();
    assert_eq!(zeroed.size(), 4096);
    assert_eq!(zeroed.to_vec::<f32>(&stream).unwrap(), vec![0.0; 1024]);

    let data: Vec<u64> = (0..100).map(|i| i * 3).collect();
    let copied = pool.allocate_from_slice(&data, &stream).unwrap();
    assert_eq!(copied.size(), 800);
    assert_eq!(copied.to_vec::<u64>(&stream).unwrap(), data);
    // Through a trait object too, and empty ones without asking the resource.
    let as_dyn: Arc<dyn MemoryResource> = pool.clone();
    assert!(as_dyn.allocate_from_slice::<u8>(&[], &stream).unwrap().is_empty());
    assert!(as_dyn.allocate_zeroed::<u32>(0, &stream).unwrap().is_empty());

    let error = pool.allocate_zeroed::<u64>(usize::MAX / 4, &stream).unwrap_err();
    assert!(
        matches!(error, Error::View(cuda_mem_core::ViewError::TooManyElements { element: "u64", len }) if len == usize::MAX / 4),
        "{error:?}"
    );
}
