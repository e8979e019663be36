//! A [`MemorySnapshot`] as one self-contained HTML page (feature `snapshot`): no network, no
//! external script. It draws, from what it embeds of the snapshot (its resources and segments,
//! and what [`timeline`](super::timeline) works out of its history, so that the page's size and
//! the browser's work do not grow with the history):
//!
//! - the active-memory timeline: every allocation of the history a band, stacked in the order
//!   they were made (a band moves down when one below it is freed), over the history's events;
//!   coloured by resource or by stream; hovering a band shows its size, address, stream, thread
//!   and backtrace; the wheel zooms, a double click resets. The largest
//!   [`DRAWN_ALLOCATIONS`] are drawn one by one, the rest as one band on top ("the rest", at
//!   most 4,000 points, each the most bytes of its span), so a history of a million events
//!   stays responsive;
//! - the segment map: each segment's blocks, to scale, allocated, free or pending (past 20,000
//!   blocks, neighbours of one state are drawn as one);
//! - the events before each out-of-memory failure (the latest 50);
//! - the summary table of [`Display`](std::fmt::Display).
//!
//! [`MemorySnapshot::timeline_svg`] draws the timeline as a static SVG (active bytes per resource
//! over the events) for reports and CI logs.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::json::SnapshotFormatError;
use super::model::{EventView, MemorySnapshot, ResourceSnapshot};
use super::summary::human;
use super::timeline::{EVENTS_BEFORE_OOM, Timeline, listed_ooms};

/// How many allocations the page draws one by one (the largest; the rest as one band).
pub const DRAWN_ALLOCATIONS: usize = 2000;

/// The page's script: reads the snapshot from the `snapshot` element and draws it.
const SCRIPT: &str = include_str!("viewer.js");

/// The page's style.
const STYLE: &str = "body{font:13px system-ui,sans-serif;margin:16px;color:#222}h1{font-size:18px}h2{font-size:15px;margin-top:24px}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}\
td.l,th.l{text-align:left}#timeline{border:1px solid #ccc;width:100%;height:420px;cursor:crosshair}\
#info{white-space:pre;font:12px monospace;background:#fafafa;border:1px solid #ddd;padding:6px;min-height:48px;max-height:240px;overflow:auto}\
.seg{display:flex;height:18px;margin:2px 0;border:1px solid #999;min-width:40px}.seg div{height:100%;border-right:1px solid #fff}\
.allocated{background:#d9534f}.free{background:#9fd49f}.pending{background:#f0ad4e}.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}";

/// What the page embeds: the snapshot without its events, and what the page draws of them
/// (worked out here, so that the page stays small however long the history).
#[derive(serde::Serialize)]
struct PageData<'a> {
    version: u32,
    taken_at_ns: u64,
    resources: &'a [ResourceSnapshot],
    dropped_events: u64,
    /// The events the snapshot holds.
    event_count: usize,
    timeline: PageTimeline,
    /// The drawn allocations' backtraces, each once (allocations name them by index).
    traces: Vec<&'a [String]>,
    /// The latest out-of-memory failures, each with the events before it.
    ooms: Vec<PageOom<'a>>,
    /// Earlier failures not listed.
    ooms_not_listed: usize,
}

/// An allocation drawn one by one: its number (of all, in the order made), first move, end
/// move, size, address, stream, resource, thread and backtrace (an index of `traces`).
type DrawnAllocation = (usize, usize, usize, u64, u64, u64, u64, u64, Option<usize>);

#[derive(serde::Serialize)]
struct PageTimeline {
    /// The history's allocate and free_requested events, counted: the timeline's width.
    moves: usize,
    /// Allocations in the history.
    allocations: usize,
    /// The largest [`DRAWN_ALLOCATIONS`], in the order made.
    drawn: Vec<DrawnAllocation>,
    /// The others' live bytes as one band: `[move, drawn bytes, rest bytes]` points.
    rest: Vec<[u64; 3]>,
}

#[derive(serde::Serialize)]
struct PageOom<'a> {
    event: &'a EventView,
    before: &'a [EventView],
}

impl MemorySnapshot {
    /// What the page embeds.
    fn page_data(&self) -> PageData<'_> {
        let timeline = Timeline::of(&self.events);
        let drawn_flags = timeline.drawn(DRAWN_ALLOCATIONS);
        let mut traces: Vec<&[String]> = Vec::new();
        let mut trace_index: HashMap<&[String], usize> = HashMap::new();
        let mut drawn = Vec::with_capacity(DRAWN_ALLOCATIONS.min(timeline.allocations.len()));
        for (number, (allocation, _)) in
            timeline.allocations.iter().zip(&drawn_flags).enumerate().filter(|&(_, (_, &is_drawn))| is_drawn)
        {
            let event = &self.events[allocation.event];
            let trace = event.backtrace.as_deref().map(|frames| {
                *trace_index.entry(frames).or_insert_with(|| {
                    traces.push(frames);
                    traces.len() - 1
                })
            });
            drawn.push((
                number,
                allocation.start,
                allocation.end,
                allocation.size,
                event.address,
                event.stream,
                event.resource,
                event.thread,
                trace,
            ));
        }
        let rest =
            if drawn.len() < timeline.allocations.len() { timeline.live_bytes(&drawn_flags) } else { Vec::new() };
        let (listed, ooms_not_listed) = listed_ooms(self);
        let ooms = listed
            .into_iter()
            .map(|at| PageOom {
                event: &self.events[at],
                before: &self.events[at.saturating_sub(EVENTS_BEFORE_OOM)..at],
            })
            .collect();
        PageData {
            version: self.version,
            taken_at_ns: self.taken_at_ns,
            resources: &self.resources,
            dropped_events: self.dropped_events,
            event_count: self.events.len(),
            timeline: PageTimeline { moves: timeline.moves, allocations: timeline.allocations.len(), drawn, rest },
            traces,
            ooms,
            ooms_not_listed,
        }
    }

    /// The viewer page for this snapshot. It embeds the snapshot's resources and segments, and
    /// of its history what it draws: the largest [`DRAWN_ALLOCATIONS`] allocations (with their
    /// backtraces), the others' live bytes as one band, and the events before the latest 50
    /// out-of-memory failures; its size does not grow with the history's length.
    ///
    /// # Errors
    /// As [`to_json`](MemorySnapshot::to_json).
    pub fn to_html(&self) -> Result<String, SnapshotFormatError> {
        // `</` would end the script element early: JSON allows `<\/` for it.
        let json = serde_json::to_string(&self.page_data())?.replace("</", "<\\/");
        let mut page = String::with_capacity(json.len() + SCRIPT.len() + 4096);
        page.push_str(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Memory snapshot</title><style>",
        );
        page.push_str(STYLE);
        page.push_str("</style></head><body>\n<h1>Memory snapshot</h1>\n<div id=\"headline\"></div>\n");
        page.push_str("<h2>Active memory over the history's events</h2>\n<div>colour by <select id=\"colour\"><option value=\"resource\">resource</option><option value=\"stream\">stream</option></select> · wheel: zoom · double click: all</div>\n");
        page.push_str("<div class=\"legend\" id=\"key\"></div><svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" preserveAspectRatio=\"none\"></svg>\n<div id=\"info\">hover an allocation</div>\n");
        page.push_str("<h2>Resources</h2>\n<div id=\"summary\"></div>\n<h2>Segments</h2>\n<div class=\"legend\"><span class=\"allocated\"></span>allocated<span class=\"free\"></span>free<span class=\"pending\"></span>pending</div><div id=\"segments\"></div>\n");
        page.push_str("<h2>Before each out-of-memory failure</h2>\n<div id=\"ooms\"></div>\n");
        page.push_str("<script type=\"application/json\" id=\"snapshot\">");
        page.push_str(&json);
        let _ = write!(page, "</script>\n<script>const DRAWN_ALLOCATIONS = {DRAWN_ALLOCATIONS};\n");
        page.push_str(SCRIPT);
        page.push_str("</script>\n</body></html>\n");
        Ok(page)
    }

    /// Writes [`to_html`](MemorySnapshot::to_html)'s page to `path`.
    ///
    /// # Errors
    /// As [`to_html`](MemorySnapshot::to_html), and the file's.
    pub fn write_html(&self, path: impl AsRef<std::path::Path>) -> Result<(), SnapshotFormatError> {
        Ok(std::fs::write(path, self.to_html()?)?)
    }

    /// The timeline as a static SVG: the live bytes of each resource's allocations (from the
    /// history), stacked, over the events (at most 1,000 columns, each the most of the events
    /// it covers).
    pub fn timeline_svg(&self) -> String {
        const WIDTH: f64 = 900.0;
        const HEIGHT: f64 = 300.0;
        const COLUMNS: usize = 1000;
        let mut resources: Vec<u64> = Vec::new();
        // Live allocations by resource, address and size, counted (buffers may alias).
        let mut live: BTreeMap<(u64, u64, u64), u64> = BTreeMap::new();
        let mut per_resource: Vec<u64> = Vec::new();
        let mut columns: Vec<Vec<u64>> = Vec::new();
        let moves: Vec<_> =
            self.events.iter().filter(|event| event.kind == "allocate" || event.kind == "free_requested").collect();
        let per_column = moves.len().div_ceil(COLUMNS).max(1);
        for (index, event) in moves.iter().enumerate() {
            let slot = match resources.iter().position(|&id| id == event.resource) {
                Some(slot) => slot,
                None => {
                    resources.push(event.resource);
                    per_resource.push(0);
                    resources.len() - 1
                }
            };
            let key = (event.resource, event.address, event.size);
            if event.kind == "allocate" {
                *live.entry(key).or_default() += 1;
                per_resource[slot] += event.size;
            } else if let Some(count) = live.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    live.remove(&key);
                }
                per_resource[slot] -= event.size;
            }
            let column = index / per_column;
            if columns.len() <= column {
                columns.push(vec![0; resources.len()]);
            }
            let at = &mut columns[column];
            at.resize(resources.len(), 0);
            // The column shows the moment of its most live bytes.
            if per_resource.iter().sum::<u64>() >= at.iter().sum::<u64>() {
                at.clone_from(&per_resource);
            }
        }
        let peak = columns.iter().map(|column| column.iter().sum::<u64>()).max().unwrap_or(0).max(1);
        let mut svg = String::new();
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">\
             <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/><text x=\"4\" y=\"12\">active memory (peak {p}), {n} events</text>",
            w = WIDTH + 60.0,
            h = HEIGHT + 64.0,
            p = human(peak),
            n = moves.len()
        );
        let count = columns.len().max(1) as f64;
        for slot in 0..resources.len() {
            let mut points = String::new();
            let (mut top, mut bottom) = (Vec::new(), Vec::new());
            for (index, column) in columns.iter().enumerate() {
                let below: u64 = column.iter().take(slot).sum();
                let mine = column.get(slot).copied().unwrap_or(0);
                let x = 50.0 + WIDTH * index as f64 / count;
                let y = |bytes: u64| 20.0 + HEIGHT * (1.0 - bytes as f64 / peak as f64);
                top.push((x, y(below + mine)));
                bottom.push((x, y(below)));
            }
            for (x, y) in top.iter().chain(bottom.iter().rev()) {
                let _ = write!(points, "{x:.1},{y:.1} ");
            }
            let _ = write!(
                svg,
                "<polygon points=\"{points}\" fill=\"{}\" fill-opacity=\"0.8\"><title>resource {:#x}</title></polygon>",
                PALETTE[slot % PALETTE.len()],
                resources[slot]
            );
        }
        // The legend, under the plot: each resource's colour and kind (as the snapshot names it).
        for (slot, id) in resources.iter().enumerate().take(8) {
            let kind = self.resource_of_event(*id).map_or("resource", |r| r.kind.name());
            let x = 50.0 + 220.0 * (slot % 4) as f64;
            let y = HEIGHT + 34.0 + 14.0 * (slot / 4) as f64;
            let _ = write!(
                svg,
                "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{y}\">{kind} {id:#x}</text>",
                y - 9.0,
                PALETTE[slot % PALETTE.len()],
                x + 14.0
            );
        }
        let _ = write!(
            svg,
            "<line x1=\"50\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/><text x=\"4\" y=\"{t}\">{p}</text><text x=\"4\" y=\"{b}\">0</text></svg>",
            b = 20.0 + HEIGHT,
            r = 50.0 + WIDTH,
            t = 30.0,
            p = human(peak)
        );
        svg
    }
}

/// The colours of resources (and streams), in turn.
const PALETTE: [&str; 8] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{HistoryRecord, ResourceId};
    use crate::snapshot::{EventView, ResourceKind, ResourceSnapshot};

    fn event(kind: &str, address: u64, size: u64) -> EventView {
        EventView {
            time_ns: 0,
            kind: kind.into(),
            address,
            size,
            stream: 0,
            resource: 1,
            thread: 1,
            backtrace: Some(vec!["0: </script><b>".into()]),
        }
    }

    #[test]
    fn the_page_embeds_the_snapshot_safely_and_the_svg_stacks_what_is_live() {
        let resource = ResourceSnapshot::new(ResourceId(1), ResourceKind::DevicePool, "pool");
        let mut snapshot = MemorySnapshot::new(vec![resource], &HistoryRecord::default(), 0);
        snapshot.events =
            vec![event("allocate", 0x10, 100), event("allocate", 0x20, 50), event("free_requested", 0x10, 100)];
        let page = snapshot.to_html().unwrap();
        assert_eq!(page.matches("</script>").count(), 2, "the backtrace's `</script>` is escaped");
        assert_eq!(page.matches("http").count(), page.matches("http://www.w3.org/2000/svg").count(), "no network");
        assert!(!page.contains("src=\""), "no external script");
        let svg = snapshot.timeline_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("peak 150 B") && svg.contains("3 events"), "{svg}");
    }
}
