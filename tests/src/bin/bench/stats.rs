//! The harness's statistics and clock: a sample's median and spread (p10/p90), and elapsed
//! nanoseconds.

use std::time::Instant;

use serde_json::{Value, json};

use crate::units::ns;

/// Median and spread of a sample, in nanoseconds (or whatever unit the sample has).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stats {
    pub(crate) median: f64,
    pub(crate) p10: f64,
    pub(crate) p90: f64,
    pub(crate) n: usize,
}

impl Stats {
    /// The statistics of `sample` (all zero when it is empty).
    pub(crate) fn of(mut sample: Vec<f64>) -> Stats {
        if sample.is_empty() {
            return Stats::default();
        }
        sample.sort_by(f64::total_cmp);
        let at = |q: f64| sample[((sample.len() - 1) as f64 * q).round() as usize];
        Stats { median: at(0.5), p10: at(0.1), p90: at(0.9), n: sample.len() }
    }

    /// As a JSON object: `{"median":…,"p10":…,"p90":…,"n":…}`, to a tenth.
    pub(crate) fn json(&self) -> Value {
        json!({
            "median": rounded(self.median, 1),
            "p10": rounded(self.p10, 1),
            "p90": rounded(self.p90, 1),
            "n": self.n,
        })
    }

    /// `median (p10–p90)` in a readable unit.
    pub(crate) fn show(&self) -> String {
        format!("{} ({}–{})", ns(self.median), ns(self.p10), ns(self.p90))
    }
}

/// `value` rounded to `decimals` places, for the JSON (the digits beyond are noise); NaN stays
/// NaN, which `serde_json` writes as `null`.
pub(crate) fn rounded(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// Nanoseconds since `since`.
pub(crate) fn elapsed_ns(since: Instant) -> f64 {
    since.elapsed().as_nanos() as f64
}
