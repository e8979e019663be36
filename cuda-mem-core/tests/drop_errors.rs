//! Errors when freeing: `close` returns them, `Drop` records them (never panics, never loses
//! them). In a test binary of its own, since the record is process-wide.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_mem_core::{
    Device, DevicePtr, Error, LegacyPinnedMemoryResource, MemoryResource, MemoryResourceExt, Result, Stream,
    set_drop_error_hook, take_drop_errors,
};

/// Allocates pinned memory but refuses to free it.
#[derive(Debug)]
struct RefusesToFree;

/// The resource's own error, which reaches the caller as the source of an [`Error::Resource`].
#[derive(Debug, thiserror::Error)]
#[error("this resource never frees")]
struct NeverFrees;

// SAFETY: allocates through `LegacyPinnedMemoryResource`, which keeps the promises (it just never
// frees).
unsafe impl MemoryResource for RefusesToFree {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        LegacyPinnedMemoryResource::new(stream.device()).allocate_raw(size, stream)
    }

    unsafe fn deallocate_raw(&self, _ptr: DevicePtr, _size: usize, _stream: &Stream) -> Result<()> {
        Err(Error::resource(NeverFrees))
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

static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

fn count_hook(_: &cuda_mem_core::DropError) {
    HOOK_CALLS.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn close_returns_the_error_and_drop_records_it() {
    let device = common::device();
    let stream = common::stream(device);
    let resource = Arc::new(RefusesToFree);
    let err = resource.allocate(64, &stream).unwrap().close(None).unwrap_err();
    assert!(matches!(err.error(), Error::Resource(cause) if cause.is::<NeverFrees>()), "{err:?}");
    let cause = std::error::Error::source(&err).expect("the cause is the source");
    assert_eq!(cause.to_string(), "this resource never frees");
    assert!(err.to_string().contains("was not freed and is handed back"), "{err}");
    assert!(take_drop_errors().is_empty(), "close does not record what it returns");
    // The buffer comes back still owning its memory: dropping it tries again, and records.
    let buffer = err.into_buffer();
    assert_eq!(buffer.size(), 64);
    assert!(buffer.is_owning());
    drop(buffer);
    assert_eq!(take_drop_errors().len(), 1);

    set_drop_error_hook(Some(count_hook));
    drop(resource.allocate(64, &stream).unwrap());
    set_drop_error_hook(None);
    let errors = take_drop_errors();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].what, "Buffer");
    assert!(matches!(&errors[0].error, Error::Resource(cause) if cause.is::<NeverFrees>()));
    assert_eq!(HOOK_CALLS.load(Ordering::SeqCst), 1);
    assert!(take_drop_errors().is_empty(), "taking drains the record");

    // `?` on a close: the cause converts to `Error`, and the buffer handed back is dropped,
    // which tries once more and records that failure. (In this one test: the record and the
    // hook are process-wide, and tests run in parallel.)
    fn close_with_question_mark(resource: &Arc<RefusesToFree>, stream: &Stream) -> Result<()> {
        resource.allocate(64, stream)?.close(None)?;
        Ok(())
    }
    let error = close_with_question_mark(&resource, &stream).unwrap_err();
    assert!(matches!(&error, Error::Resource(cause) if cause.is::<NeverFrees>()), "{error:?}");
    let recorded = take_drop_errors();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].what, "Buffer");
}
