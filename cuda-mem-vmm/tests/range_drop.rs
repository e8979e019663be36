//! A deferred release that keeps failing the same way is recorded once, not at every safe point.

mod common;

use common::*;
use cuda_mem_core::{MemoryResourceExt, take_drop_errors};
use cuda_mem_vmm::{VirtualMemoryResource, release_deferred};

#[test]
fn a_deferred_release_failing_the_same_way_again_is_recorded_once() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        let _ = take_drop_errors();
        let buffer = MemoryResourceExt::allocate(&resource, G, &s).unwrap();
        // Both ways of waiting for the stream fail: the release is deferred, and that recorded.
        inject(c"cuStreamSynchronize", 1);
        inject(c"cuEventSynchronize", 1);
        drop(buffer);
        let errors = take_drop_errors();
        assert_eq!(errors.len(), 1, "the deferral is recorded: {errors:?}");

        // Every later safe point fails the same way: nothing new to record.
        for _ in 0..5 {
            inject(c"cuStreamSynchronize", 1);
            inject(c"cuEventSynchronize", 1);
            assert_eq!(release_deferred(), 1, "still kept");
        }
        let errors = take_drop_errors();
        assert!(errors.is_empty(), "the same failure is not recorded again: {errors:?}");

        // Another failure is news: recorded, once.
        for _ in 0..3 {
            inject(c"cuStreamIsCapturing", 1);
            assert_eq!(release_deferred(), 1, "still kept");
        }
        let errors = take_drop_errors();
        let [recorded] = &errors[..] else { panic!("the new failure is recorded once: {errors:?}") };
        let message = recorded.error.to_string();
        assert!(message.contains("capture status") && message.contains("cuStreamIsCapturing"), "{message}");

        // Released once the stream can be waited for.
        assert_eq!(release_deferred(), 0);
        assert_eq!(vmm_live(), baseline);
        assert!(take_drop_errors().is_empty());
    });
}
