//! Failure paths: a failure injected at each driver call of making, using and freeing a buffer,
//! of every kind and along every way of freeing it, leaves nothing behind, except where the
//! driver refused the free itself, and then the refusal is returned (`close`) or recorded
//! (`Drop`). When the bookkeeping that orders a free fails, the free falls back to waiting for
//! the devices; only when that fails too is the memory kept, and that is recorded.
//!
//! Fault injection counts calls process-wide, so each test runs in a child process of its own.
//! The calls are counted first (`cuda_sim::testing::count_calls`): a run of the scenario with
//! nothing failing says which driver functions it calls, and how often. Then each call k of each
//! function is made to fail in turn, every driver function the scenario reaches included.

mod common;

use std::ffi::CStr;
use std::sync::Arc;

use common::{Gate, OPEN_DELAY, expect_host_read_waited, hold};
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{
    Device, DeviceMemoryResource, Error, FillPattern, LegacyPinnedMemoryResource, ManagedMemoryResource,
    MemoryResource, MemoryResourceExt, PinnedMemoryResource, Result, Stream, StreamOptions, SynchronousMemoryResource,
    take_drop_errors,
};
use cuda_sim::testing::{LiveObjects, count_calls, in_simulated_machine, run_failing, simulator_only};

const SIZE: usize = 1 << 16;
const OOM: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;

#[derive(Debug, Clone, Copy)]
enum Kind {
    DevicePool,
    PinnedPool,
    ManagedPool,
    Synchronous,
    LegacyPinned,
}

const KINDS: [Kind; 5] = [Kind::DevicePool, Kind::PinnedPool, Kind::ManagedPool, Kind::Synchronous, Kind::LegacyPinned];

#[derive(Debug, Clone, Copy)]
enum Path {
    /// Filled and dropped on the stream it was allocated on.
    DropOnOwnStream,
    /// Filled on another stream, then dropped: the free is ordered after that use.
    DropAfterUseOnAnotherStream,
    /// Filled on another stream, then closed (dropped again if `close` hands it back).
    Close,
    /// Filled on its own stream, its free moved to another with `set_deallocation_stream`.
    SetDeallocationStream,
}

const PATHS: [Path; 4] =
    [Path::DropOnOwnStream, Path::DropAfterUseOnAnotherStream, Path::Close, Path::SetDeallocationStream];

fn driver() -> &'static cuda_mem_core::sys::Driver {
    cuda_sim::testing::driver().expect("the test driver loads")
}

fn inject(function: &CStr, nth: u32) {
    cuda_sim::testing::inject_failure(driver(), function, nth).expect("the simulator arms the failure");
}

fn live() -> LiveObjects {
    cuda_sim::testing::live_objects(driver()).expect("the simulator counts its objects")
}

/// A resource of `kind`; a device pool is made accessible to `peer` too, so that destroying it
/// revokes that access first.
fn resource(kind: Kind, device: Device, peer: Device) -> Result<Arc<dyn MemoryResource>> {
    Ok(match kind {
        Kind::DevicePool => {
            let pool = DeviceMemoryResource::new(device, Default::default())?;
            pool.pool().set_peer_accessible_by([peer])?;
            pool
        }
        Kind::PinnedPool => PinnedMemoryResource::new(Default::default())?,
        Kind::ManagedPool => ManagedMemoryResource::new(Default::default())?,
        Kind::Synchronous => SynchronousMemoryResource::new(device),
        Kind::LegacyPinned => LegacyPinnedMemoryResource::new(device),
    })
}

/// Makes two streams and a resource of `kind`, allocates a buffer, uses it and frees it along
/// `path`, stopping at the first error (what was made is then dropped, which frees it). Returns
/// the error `close` handed back with the buffer, if it did.
fn scenario(kind: Kind, path: Path, device: Device, peer: Device) -> Option<Error> {
    let mut close_error = None;
    let mut run = || -> Result<()> {
        let options = StreamOptions::default().non_blocking();
        let own = Stream::new(device, options)?;
        let other = Stream::new(device, options)?;
        let resource = resource(kind, device, peer)?;
        let mut buffer = resource.allocate(SIZE, &own)?;
        match path {
            Path::DropOnOwnStream => buffer.fill(FillPattern::U8(1), &own)?,
            Path::DropAfterUseOnAnotherStream => buffer.fill(FillPattern::U8(1), &other)?,
            Path::Close => {
                buffer.fill(FillPattern::U8(1), &other)?;
                if let Err(refused) = buffer.close(None) {
                    let (buffer, error) = refused.into_parts();
                    close_error = Some(error);
                    // Dropping it tries the free once more.
                    drop(buffer);
                }
            }
            Path::SetDeallocationStream => {
                buffer.fill(FillPattern::U8(1), &own)?;
                buffer.set_deallocation_stream(&other);
            }
        }
        Ok(())
    };
    let _ = run();
    close_error
}

/// Makes and drops a device pool: when destroying a pool failed to revoke a peer's access, the
/// driver gives that access to the next pool made on the device (nvbug 5698116, which the
/// simulator reproduces); this one takes it and revokes it, so that every scenario starts from
/// the same state and makes the calls counted.
fn absorb_leftover_peer_access(device: Device) {
    drop(DeviceMemoryResource::new(device, Default::default()).expect("a device pool can be made"));
}

#[test]
fn a_failure_at_any_driver_call_leaves_nothing_behind_unless_the_free_itself_fails() {
    in_simulated_machine(
        "a_failure_at_any_driver_call_leaves_nothing_behind_unless_the_free_itself_fails",
        &[("CUDA_SIM_DEVICES", "2")],
        || {
            if !simulator_only("fault injection and live-object counts") {
                return;
            }
            let device = common::device();
            let peer = Device::new(1).unwrap();
            // Everything retained once per process (the contexts) is retained before counting.
            peer.set_current().unwrap();
            device.set_current().unwrap();
            let mut injected = 0;
            for kind in KINDS {
                for path in PATHS {
                    // Once first: what is resolved or retained once per process is, before counting.
                    assert!(scenario(kind, path, device, peer).is_none());
                    let (close_error, calls) =
                        count_calls(driver(), || scenario(kind, path, device, peer)).expect("the simulator counts");
                    assert!(close_error.is_none());
                    let errors = take_drop_errors();
                    assert!(errors.is_empty(), "{kind:?} {path:?} without failures: {errors:?}");
                    // The counts are what the scenario should make: the checks below are not empty.
                    assert!(calls.of("cuMemsetD8Async") == 1, "{kind:?} {path:?}: {calls:?}");
                    if !matches!(path, Path::DropOnOwnStream) {
                        assert!(calls.of("cuStreamWaitEvent") >= 1, "{kind:?} {path:?} orders its free: {calls:?}");
                    }
                    for injection in calls.injections() {
                        let before = live();
                        let (close_error, fired) =
                            run_failing(driver(), injection, || scenario(kind, path, device, peer))
                                .expect("the simulator injects");
                        injected += 1;
                        let case = format!("{kind:?} {path:?}, {injection}");
                        assert!(fired, "{case}: the scenario did not make that call");
                        absorb_leftover_peer_access(device);
                        let after = live();
                        let errors = take_drop_errors();
                        if injection.is_releasing() {
                            let refusal_seen = close_error.as_ref().is_some_and(|e| e.cuda_code() == Some(OOM))
                                || errors.iter().any(|e| e.error.cuda_code() == Some(OOM));
                            assert!(refusal_seen, "{case}: the refused free was neither returned nor recorded");
                            if after != before {
                                assert!(
                                    errors.iter().any(|e| e.error.cuda_code() == Some(OOM)),
                                    "{case}: memory was kept without a record: {errors:?}"
                                );
                            }
                        } else {
                            assert_eq!(after, before, "{case}: something was left behind ({errors:?})");
                            // Streams and events are not counted as live objects: a drop that
                            // gave one up would say so here. A pool whose peer access could not
                            // be revoked is still destroyed; only that may be recorded.
                            assert!(
                                errors.iter().all(|e| e.what == "MemoryPool (revoking peer access)"),
                                "{case}: a release was given up: {errors:?}"
                            );
                        }
                    }
                }
            }
            assert!(injected > 100, "only {injected} failures were injected");
        },
    );
}

#[test]
fn when_no_order_can_be_established_the_memory_is_kept_and_that_is_recorded() {
    in_simulated_machine("when_no_order_can_be_established_the_memory_is_kept_and_that_is_recorded", &[], || {
        if !simulator_only("fault injection and live-object counts") {
            return;
        }
        let device = common::device();
        let (own, other) = (common::stream(device), common::stream(device));
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let used = || {
            let mut buffer = pool.allocate(SIZE, &own).unwrap();
            buffer.fill(FillPattern::U8(1), &other).unwrap();
            buffer
        };
        let in_use = || pool.pool().attributes().unwrap().used_mem_current;

        // The event that would order the free fails, and so does the fallback, waiting for the
        // device: freeing could overtake the fill, so the memory is kept, and that is recorded.
        let buffer = used();
        inject(c"cuEventCreate", 1);
        inject(c"cuCtxSynchronize", 1);
        drop(buffer);
        let errors = take_drop_errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].what, "Buffer");
        assert_eq!(errors[0].error.cuda_code(), Some(OOM));
        other.synchronize().unwrap();
        assert_eq!(in_use(), SIZE as u64, "the memory was kept");

        // `close` hands the buffer back instead, still owning its memory and its uses: closing
        // it again orders the free after them and frees it.
        let before = in_use();
        let buffer = used();
        inject(c"cuEventRecord", 1);
        inject(c"cuCtxSynchronize", 1);
        let refused = buffer.close(None).unwrap_err();
        assert_eq!(refused.error().cuda_code(), Some(OOM));
        assert!(take_drop_errors().is_empty(), "close returns its error instead of recording it");
        let buffer = refused.into_buffer();
        assert_eq!(buffer.size(), SIZE);
        buffer.close(None).unwrap();
        own.synchronize().unwrap();
        assert_eq!(in_use(), before, "the buffer handed back was freed");
    });
}

#[test]
fn uses_that_could_not_be_waited_for_are_waited_for_next_time() {
    in_simulated_machine("uses_that_could_not_be_waited_for_are_waited_for_next_time", &[], || {
        if !simulator_only("fault injection") {
            return;
        }
        let device = common::device();
        let (own, other) = (common::stream(device), common::stream(device));
        let pool = PinnedMemoryResource::new(Default::default()).unwrap();
        let mut buffer = pool.allocate(SIZE, &own).unwrap();
        buffer.host_slice_mut().unwrap().fill(0);
        let (gate, _opens_on_failure) = Gate::new();
        hold(gate, other.handle());
        buffer.fill(FillPattern::U8(0x77), &other).unwrap();

        // Waiting for the other stream fails, and so does waiting for the device.
        inject(c"cuStreamSynchronize", 1);
        inject(c"cuCtxSynchronize", 1);
        let err = buffer.host_slice().unwrap_err();
        assert_eq!(err.cuda_code(), Some(OOM));
        assert!(!gate.is_open());

        // The use is still recorded: the next host access waits for it.
        gate.open_after(OPEN_DELAY);
        expect_host_read_waited(&buffer, gate, 0x77);

        // A stream that fails to synchronize is waited for through its device instead.
        let (gate, _opens_on_failure) = Gate::new();
        hold(gate, other.handle());
        buffer.fill(FillPattern::U8(0x78), &other).unwrap();
        inject(c"cuStreamSynchronize", 1);
        gate.open_after(OPEN_DELAY);
        expect_host_read_waited(&buffer, gate, 0x78);
    });
}
