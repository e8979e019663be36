//! A [`MemorySnapshot`] as the table a person reads in a terminal (`torch.cuda.memory_summary`):
//! one row per resource, its segments below it, then what the history recorded. Sizes in
//! B/KiB/MiB/GiB, addresses in hex.

use std::fmt;

use super::model::{BlockState, MemorySnapshot};

/// `bytes` with the largest binary unit that leaves at least 1 (two decimals).
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.2} {}", UNITS[unit]) }
}

impl fmt::Display for MemorySnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory snapshot (schema {}), {} resource(s)", self.version, self.resources.len())?;
        const HEADER: [&str; 9] =
            ["resource", "kind", "device", "reserved", "used", "peak res.", "peak used", "live", "name"];
        let [r, k, d, res, u, pr, pu, l, n] = HEADER;
        writeln!(f, "{r:<16} {k:<15} {d:>6} {res:>12} {u:>12} {pr:>12} {pu:>12} {l:>8}  {n}")?;
        for resource in &self.resources {
            let device = resource.device.map_or_else(|| "-".to_owned(), |device| device.to_string());
            writeln!(
                f,
                "{:<16} {:<15} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8}  {}",
                format!("{:#x}", resource.id),
                resource.kind.name(),
                device,
                human(resource.reserved_bytes),
                human(resource.used_bytes),
                human(resource.reserved_peak),
                human(resource.used_peak),
                resource.live_allocations,
                resource.name,
            )?;
            for segment in &resource.segments {
                let (mut allocated, mut free, mut pending) = (0u64, 0u64, 0u64);
                for block in &segment.blocks {
                    match block.state {
                        BlockState::Allocated { .. } => allocated += block.size,
                        BlockState::Free => free += block.size,
                        BlockState::Pending => pending += block.size,
                    }
                }
                let reserved =
                    segment.reserved.map(|bytes| format!(" of {} reserved", human(bytes))).unwrap_or_default();
                writeln!(
                    f,
                    "    segment {:#x} {}{reserved}, stream {:#x}: {} block(s), {} allocated, {} free, {} pending",
                    segment.address,
                    human(segment.size),
                    segment.stream,
                    segment.blocks.len(),
                    human(allocated),
                    human(free),
                    human(pending),
                )?;
            }
        }
        if self.events.is_empty() && self.dropped_events == 0 {
            return writeln!(f, "history: nothing recorded");
        }
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for event in &self.events {
            match counts.iter_mut().find(|(kind, _)| *kind == event.kind) {
                Some((_, count)) => *count += 1,
                None => counts.push((&event.kind, 1)),
            }
        }
        let counted: Vec<String> = counts.iter().map(|(kind, count)| format!("{count} {kind}")).collect();
        writeln!(
            f,
            "history: {} event(s) kept ({}), {} dropped",
            self.events.len(),
            counted.join(", "),
            self.dropped_events
        )?;
        for event in self.events.iter().filter(|event| event.kind == "out_of_memory") {
            writeln!(
                f,
                "    out of memory at {:.6} s: {} asked of resource {:#x} (thread {})",
                event.time_ns as f64 / 1e9,
                human(event.size),
                event.resource,
                event.thread
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{HistoryRecord, ResourceId};
    use crate::snapshot::{BlockView, ResourceKind, ResourceSnapshot, SegmentView};

    #[test]
    fn sizes_take_the_largest_unit_and_the_table_names_every_resource_and_segment() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(20 << 20), "20.00 MiB");
        assert_eq!(human(3 << 30), "3.00 GiB");
        let mut cache = ResourceSnapshot::new(ResourceId(0xabc), ResourceKind::Caching, "caching over X");
        cache.reserved_bytes = 2 << 20;
        let mut segment = SegmentView::new(0x7f00_0000_0000, 2 << 20);
        segment.blocks = vec![
            BlockView::new(0x7f00_0000_0000, 1 << 20, BlockState::Allocated { requested: 1000 }),
            BlockView::new(0x7f00_0010_0000, 1 << 20, BlockState::Free),
        ];
        cache.segments.push(segment);
        let snapshot = MemorySnapshot::new(vec![cache], &HistoryRecord::default(), 0);
        let text = snapshot.to_string();
        assert!(text.contains("0xabc") && text.contains("caching") && text.contains("2.00 MiB"), "{text}");
        assert!(text.contains("segment 0x7f0000000000 2.00 MiB") && text.contains("1.00 MiB free"), "{text}");
        assert!(text.contains("history: nothing recorded"), "{text}");
    }
}
