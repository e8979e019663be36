//! Snapshots of real resources on the simulator: their totals against the resources' own
//! figures, the history under 8 threads, the JSON round trip, and the viewer in a real browser
//! (headless Chromium loads the page, draws every allocation, shows a backtrace on hover, and
//! takes a screenshot of the timeline, kept in `target/viewer/`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cuda_mem_core::history::{self, HistoryOptions, MemoryEventKind, ResourceId};
use cuda_mem_core::snapshot::{BlockState, MemorySnapshot, ResourceKind, take_snapshot};
use cuda_mem_core::{Buffer, CachingOptions, CachingResource, DeviceMemoryResource, PoolResource, Stream};
use cuda_sim::testing::in_simulated_machine;

const KIB: usize = 1 << 10;

/// A cache over a pool, some blocks live and some freed, recorded with backtraces.
// Never inlined, so that release builds (the GPU bundle's) keep its frame in backtraces.
#[inline(never)]
fn workload(streams: &[Stream]) -> (Arc<DeviceMemoryResource>, Arc<CachingResource>, Vec<Buffer>) {
    let device = common::device();
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let cache = CachingResource::new(pool.clone(), CachingOptions::default()).unwrap();
    let mut live = Vec::new();
    for round in 0..40usize {
        let stream = &streams[round % streams.len()];
        let buffer = cache.allocate(KIB * (1 + round % 7) * 16, stream).unwrap();
        if round % 3 == 0 {
            live.push(buffer);
        }
    }
    live.push(pool.allocate(3 << 20, &streams[0]).unwrap());
    (pool, cache, live)
}

/// A snapshot's figures are the resources' own at the same moment, its blocks the live
/// buffers, and it reads back from its JSON as it was.
#[test]
fn a_snapshot_holds_what_the_resources_say_and_reads_back_from_json() {
    in_simulated_machine("a_snapshot_holds_what_the_resources_say_and_reads_back_from_json", &[], || {
        let device = common::device();
        let streams = [common::stream(device), common::stream(device)];
        let (pool, cache, live) = workload(&streams);
        let snapshot = take_snapshot();
        let cached = snapshot.resource(ResourceId::of(&*cache)).expect("the cache is in it");
        let stats = cache.statistics().all;
        assert_eq!(cached.kind, ResourceKind::Caching);
        assert_eq!(
            (cached.reserved_bytes, cached.used_bytes),
            (stats.reserved_bytes.current, stats.allocated_bytes.current)
        );
        assert_eq!(cached.upstream, Some(ResourceId::of(&*pool).0));
        let allocated: Vec<u64> = cached
            .segments
            .iter()
            .flat_map(|segment| &segment.blocks)
            .filter(|block| matches!(block.state, BlockState::Allocated { .. }))
            .map(|block| block.address)
            .collect();
        let mut expected: Vec<u64> = live[..live.len() - 1].iter().map(Buffer::ptr).collect();
        expected.sort_unstable();
        assert_eq!(allocated, expected, "the allocated blocks are the live buffers");
        let pooled = snapshot.resource(ResourceId::of(&*pool)).expect("the pool is in it");
        let usage = pool.usage().unwrap();
        assert_eq!(pooled.kind, ResourceKind::DevicePool);
        assert_eq!((pooled.reserved_bytes, pooled.used_bytes), (usage.reserved_bytes, usage.used_bytes));
        assert_eq!(pooled.live_allocations, usage.live_allocations);
        assert_eq!(pooled.pool, Some(pool.pool().handle() as usize as u64), "its pool's events find it");
        assert_eq!(snapshot.resource_of_event(pooled.pool.unwrap()).map(|r| r.id), Some(pooled.id));
        assert_eq!(MemorySnapshot::from_json(&snapshot.to_json().unwrap()).unwrap(), snapshot);
        drop((live, cache));
        let after = take_snapshot();
        assert!(after.resource(ResourceId::of(&*pool)).is_some() && after.resources.len() == 1, "the cache is gone");
    });
}

/// Eight threads record at once: every event a thread made is kept or counted as dropped.
#[test]
fn recording_under_eight_threads_keeps_or_counts_every_event() {
    in_simulated_machine("recording_under_eight_threads_keeps_or_counts_every_event", &[], || {
        let _serial = history::tests_serial();
        let device = common::device();
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        const THREADS: usize = 8;
        const PAIRS: usize = 500;
        for capacity in [1_000_000, 3_000] {
            history::start_recording(HistoryOptions::default().capacity(capacity).free_completions(true));
            std::thread::scope(|scope| {
                for _ in 0..THREADS {
                    scope.spawn(|| {
                        let stream = common::stream(device);
                        for _ in 0..PAIRS {
                            drop(pool.allocate(4 * KIB, &stream).unwrap());
                        }
                        stream.synchronize().unwrap();
                    });
                }
            });
            history::stop_recording();
            let record = history::history();
            // Each pair is an allocation, a free requested and, from the driver's thread once
            // the stream's work before it is done (the threads synchronize), its completion.
            let events = THREADS * PAIRS * 3;
            let ours = record.events.iter().filter(|event| event.resource == ResourceId::of(&*pool)).count() as u64;
            assert_eq!(ours + record.dropped, events as u64, "capacity {capacity}");
            assert_eq!(record.events.len(), record.events.len().min(capacity));
            let callers: std::collections::BTreeSet<u64> = record
                .events
                .iter()
                .filter(|event| event.kind != MemoryEventKind::FreeCompleted)
                .map(|event| event.thread)
                .collect();
            if capacity > events {
                assert_eq!((record.dropped, callers.len()), (0, THREADS));
                for thread in callers {
                    let mine: Vec<_> = record
                        .events
                        .iter()
                        .filter(|event| event.thread == thread && event.kind != MemoryEventKind::FreeCompleted)
                        .collect();
                    assert!(mine.windows(2).all(|pair| pair[0].kind != pair[1].kind), "alternating pairs");
                    assert_eq!(mine[0].kind, MemoryEventKind::Allocate);
                }
                let completed =
                    record.events.iter().filter(|event| event.kind == MemoryEventKind::FreeCompleted).count();
                assert_eq!(completed, THREADS * PAIRS, "every free completed");
            } else {
                assert_eq!(record.dropped, (events - capacity) as u64);
            }
        }
    });
}

/// The Chromium binary, if this machine has one.
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        let found = Command::new("which").arg(name).output().ok()?;
        found.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&found.stdout).trim()))
    })
}

/// The value of `data-<name>` on the body of a dumped DOM.
fn body_data<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let body = &dom[dom.find("<body")?..];
    let attribute = format!("data-{name}=\"");
    let start = body[..body.find('>')?].find(&attribute)? + attribute.len();
    Some(&body[start..start + body[start..].find('"')?])
}

/// The DOM of `url` once Chromium has run its scripts; the page's script ran to its end
/// without an error.
fn dump_dom(chromium: &Path, url: &str) -> String {
    let dump = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom", url])
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert_eq!(
        body_data(&dom, "ready"),
        Some("1"),
        "the script ran to its end: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    assert_eq!(body_data(&dom, "errors"), None, "no script error");
    dom
}

/// A screenshot of `url`, for a person to look at, kept as `target/viewer/<name>`.
fn screenshot(chromium: &Path, url: &str, name: &str) {
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../viewer");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join(name);
    let taken = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900", "--virtual-time-budget=5000"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(shot.exists(), "no screenshot: {}", String::from_utf8_lossy(&taken.stderr));
    println!("the viewer's screenshot: {}", shot.display());
}

/// The viewer as a person sees it: headless Chromium loads the page with no script error, draws
/// every allocation of the history and every block, shows the hovered allocation's backtrace,
/// and takes a screenshot of it (kept in `target/viewer/timeline.png`).
#[test]
fn the_viewer_draws_every_allocation_and_shows_a_backtrace_in_a_real_browser() {
    in_simulated_machine("the_viewer_draws_every_allocation_and_shows_a_backtrace_in_a_real_browser", &[], || {
        let Some(chromium) = chromium() else {
            eprintln!("SKIP: no Chromium on this machine (Debian's `chromium` package runs this test)");
            return;
        };
        let _serial = history::tests_serial();
        let device = common::device();
        let streams = [common::stream(device), common::stream(device)];
        history::start_recording(HistoryOptions::default().backtraces(true));
        let (pool, cache, live) = workload(&streams);
        history::stop_recording();
        let snapshot = take_snapshot();
        let allocations = snapshot.events.iter().filter(|event| event.kind == "allocate").count();
        let blocks: usize = snapshot.resources.iter().flat_map(|r| &r.segments).map(|s| s.blocks.len()).sum();
        assert!(allocations >= 41 && blocks > 0);
        let folder = tempfile::tempdir().unwrap();
        let page = folder.path().join("snapshot.html");
        snapshot.write_html(&page).unwrap();
        let url = format!("file://{}#hover-first", page.display());
        let dom = dump_dom(&chromium, &url);
        assert_eq!(body_data(&dom, "drawn"), Some(allocations.to_string().as_str()), "every allocation drawn");
        assert_eq!(body_data(&dom, "blocks"), Some(blocks.to_string().as_str()), "every block drawn");
        let info = &dom[dom.find("id=\"info\"").unwrap()..];
        let info = &info[..info.find("</div>").unwrap_or(info.len())];
        assert!(info.contains("backtrace:") && info.contains("workload"), "the hovered allocation's stack: {info}");
        assert!(!info.contains("history::record"), "the recorder's own frames are left out: {info}");
        // The wheel over the middle zooms in around it: a narrower view, inside the whole.
        let view = |name| -> (f64, f64) {
            let text = body_data(&dom, name).unwrap_or_else(|| panic!("no data-{name}"));
            let (from, to) = text.split_once(' ').unwrap();
            (from.parse().unwrap(), to.parse().unwrap())
        };
        let (before, after) = (view("view-before"), view("view-after"));
        assert_eq!(before.0, 0.0);
        assert!(after.0 > before.0 && after.1 < before.1, "zoomed in: {before:?} to {after:?}");
        assert_eq!(view("view-reset"), before, "a double click shows the whole timeline again");
        screenshot(&chromium, &url, "timeline.png");
        drop((live, cache, pool));
    });
}

/// A history of a million events makes a page of what it draws, not of the history: headless
/// Chromium loads it without an error and draws the largest `DRAWN_ALLOCATIONS` one by one and
/// the others as one band (a screenshot is kept as `target/viewer/million.png`).
#[test]
fn a_million_events_make_a_small_page_that_a_real_browser_draws() {
    in_simulated_machine("a_million_events_make_a_small_page_that_a_real_browser_draws", &[], || {
        let Some(chromium) = chromium() else {
            eprintln!("SKIP: no Chromium on this machine (Debian's `chromium` package runs this test)");
            return;
        };
        const EVENTS: usize = 1_000_000;
        let _serial = history::tests_serial();
        let device = common::device();
        let stream = common::stream(device);
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let cache = CachingResource::new(pool.clone(), CachingOptions::default()).unwrap();
        history::start_recording(HistoryOptions::default().capacity(EVENTS));
        // A sawtooth of many sizes: up to 3,000 live, then the oldest 2,000 freed.
        let mut live = std::collections::VecDeque::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..520_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            live.push_back(cache.allocate(KIB * (1 + (seed % 256) as usize), &stream).unwrap());
            if live.len() == 3000 {
                live.drain(..2000);
            }
        }
        history::stop_recording();
        let snapshot = take_snapshot();
        assert_eq!(snapshot.events.len(), EVENTS, "the ring is full");
        assert!(snapshot.dropped_events > 0, "and dropped the oldest");
        let page = snapshot.to_html().unwrap();
        assert!(page.len() < 1 << 20, "the page carries what it draws: {} bytes", page.len());
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("million.html");
        std::fs::write(&path, page).unwrap();
        let url = format!("file://{}", path.display());
        let dom = dump_dom(&chromium, &url);
        let drawn = cuda_mem_core::snapshot::DRAWN_ALLOCATIONS.to_string();
        assert_eq!(body_data(&dom, "drawn"), Some(drawn.as_str()), "the largest drawn one by one");
        assert!(dom.contains("smaller allocations") || dom.contains("fill=\"#bbbbbb\""), "the rest as one band");
        assert!(dom.contains("1000000 event(s) kept"), "the headline counts every event");
        screenshot(&chromium, &url, "million.png");
        drop((live, cache, pool));
    });
}
