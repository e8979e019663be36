//! Sizes and times in readable units, for the printed lines, the tables and the plots.

/// A kibibyte.
pub(crate) const KIB: usize = 1 << 10;
/// A mebibyte.
pub(crate) const MIB: usize = 1 << 20;

/// Nanoseconds, readably.
pub(crate) fn ns(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} ms", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.2} µs", value / 1e3)
    } else {
        format!("{value:.0} ns")
    }
}

/// A size in bytes, in the largest of B, KiB and MiB that divides it.
pub(crate) fn bytes(size: usize) -> String {
    match size {
        s if s >= MIB && s % MIB == 0 => format!("{} MiB", s / MIB),
        s if s >= KIB && s % KIB == 0 => format!("{} KiB", s / KIB),
        s => format!("{s} B"),
    }
}
