//! Events for what memory does, behind the `tracing` feature: one macro, [`memory_event!`], that
//! the memory crates call where they allocate, free, create or destroy a pool, export, import,
//! change peer access or grow. With the feature off it expands to nothing (its arguments are not
//! even evaluated), so the hot paths compile to what they were without it.
//!
//! Levels: `TRACE` for allocation and freeing (the hot path), `DEBUG` for everything else. Each
//! event's message names what happened (`"allocate"`, `"free"`, `"pool created"`, …) and its
//! fields carry numbers: `size` in bytes, `ptr`, `pool` (the `CUmemoryPool` handle as an
//! integer), `stream` (the `CUstream` handle as an integer), `device` (an ordinal).

/// Emits a `tracing` event at the given level (`TRACE`, `DEBUG`, `INFO`, …) with `tracing`'s
/// field syntax: `memory_event!(TRACE, size, ptr, "allocate")`. Expands to nothing without the
/// `tracing` feature. For this workspace's memory crates; not part of the API.
#[cfg(feature = "tracing")]
#[doc(hidden)]
#[macro_export]
macro_rules! memory_event {
    ($level:ident, $($rest:tt)+) => {
        $crate::__private::tracing::event!($crate::__private::tracing::Level::$level, $($rest)+)
    };
}

/// Emits a `tracing` event (the `tracing` feature is off: nothing).
#[cfg(not(feature = "tracing"))]
#[doc(hidden)]
#[macro_export]
macro_rules! memory_event {
    ($($anything:tt)*) => {};
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

        /// A numeric field.
        pub fn number(&self, name: &str) -> Option<u64> {
            self.fields.get(name)?.parse().ok()
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
