//! Events for what memory does, behind the `tracing` feature: one macro, [`memory_event!`], that
//! the memory crates call where they allocate, free, create or destroy a pool, export, import,
//! change peer access or grow. With the feature off it expands to nothing (its arguments are not
//! even evaluated), so the hot paths compile to what they were without it.
//!
//! Levels: `TRACE` for allocation and freeing (the hot path), `DEBUG` for everything else. Each
//! event's message names what happened (`"allocate"`, `"free"`, `"pool created"`, …) and its
//! fields say what it happened to: `size` in bytes and `device` (an ordinal) as numbers; `ptr`,
//! `pool` (the `CUmemoryPool` handle) and `stream` (the `CUstream` handle) in hex, as the errors
//! write addresses ([`fields::hex`]); a pool's `kind` in a word or two (`device 0`, `pinned`,
//! `managed`: [`fields::pool_kind`]). A field with nothing to say is left out (`max_size` of a
//! pool without a cap).

/// Emits a `tracing` event at the given level (`TRACE`, `DEBUG`, `INFO`, …) with `tracing`'s
/// field syntax: `memory_event!(TRACE, size, ptr = %hex(ptr), "allocate")`. The field writers of
/// [`fields`] (`hex`, `pool_kind`) are in scope for the fields, so that a crate without the
/// feature imports nothing it would not use. Expands to nothing without the `tracing` feature.
/// For this workspace's memory crates; not part of the API.
#[cfg(feature = "tracing")]
#[doc(hidden)]
#[macro_export]
macro_rules! memory_event {
    ($level:ident, $($rest:tt)+) => {{
        #[allow(unused_imports)]
        use $crate::__private::fields::{hex, pool_kind};
        $crate::__private::tracing::event!($crate::__private::tracing::Level::$level, $($rest)+)
    }};
}

/// Emits a `tracing` event (the `tracing` feature is off: nothing).
#[cfg(not(feature = "tracing"))]
#[doc(hidden)]
#[macro_export]
macro_rules! memory_event {
    ($($anything:tt)*) => {};
}

/// How the events write the fields that are not plain numbers.
#[cfg(feature = "tracing")]
pub mod fields {
    use std::fmt;

    use crate::pool::PoolKind;

    /// What has an address: a device pointer, or a driver handle (a pointer the driver gave).
    pub trait Address {
        /// The address, as a number.
        fn address(self) -> u64;
    }

    impl Address for u64 {
        fn address(self) -> u64 {
            self
        }
    }

    impl Address for usize {
        fn address(self) -> u64 {
            self as u64
        }
    }

    impl<T> Address for *mut T {
        fn address(self) -> u64 {
            self as usize as u64
        }
    }

    /// An address written in hex, as the errors write them (`0x7f0000200000`).
    #[derive(Debug, Clone, Copy)]
    pub struct Hex(u64);

    impl fmt::Display for Hex {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{:#x}", self.0)
        }
    }

    /// A pointer or a handle as an event field: `ptr = %hex(ptr)`.
    pub fn hex(value: impl Address) -> Hex {
        Hex(value.address())
    }

    /// A pool's kind in a word or two: `device 0`, `pinned`, `managed`.
    #[derive(Debug, Clone, Copy)]
    pub struct ShortKind(PoolKind);

    impl fmt::Display for ShortKind {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.0 {
                PoolKind::Device(device) => write!(f, "{device}"),
                PoolKind::Pinned => f.write_str("pinned"),
                PoolKind::Managed => f.write_str("managed"),
            }
        }
    }

    /// A pool's kind as an event field: `kind = %pool_kind(kind)`.
    pub fn pool_kind(kind: PoolKind) -> ShortKind {
        ShortKind(kind)
    }
}

/// Collecting the events a closure emits, for the memory crates' tests of their events.
#[cfg(feature = "tracing")]
pub mod capture {
    use std::collections::BTreeMap;
    use std::fmt::Debug;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, PoisonError};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    /// One event: its level, its target (the module that emitted it) and its fields, each as
    /// text (`message` among them).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Captured {
        /// The event's level.
        pub level: Level,
        /// The emitting module's path.
        pub target: String,
        /// Field name → value, as text.
        pub fields: BTreeMap<String, String>,
    }

    impl Captured {
        /// The message.
        pub fn message(&self) -> &str {
            self.fields.get("message").map_or("", String::as_str)
        }

        /// A numeric field: a number, or an address written in hex (`0x…`).
        pub fn number(&self, name: &str) -> Option<u64> {
            let text = self.fields.get(name)?;
            match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => text.parse().ok(),
            }
        }
    }

    /// Writes each field as text.
    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0.insert(field.name().to_owned(), value.to_string());
        }

        fn record_i64(&mut self, field: &Field, value: i64) {
            self.0.insert(field.name().to_owned(), value.to_string());
        }

        fn record_bool(&mut self, field: &Field, value: bool) {
            self.0.insert(field.name().to_owned(), value.to_string());
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }

        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
    }

    /// A subscriber that keeps every event (spans get ids and are otherwise ignored).
    struct Collector {
        events: Arc<Mutex<Vec<Captured>>>,
        next_span: AtomicU64,
    }

    impl Subscriber for Collector {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed))
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &Event<'_>) {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            let metadata = event.metadata();
            let captured = Captured { level: *metadata.level(), target: metadata.target().to_owned(), fields };
            self.events.lock().unwrap_or_else(PoisonError::into_inner).push(captured);
        }

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }

    /// Runs `f` with a subscriber that collects the events emitted on this thread, and returns
    /// its result with them, in order.
    pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Vec<Captured>) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let collector = Collector { events: Arc::clone(&events), next_span: AtomicU64::new(1) };
        let result = tracing::subscriber::with_default(collector, f);
        let events = std::mem::take(&mut *events.lock().unwrap_or_else(PoisonError::into_inner));
        (result, events)
    }

    /// The events whose message is `message`.
    pub fn named<'a>(events: &'a [Captured], message: &'a str) -> impl Iterator<Item = &'a Captured> + 'a {
        events.iter().filter(move |event| event.message() == message)
    }
}

#[cfg(all(test, feature = "tracing"))]
mod tests {
    use tracing::Level;

    use super::capture::{Captured, capture, named};
    use crate::{
        Device, DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryPool, PoolKind, PoolResource, Stream,
        StreamOptions,
    };

    fn device_and_stream() -> (Device, Stream) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        (device, Stream::new(device, StreamOptions::default().non_blocking()).unwrap())
    }

    /// The one event named `message`.
    fn only<'a>(events: &'a [Captured], message: &'a str) -> &'a Captured {
        let found: Vec<&Captured> = named(events, message).collect();
        assert_eq!(found.len(), 1, "one {message:?} event in {events:#?}");
        found[0]
    }

    #[test]
    fn allocation_and_free_are_traced_with_size_pointer_pool_and_stream() {
        let (device, stream) = device_and_stream();
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
        let (ptr, events) = capture(|| {
            let buffer = pool.allocate(4096, &stream).unwrap();
            buffer.ptr()
        });
        let handle = pool.handle() as usize as u64;
        let stream_handle = stream.handle() as usize as u64;
        for message in ["allocate", "free"] {
            let event = only(&events, message);
            assert_eq!(event.level, Level::TRACE, "{event:?}");
            assert_eq!(event.target, "cuda_mem_core::pool", "{event:?}");
            assert_eq!(event.number("size"), Some(4096), "{event:?}");
            assert_eq!(event.number("ptr"), Some(ptr), "{event:?}");
            assert_eq!(event.number("pool"), Some(handle), "{event:?}");
            assert_eq!(event.number("stream"), Some(stream_handle), "{event:?}");
        }
    }

    #[test]
    fn a_pool_is_traced_from_creation_to_destruction() {
        let (device, _) = device_and_stream();
        let options = DeviceMemoryResourceOptions::default().max_size(8 << 20).ipc_enabled(true);
        let (handle, events) = capture(|| {
            let pool = DeviceMemoryResource::new(device, options).unwrap();
            pool.handle() as usize as u64
        });
        let created = only(&events, "pool created");
        assert_eq!(created.level, Level::DEBUG);
        assert_eq!(created.number("pool"), Some(handle));
        assert_eq!(created.number("max_size"), Some(8 << 20));
        assert_eq!(created.fields.get("ipc_enabled").map(String::as_str), Some("true"));
        assert_eq!(created.fields.get("kind").map(String::as_str), Some("device 0"));
        assert_eq!(created.fields.get("pool"), Some(&format!("{handle:#x}")), "in hex, as errors write it");
        assert_eq!(only(&events, "pool destroyed").number("pool"), Some(handle));
    }

    #[test]
    fn pointers_are_hex_kinds_short_and_no_cap_is_no_field() {
        let (device, stream) = device_and_stream();
        let (ptr, events) = capture(|| {
            let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
            let buffer = pool.allocate(256, &stream).unwrap();
            buffer.ptr()
        });
        let created = only(&events, "pool created");
        assert_eq!(created.fields.get("max_size"), None, "no cap: {created:?}");
        let allocated = only(&events, "allocate");
        assert_eq!(allocated.fields.get("ptr"), Some(&format!("{ptr:#x}")));
        assert!(allocated.fields["stream"].starts_with("0x"), "{allocated:?}");
        let kinds: Vec<String> = [PoolKind::Device(device), PoolKind::Pinned, PoolKind::Managed]
            .into_iter()
            .map(|kind| super::fields::pool_kind(kind).to_string())
            .collect();
        assert_eq!(kinds, ["device 0", "pinned", "managed"]);
    }

    /// Export and import in one process: the pool's handle, then an allocation's export data,
    /// mapped through the imported pool and released.
    #[test]
    fn export_and_import_are_traced() {
        let (device, stream) = device_and_stream();
        let options = DeviceMemoryResourceOptions::default().ipc_enabled(true);
        let pool = DeviceMemoryResource::new(device, options).unwrap();
        let buffer = pool.allocate(8192, &stream).unwrap();
        let ((id, imported_handle, mapped), events) = capture(|| {
            let shared = pool.pool().shareable_handle().unwrap();
            let imported = MemoryPool::import(shared.try_clone_fd().unwrap(), shared.id()).unwrap();
            let data = pool.pool().export_pointer(buffer.ptr()).unwrap();
            let mapped = imported.import_allocation(&data, 8192, &stream).unwrap();
            // SAFETY: the one share just taken, given back once; nothing used the mapping.
            unsafe { imported.release_import(mapped, &stream) }.unwrap();
            stream.synchronize().unwrap();
            (shared.id(), imported.handle() as usize as u64, mapped)
        });
        let exporter = pool.handle() as usize as u64;
        let exported = only(&events, "pool exported");
        assert_eq!((exported.level, exported.number("pool")), (Level::DEBUG, Some(exporter)));
        assert_eq!(exported.fields.get("id"), Some(&id.to_string()));
        let imported = only(&events, "pool imported");
        assert_eq!(
            (imported.number("pool"), imported.fields.get("id")),
            (Some(imported_handle), Some(&id.to_string()))
        );
        let allocation = only(&events, "allocation exported");
        assert_eq!((allocation.number("ptr"), allocation.number("pool")), (Some(buffer.ptr()), Some(exporter)));
        let mapping = only(&events, "allocation imported");
        assert_eq!(mapping.number("size"), Some(8192));
        assert_eq!((mapping.number("ptr"), mapping.number("pool")), (Some(mapped), Some(imported_handle)));
        assert_eq!(mapping.number("holders"), Some(1));
        let released = only(&events, "import released");
        assert_eq!((released.number("ptr"), released.number("holders")), (Some(mapped), Some(0)));
        assert!(named(&events, "pool destroyed").any(|e| e.number("pool") == Some(imported_handle)));
    }

    #[test]
    fn peer_access_changes_are_traced() {
        cuda_sim::testing::in_simulated_machine(
            "trace::tests::peer_access_changes_are_traced",
            &[("CUDA_SIM_DEVICES", "2")],
            || {
                cuda_sim::testing::driver().expect("the test driver loads");
                let devices = Device::all().unwrap();
                let [owner, peer] = devices[..] else {
                    cuda_sim::testing::skip("needs two devices");
                    return;
                };
                let pool = DeviceMemoryResource::new(owner, DeviceMemoryResourceOptions::default()).unwrap();
                let ((), events) = capture(|| {
                    pool.add_peer(peer).unwrap();
                    pool.remove_peer(peer).unwrap();
                });
                let changes: Vec<&Captured> = named(&events, "peer access changed").collect();
                assert_eq!(changes.len(), 2, "{events:#?}");
                let handle = pool.handle() as usize as u64;
                for (change, access) in changes.iter().zip(["ReadWrite", "None"]) {
                    assert_eq!(change.level, Level::DEBUG);
                    assert_eq!(change.number("pool"), Some(handle));
                    assert_eq!(change.number("device"), Some(peer.ordinal() as u64));
                    assert_eq!(change.fields.get("access").map(String::as_str), Some(access));
                }
            },
        );
    }
}
