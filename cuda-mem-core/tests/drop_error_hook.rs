//! The drop-error hook may call back into the drop-error API (a one-shot hook that removes
//! itself, a hook that drops a value whose `Drop` fails). In a test binary of its own, since the
//! hook and the record are process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_mem_core::{DropError, Error, record_drop_error, set_drop_error_hook, take_drop_errors};

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Removes itself on its first call.
fn one_shot(_: &DropError) {
    CALLS.fetch_add(1, Ordering::SeqCst);
    set_drop_error_hook(None);
}

#[test]
fn a_hook_can_remove_itself() {
    set_drop_error_hook(Some(one_shot));
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        record_drop_error("first", Error::resource("one"));
        record_drop_error("second", Error::resource("two"));
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(10))
        .expect("recording an error deadlocked: the hook ran with the hook lock held");
    assert_eq!(CALLS.load(Ordering::SeqCst), 1, "the hook removed itself after its first call");
    let recorded: Vec<&str> = take_drop_errors().iter().map(|e| e.what).collect();
    assert_eq!(recorded, ["first", "second"]);
}
