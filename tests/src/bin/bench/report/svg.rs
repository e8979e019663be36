//! The SVG plots: a small line-plot writer ([`svg`]), and the four plots made with it (VMM step
//! times against the buffer's size, case (1)'s pairs and case (7)'s copies against the size,
//! case (1b)'s pairs against the threads).

use std::fmt::Write as _;

use crate::adaptors::{COPY_SIZES, CopyRow};
use crate::pools::{POOL_SIZES, POOL_THREADS, PoolRow};
use crate::replay::TraceRun;
use crate::scaling::{SCALING_SIZE, SCALING_THREADS, ScalingRow};
use crate::units::{MIB, bytes, ns_tick};
use crate::vmm::VmmMode;

/// One line of a plot: its name, its colour and its (x, y) points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A plot: lines of (x, y) points, log-scale x or y when asked.
struct Plot<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    log_x: bool,
    /// Decades on the y axis: for lines that differ by orders of magnitude, where one outlier
    /// would otherwise flatten everything else against the axis.
    log_y: bool,
    series: Vec<Series<'a>>,
    x_ticks: Vec<(f64, String)>,
    /// The y axis' tick labels, from the values (times: [`ns_tick`]).
    y_tick: fn(f64) -> String,
}

/// The plot as an SVG document.
fn svg(plot: &Plot<'_>) -> String {
    let legend = legend_layout(&plot.series, LEFT, WIDTH - RIGHT);
    let legend_rows = legend.last().map_or(0.0, |&(_, row)| row + 1.0);
    let frame = Frame::new(plot, 46.0 + LEGEND_ROW * legend_rows);
    let mut out = axes(plot, &frame);
    y_ticks(&mut out, plot, &frame);
    for (x, label) in &plot.x_ticks {
        let (x, y) = (frame.px(*x), frame.h - BOTTOM + 18.0);
        let _ = writeln!(out, r#"<text x="{x:.1}" y="{y}" text-anchor="middle">{label}</text>"#);
    }
    for (series, &(x, row)) in plot.series.iter().zip(&legend) {
        line(&mut out, plot, &frame, series);
        let (name, color, _) = series;
        let y = 46.0 + LEGEND_ROW * row;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{y}">{name}</text>"#,
            y - 4.0,
            x + 20.0,
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The page's width, and the room on the left for the tick labels and the axis title, on the
/// right for the last x label, and below for the x labels and the axis title (above, the title
/// and the legend: outside the plot so no line hides it).
const WIDTH: f64 = 780.0;
const LEFT: f64 = 104.0;
const RIGHT: f64 = 48.0;
const BOTTOM: f64 = 60.0;

/// Where a plot's values land on the page: the page's height and the plot's top, and the axes'
/// ranges in their own units (log2 of x on a log x axis; decades of y on a log y axis).
struct Frame {
    h: f64,
    top: f64,
    log_x: bool,
    log_y: bool,
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    /// The frame of `plot`'s points (non-positive values have no place on a log y axis: they
    /// are left out of it), the plot starting at `top`.
    fn new(plot: &Plot<'_>, top: f64) -> Frame {
        let mut frame =
            Frame { h: 396.0 + top, top, log_x: plot.log_x, log_y: plot.log_y, x0: 0.0, x1: 1.0, y0: 0.0, y1: 1.0 };
        let points: Vec<(f64, f64)> =
            shown(plot, &plot.series.iter().flat_map(|s| s.2.iter().copied()).collect::<Vec<_>>());
        let xs = points.iter().map(|&(x, _)| frame.fx(x));
        let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(low, high), x| (low.min(x), high.max(x)));
        (frame.x0, frame.x1) = if x1 > x0 {
            (x0, x1)
        } else if x0 < f64::MAX {
            (x0, x0 + 1.0)
        } else {
            (0.0, 1.0)
        };
        let y_max = points.iter().map(|&(_, y)| y).fold(0.0, f64::max);
        (frame.y0, frame.y1) = if plot.log_y {
            let y_min = points.iter().map(|&(_, y)| y).fold(f64::MAX, f64::min);
            let low = if y_min < f64::MAX { y_min.log10().floor() } else { 0.0 };
            let high = if y_max > 0.0 { y_max.log10().ceil() } else { 1.0 };
            (low, if high > low { high } else { low + 1.0 })
        } else {
            (0.0, linear_ticks(y_max).last().copied().unwrap_or(1.0))
        };
        frame
    }

    fn fx(&self, x: f64) -> f64 {
        if self.log_x { x.log2() } else { x }
    }

    fn fy(&self, y: f64) -> f64 {
        if self.log_y { y.max(f64::MIN_POSITIVE).log10() } else { y }
    }

    /// The page's x of the value `x`.
    fn px(&self, x: f64) -> f64 {
        LEFT + (self.fx(x) - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)
    }

    /// The page's y of the value `y`.
    fn py(&self, y: f64) -> f64 {
        self.h - BOTTOM - (self.fy(y) - self.y0) / (self.y1 - self.y0) * (self.h - self.top - BOTTOM)
    }
}

/// The points of `points` a plot can show: all, or the positive ones on a log y axis.
fn shown(plot: &Plot<'_>, points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points.iter().copied().filter(|&(_, y)| !plot.log_y || y > 0.0).collect()
}

/// The document's start: its size, the title, the two axes and their titles.
fn axes(plot: &Plot<'_>, frame: &Frame) -> String {
    let (w, h, top) = (WIDTH, frame.h, frame.top);
    let (x_axis, middle_y) = (h - BOTTOM, (top + h - BOTTOM) / 2.0);
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<line x1="{LEFT}" y1="{x_axis}" x2="{}" y2="{x_axis}" stroke="black"/>
<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{x_axis}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="18" y="{middle_y}" text-anchor="middle" transform="rotate(-90 18 {middle_y})">{}</text>
"#,
        w / 2.0,
        plot.title,
        w - RIGHT,
        (LEFT + w - RIGHT) / 2.0,
        h - 15.0,
        plot.x_label,
        plot.y_label
    )
}

/// The y axis' ticks, each with a grid line and its label (the plot's `y_tick` of the value).
fn y_ticks(out: &mut String, plot: &Plot<'_>, frame: &Frame) {
    let ticks = if plot.log_y { log_ticks(frame.y0, frame.y1) } else { linear_ticks(frame.y1) };
    for y in ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            frame.py(y),
            WIDTH - RIGHT,
            LEFT - 6.0,
            frame.py(y) + 4.0,
            (plot.y_tick)(y)
        );
    }
}

/// One series' line, with a dot at each point when there are few.
fn line(out: &mut String, plot: &Plot<'_>, frame: &Frame, (_, color, points): &Series<'_>) {
    let points = shown(plot, points);
    let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", frame.px(x), frame.py(y))).collect();
    let _ = writeln!(out, r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#, path.join(" "));
    if points.len() <= 16 {
        for &(x, y) in &points {
            let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, frame.px(x), frame.py(y));
        }
    }
}

/// Round ticks from 0 to `max` or just above: the smallest step of 1, 2 or 5 times a power of
/// ten that needs at most six intervals (`[0, 1]` where there is nothing to show).
fn linear_ticks(max: f64) -> Vec<f64> {
    const MOST: f64 = 6.0;
    if max.is_nan() || max <= 0.0 {
        return vec![0.0, 1.0];
    }
    let intervals = |step: f64| (max / step - 1e-9).ceil().max(1.0);
    let power = 10f64.powf((max / MOST).log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&step| intervals(step) <= MOST)
        .unwrap_or(10.0 * power);
    (0..=intervals(step) as u32).map(|i| f64::from(i) * step).collect()
}

/// The ticks of a log axis from decade `low` to decade `high`: each decade, and its 2× and 5×
/// where the axis spans two decades or fewer (two or three ticks would say too little).
fn log_ticks(low: f64, high: f64) -> Vec<f64> {
    let multiples: &[f64] = if high - low <= 2.0 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let decades = (high - low).round() as i32;
    let mut ticks: Vec<f64> =
        (0..decades).flat_map(|i| multiples.iter().map(move |m| m * 10f64.powf(low + f64::from(i)))).collect();
    ticks.push(10f64.powf(high));
    ticks
}

/// The height of a row of the legend.
const LEGEND_ROW: f64 = 18.0;

/// Where each series' legend entry goes: its x and its row, entries placed left to right and
/// wrapped to a new row before one would pass `right_edge` (text widths estimated from the
/// 12-pixel font: about 7 pixels a character).
fn legend_layout(series: &[Series<'_>], left: f64, right_edge: f64) -> Vec<(f64, f64)> {
    let (mut x, mut row) = (left, 0.0);
    series
        .iter()
        .map(|(name, _, _)| {
            let width = 20.0 + 7.0 * name.chars().count() as f64 + 18.0;
            if x > left && x + width > right_edge {
                x = left;
                row += 1.0;
            }
            let at = (x, row);
            x += width;
            at
        })
        .collect()
}

/// `vmm_steps.svg`: time per step against the size after it, a line per mode.
pub(super) fn vmm_svg(modes: &[VmmMode]) -> String {
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    let series = modes
        .iter()
        .zip(colors)
        .map(|(m, color)| (m.name(), color, m.steps.iter().map(|&(s, t)| (s as f64 / MIB as f64, t)).collect()))
        .collect();
    let x_ticks = (0..=4u32).map(|i| (f64::from(i) * 256.0, bytes(i as usize * 256 * MIB))).collect();
    svg(&Plot {
        title: "VMM grow: time per 2 MiB step vs buffer size",
        x_label: "buffer size after the step",
        y_label: "time per step (log scale)",
        log_x: false,
        log_y: true,
        series,
        x_ticks,
        y_tick: ns_tick,
    })
}

/// One kind's median in a row of case (1).
type PoolMedian = fn(&PoolRow) -> f64;

/// `pools.svg`: time per pair against the size, a line per kind and thread count.
pub(super) fn pools_svg(rows: &[PoolRow]) -> String {
    let kinds: [(&str, PoolMedian); 3] =
        [("Buffer", |r| r.safe.median), ("ScopedBuffer", |r| r.scoped.median), ("raw", |r| r.raw.median)];
    let colors = [["#1f77b4", "#2ca02c", "#aec7e8"], ["#d62728", "#ff7f0e", "#ff9896"]];
    let mut lines = Vec::new();
    for (threads, colors) in [1, POOL_THREADS].into_iter().zip(colors) {
        for ((kind, median), color) in kinds.into_iter().zip(colors) {
            let points: Vec<(f64, f64)> =
                rows.iter().filter(|r| r.threads == threads).map(|r| (r.size as f64, median(r))).collect();
            let plural = if threads == 1 { "" } else { "s" };
            lines.push((format!("{kind}, {threads} thread{plural}"), color, points));
        }
    }
    let series = lines.iter().map(|(name, color, points)| (name.as_str(), *color, points.clone())).collect();
    let x_ticks = POOL_SIZES.iter().map(|&s| (s as f64, bytes(s))).collect();
    svg(&Plot {
        title: "Pool allocate+free pair: safe API (Buffer, ScopedBuffer) vs raw calls",
        x_label: "allocation size (log scale)",
        y_label: "time per pair (median)",
        log_x: true,
        log_y: false,
        series,
        x_ticks,
        y_tick: ns_tick,
    })
}

/// `scaling.svg`: time per pair against the threads, a line per kind: all threads together
/// (wall time over pairs, 1 / rate) and on each thread (threads / rate).
pub(super) fn scaling_svg(rows: &[ScalingRow], cpus: usize) -> String {
    let kinds = ["Buffer", "ScopedBuffer", "raw"];
    let colors = [["#1f77b4", "#2ca02c", "#d62728"], ["#aec7e8", "#98df8a", "#ff9896"]];
    let mut lines = Vec::new();
    for (per_thread, colors) in [false, true].into_iter().zip(colors) {
        for (k, (kind, color)) in kinds.into_iter().zip(colors).enumerate() {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .map(|r| {
                    let rate = r.kinds()[k].1;
                    let all = 1e9 / rate.median;
                    (r.threads as f64, if per_thread { all * r.threads as f64 } else { all })
                })
                .collect();
            let whose = if per_thread { "on each thread" } else { "all threads" };
            lines.push((format!("{kind}, {whose}"), color, points));
        }
    }
    let series = lines.iter().map(|(name, color, points)| (name.as_str(), *color, points.clone())).collect();
    let x_ticks = SCALING_THREADS.iter().map(|&t| (t as f64, t.to_string())).collect();
    let title = format!("Pool allocate+free pairs ({}) on 1-8 threads, a stream each", bytes(SCALING_SIZE));
    let x_label = format!("threads (log scale); this host has {cpus} CPUs: beyond {cpus} threads take turns");
    svg(&Plot {
        title: &title,
        x_label: &x_label,
        y_label: "time per pair (median)",
        log_x: true,
        log_y: false,
        series,
        x_ticks,
        y_tick: ns_tick,
    })
}

/// `copies.svg`: time per round trip against the size, safe (both ways of copying out) and raw.
pub(super) fn copies_svg(rows: &[CopyRow]) -> String {
    let line = |median: fn(&CopyRow) -> f64| rows.iter().map(|r| (r.size as f64, median(r))).collect();
    let series = vec![
        ("copy_from_slice + copy_to_slice", "#1f77b4", line(|r| r.safe.median)),
        ("copy_from_slice + to_vec", "#2ca02c", line(|r| r.to_vec.median)),
        ("raw HtoD + DtoH + sync", "#d62728", line(|r| r.raw.median)),
    ];
    let x_ticks = COPY_SIZES.iter().map(|&s| (s as f64, bytes(s))).collect();
    svg(&Plot {
        title: "Slice copy host -> device -> host (pageable): safe API vs raw calls",
        x_label: "bytes each way (log scale)",
        y_label: "time per round trip (log scale)",
        log_x: true,
        log_y: true,
        series,
        x_ticks,
        y_tick: ns_tick,
    })
}

/// A size in MiB as a plot's tick label (`0`, `50 MiB`, `2.5 MiB`).
fn mib_tick(value: f64) -> String {
    let digits = format!("{value:.2}");
    let digits = digits.trim_end_matches('0').trim_end_matches('.');
    if digits == "0" { "0".to_string() } else { format!("{digits} MiB") }
}

/// `trace_<name>.svg`: over the trace, the bytes it has allocated and each resource's reserved
/// bytes, as read by the memory passes (after every allocation and every step's
/// synchronization).
pub(super) fn trace_svg(run: &TraceRun) -> String {
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
    let mib = |b: u64| b as f64 / MIB as f64;
    let names: Vec<String> = run.replays.iter().map(|r| format!("reserved: {}", r.contender)).collect();
    let mut series: Vec<Series<'_>> = run
        .replays
        .iter()
        .zip(&names)
        .zip(colors.into_iter().cycle())
        .map(|((r, name), color)| (name.as_str(), color, r.samples.iter().map(|s| (s.at, mib(s.reserved))).collect()))
        .collect();
    // Last, so that it is drawn over a reserved line that matches it.
    let first = run.replays.first().map_or(&[][..], |r| &r.samples[..]);
    series.push((
        "allocated (the trace's live bytes)",
        "#000000",
        first.iter().map(|s| (s.at, mib(s.allocated))).collect(),
    ));
    let last = run.live.len() as f64;
    let x_ticks =
        linear_ticks(last).into_iter().filter(|&step| step <= last).map(|step| (step, format!("{step:.0}"))).collect();
    let title = format!("Trace replay ({}): reserved vs allocated bytes over the trace", run.trace);
    svg(&Plot {
        title: &title,
        x_label: "step (read after every allocation and every step's synchronization)",
        y_label: "bytes",
        log_x: false,
        log_y: false,
        series,
        x_ticks,
        y_tick: mib_tick,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;
    use crate::vmm::Growth;

    /// A median with a spread of a tenth each way.
    fn stats(median: f64) -> Stats {
        Stats { median, p10: median * 0.9, p90: median * 1.1, n: 100 }
    }

    /// The four plots of a run like the simulator's: pairs of about a microsecond, steps from
    /// tens of microseconds to a tenth of a second, copies from microseconds to milliseconds.
    fn sample_plots() -> [(&'static str, String); 4] {
        let pools: Vec<PoolRow> = [1, POOL_THREADS]
            .into_iter()
            .flat_map(|threads| POOL_SIZES.into_iter().map(move |size| (threads, size)))
            .map(|(threads, size)| {
                let raw = 1150.0 * threads as f64 + (size as f64).log2() * 30.0;
                PoolRow {
                    size,
                    threads,
                    safe: stats(raw + 95.0),
                    raw: stats(raw),
                    raw_checked: stats(raw + 40.0),
                    scoped: stats(raw + 60.0),
                }
            })
            .collect();
        let scaling: Vec<ScalingRow> = SCALING_THREADS
            .iter()
            .map(|&threads| {
                let rate = 800_000.0 * (threads as f64).sqrt();
                ScalingRow { threads, buffer: stats(rate * 0.92), scoped: stats(rate * 0.95), raw: stats(rate) }
            })
            .collect();
        let steps = |start: f64, growth: f64| -> Vec<(usize, f64)> {
            (1..=512).map(|i| ((i + 1) * 2 * MIB, start * growth.powf(i as f64 / 512.0))).collect()
        };
        let vmm = vec![
            VmmMode { growth: Growth::InPlace, steps: steps(20_000.0, 3.0), unexpected: 0, calls: Vec::new() },
            VmmMode { growth: Growth::Moving, steps: steps(40_000.0, 2_500.0), unexpected: 0, calls: Vec::new() },
            VmmMode { growth: Growth::ReserveAhead, steps: steps(15_000.0, 2.0), unexpected: 0, calls: Vec::new() },
        ];
        let copies: Vec<CopyRow> = COPY_SIZES
            .iter()
            .map(|&size| {
                let raw = 4_000.0 + size as f64 / 6.0;
                CopyRow { size, safe: stats(raw * 1.1), to_vec: stats(raw * 1.3), raw: stats(raw) }
            })
            .collect();
        [
            ("pools.svg", pools_svg(&pools)),
            ("scaling.svg", scaling_svg(&scaling, 2)),
            ("vmm_steps.svg", vmm_svg(&vmm)),
            ("copies.svg", copies_svg(&copies)),
        ]
    }

    /// The y axis' labels of a plot, top to bottom as written (the `text-anchor="end"` texts).
    fn y_labels(svg: &str) -> Vec<&str> {
        svg.lines()
            .filter_map(|line| line.split_once(r#"text-anchor="end">"#))
            .filter_map(|(_, rest)| rest.strip_suffix("</text>"))
            .collect()
    }

    /// Every plot's y labels are round (a whole number, or one decimal, in a unit), and the
    /// linear axes' ticks are evenly spaced from 0. With `BENCH_PLOTS_OUT` set, the plots are
    /// written there to be looked at.
    #[test]
    fn the_sample_plots_have_round_tick_labels() {
        for (name, svg) in sample_plots() {
            if let Some(dir) = std::env::var_os("BENCH_PLOTS_OUT") {
                std::fs::write(std::path::Path::new(&dir).join(name), &svg).unwrap();
            }
            let labels = y_labels(&svg);
            assert!(labels.len() >= 3, "{name}: {labels:?}");
            for label in &labels {
                let number = label.split(' ').next().unwrap_or_default();
                let decimals = number.split_once('.').map_or(0, |(_, d)| d.len());
                assert!(number.parse::<f64>().is_ok() && decimals <= 1, "{name}: {label} in {labels:?}");
            }
        }
        let [(_, pools), ..] = sample_plots();
        assert_eq!(y_labels(&pools), ["0", "1 µs", "2 µs", "3 µs", "4 µs", "5 µs", "6 µs"]);
    }

    /// The trace plot: a line per resource and the allocated bytes, named in the legend, the
    /// y axis in round MiB, the x axis in whole steps up to the trace's end.
    #[test]
    fn the_trace_plot_names_every_line_and_labels_sizes_in_mib() {
        use crate::replay::{Replay, Sample};
        let samples = |extra: u64| -> Vec<Sample> {
            (0..=40u64)
                .map(|i| {
                    let allocated = (i % 10) * 12 * MIB as u64;
                    Sample { at: i as f64 / 4.0, allocated, reserved: allocated + extra }
                })
                .collect()
        };
        let replay =
            |contender, extra| Replay { contender, memory: Vec::new(), samples: samples(extra), step_ns: Vec::new() };
        let run = TraceRun {
            trace: "serving",
            live: vec![(0, 0); 10],
            allocations: 30,
            replays: vec![replay("pool A", 0), replay("pool B", 8 * MIB as u64)],
        };
        let plot = trace_svg(&run);
        if let Some(dir) = std::env::var_os("BENCH_PLOTS_OUT") {
            std::fs::write(std::path::Path::new(&dir).join("trace_sample.svg"), &plot).unwrap();
        }
        for name in ["reserved: pool A", "reserved: pool B", "allocated (the trace's live bytes)"] {
            assert!(plot.contains(&format!(">{name}</text>")), "{name}");
        }
        assert_eq!(plot.matches("<polyline").count(), 3);
        assert_eq!(y_labels(&plot), ["0", "20 MiB", "40 MiB", "60 MiB", "80 MiB", "100 MiB", "120 MiB"]);
        assert!(plot.contains(r#"text-anchor="middle">10</text>"#) && !plot.contains(">12</text>"));
        assert_eq!(mib_tick(2.5), "2.5 MiB");
    }

    #[test]
    fn linear_ticks_step_by_one_two_or_five() {
        assert_eq!(linear_ticks(4.6e6), [0.0, 1e6, 2e6, 3e6, 4e6, 5e6]);
        assert_eq!(linear_ticks(1000.0), [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]);
        assert_eq!(linear_ticks(0.0), [0.0, 1.0]);
        assert_eq!(log_ticks(3.0, 4.0), [1e3, 2e3, 5e3, 1e4]);
        assert_eq!(log_ticks(3.0, 8.0), [1e3, 1e4, 1e5, 1e6, 1e7, 1e8]);
    }
}
