//! The SVG plots: a small line-plot writer ([`svg`]), and the four plots made with it (VMM step
//! times against the buffer's size, case (1)'s pairs and case (7)'s copies against the size,
//! case (1b)'s pairs against the threads).

use std::fmt::Write as _;

use crate::adaptors::{COPY_SIZES, CopyRow};
use crate::pools::{POOL_SIZES, POOL_THREADS, PoolRow};
use crate::scaling::{SCALING_SIZE, SCALING_THREADS, ScalingRow};
use crate::units::{MIB, bytes, ns};
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
}

/// The plot as an SVG document.
fn svg(plot: &Plot<'_>) -> String {
    // Room on the left for the tick labels and the axis title, on the right for the last x
    // label, and on top for the legend (outside the plot so no line hides it, in as many rows
    // as its entries need to stay inside the frame).
    let (w, left, right, bottom) = (780.0, 104.0, 48.0, 60.0);
    let legend = legend_layout(&plot.series, left, w - right);
    let legend_rows = legend.last().map_or(0.0, |&(_, row)| row + 1.0);
    let top = 46.0 + LEGEND_ROW * legend_rows;
    let h = 396.0 + top;
    // Non-positive values have no place on a log axis: they are left out of it.
    let points = plot.series.iter().flat_map(|s| s.2.iter().copied()).filter(|&(_, y)| !plot.log_y || y > 0.0);
    let fx = |x: f64| if plot.log_x { x.log2() } else { x };
    let (mut x0, mut x1, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, 0.0f64);
    for (x, y) in points {
        x0 = x0.min(fx(x));
        x1 = x1.max(fx(x));
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // The y axis in its own units: decades (log) or the value, from y0 to y1.
    let (y0, y1) = if plot.log_y {
        let low = if y_min < f64::MAX { y_min.log10().floor() } else { 0.0 };
        let high = if y_max > 0.0 { y_max.log10().ceil() } else { 1.0 };
        (low, if high > low { high } else { low + 1.0 })
    } else {
        (0.0, if y_max > 0.0 { y_max * 1.1 } else { 1.0 })
    };
    let fy = |y: f64| if plot.log_y { y.max(f64::MIN_POSITIVE).log10() } else { y };
    let px = |x: f64| left + (fx(x) - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - (fy(y) - y0) / (y1 - y0) * (h - top - bottom);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>
"#,
        w / 2.0,
        plot.title,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom,
        (left + w - right) / 2.0,
        h - 15.0,
        plot.x_label,
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0,
        plot.y_label
    );
    let y_ticks: Vec<f64> = if plot.log_y {
        // One tick per decade (y0 and y1 are whole decades).
        (0..=(y1 - y0) as i32).map(|i| 10f64.powf(y0 + f64::from(i))).collect()
    } else {
        (0..=5).map(|i| y1 * f64::from(i) / 5.0).collect()
    };
    for y in y_ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            py(y),
            w - right,
            left - 6.0,
            py(y) + 4.0,
            ns(y)
        );
    }
    for (x, label) in &plot.x_ticks {
        let _ =
            writeln!(out, r#"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#, px(*x), h - bottom + 18.0);
    }
    for (i, (name, color, points)) in plot.series.iter().enumerate() {
        let shown = || points.iter().filter(|&&(_, y)| !plot.log_y || y > 0.0);
        let path: Vec<String> = shown().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ =
            writeln!(out, r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#, path.join(" "));
        if points.len() <= 16 {
            for &(x, y) in shown() {
                let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(x), py(y));
            }
        }
        let (lx, row) = legend[i];
        let ly = 46.0 + LEGEND_ROW * row;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{}">{name}</text>"#,
            lx,
            ly - 4.0,
            lx + 20.0,
            ly
        );
    }
    out.push_str("</svg>\n");
    out
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
    let x_ticks = (0..=4).map(|i| (f64::from(i) * 256.0, format!("{} MiB", i * 256))).collect();
    svg(&Plot {
        title: "VMM grow: time per 2 MiB step vs buffer size",
        x_label: "buffer size after the step",
        y_label: "time per step (log scale)",
        log_x: false,
        log_y: true,
        series,
        x_ticks,
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
    })
}
