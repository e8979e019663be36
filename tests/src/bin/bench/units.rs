//! Sizes and times in readable units, for the printed lines, the tables and the plots.

/// A kibibyte.
pub(crate) const KIB: usize = 1 << 10;
/// A mebibyte.
pub(crate) const MIB: usize = 1 << 20;
/// A gibibyte.
const GIB: usize = 1 << 30;

/// Nanoseconds, readably.
pub(crate) fn ns(value: f64) -> String {
    if value >= 1e9 {
        format!("{:.2} s", value / 1e9)
    } else if value >= 1e6 {
        format!("{:.2} ms", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.2} µs", value / 1e3)
    } else {
        format!("{value:.0} ns")
    }
}

/// Nanoseconds as a plot's tick label: in the largest unit under the value, with no more digits
/// than it needs (`1 s`, `500 ms`, `2.5 µs`, `0`).
pub(crate) fn ns_tick(value: f64) -> String {
    let (scale, unit) = match value.abs() {
        v if v >= 1e9 => (1e9, "s"),
        v if v >= 1e6 => (1e6, "ms"),
        v if v >= 1e3 => (1e3, "µs"),
        _ => (1.0, "ns"),
    };
    let digits = format!("{:.3}", value / scale);
    let digits = digits.trim_end_matches('0').trim_end_matches('.');
    if digits == "0" || digits == "-0" { "0".to_string() } else { format!("{digits} {unit}") }
}

/// A size in bytes, in the largest of B, KiB, MiB and GiB that divides it.
pub(crate) fn bytes(size: usize) -> String {
    match size {
        s if s >= GIB && s % GIB == 0 => format!("{} GiB", s / GIB),
        s if s >= MIB && s % MIB == 0 => format!("{} MiB", s / MIB),
        s if s >= KIB && s % KIB == 0 => format!("{} KiB", s / KIB),
        s => format!("{s} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_round() {
        let cases =
            [(1e9, "1 s"), (5e8, "500 ms"), (2000.0, "2 µs"), (2500.0, "2.5 µs"), (0.0, "0"), (200.0, "200 ns")];
        for (value, label) in cases {
            assert_eq!(ns_tick(value), label, "{value}");
        }
        // Steps of a tenth that floating point cannot hold exactly.
        assert_eq!(ns_tick(3.0 * 100_000.0 * 1.000_000_000_000_1), "300 µs");
    }

    #[test]
    fn times_and_sizes_name_their_unit() {
        assert_eq!(ns(1e9), "1.00 s");
        assert_eq!(ns(1500.0), "1.50 µs");
        assert_eq!(bytes(1 << 30), "1 GiB");
        assert_eq!(bytes(768 * MIB), "768 MiB");
        assert_eq!(bytes(256), "256 B");
    }
}
