//! How each step ended, and the summary printed at the end (shared with `sanitize`).

use std::time::Duration;

use super::Summary;

/// How a step ended.
pub(crate) enum Outcome {
    Passed,
    /// Passed, with a note for the summary (the test counts).
    PassedWith(String),
    Skipped(String),
    /// Could not run here (a tool is missing), with why and how to get it.
    Unavailable(String),
    Failed(String),
}

/// One step's line in the summary.
pub(crate) struct Record {
    pub(crate) name: &'static str,
    pub(crate) time: Duration,
    pub(crate) outcome: Outcome,
}

/// Prints, under `==> TITLE summary`, the time each step took and, last, the summaries of
/// `cargo test`.
pub(crate) fn print_summary(title: &str, records: &[Record], summary: &Summary) {
    println!("\n==> {title} summary");
    let width = records.iter().map(|r| r.name.len()).max().unwrap_or(0).max("total".len());
    for record in records {
        let (status, note) = match &record.outcome {
            Outcome::Passed => ("ok", String::new()),
            Outcome::PassedWith(note) => ("ok", format!(" ({note})")),
            Outcome::Skipped(reason) => ("skipped", format!(": {reason}")),
            Outcome::Unavailable(reason) => ("unavailable", format!(": {reason}")),
            Outcome::Failed(message) => ("FAILED", format!(": {message}")),
        };
        println!("  {:<width$} {:>8.1}s  {status}{note}", record.name, record.time.as_secs_f64());
    }
    let total: Duration = records.iter().map(|r| r.time).sum();
    println!("  {:<width$} {:>8.1}s", "total", total.as_secs_f64());
    if !summary.lines.is_empty() {
        println!("\n==> cargo test summaries");
        for line in &summary.lines {
            println!("{line}");
        }
        // The whole run's count, last, in the plain form CI readers look for; a test that only
        // printed SKIP did not run, and is no pass.
        let total = summary.total();
        println!("\ntests: {} passed, {} failed", total.passed, total.failed);
        if total.skipped > 0 {
            println!("       {} more only printed SKIP (named above): not counted as passed", total.skipped);
        }
    }
}
