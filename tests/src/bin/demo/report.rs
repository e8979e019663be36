//! The table of steps: each step's name, time and outcome, printed at the end.

use std::time::{Duration, Instant};

use crate::Error;
use crate::errors::describe;
use crate::narration::format_duration;

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// It succeeded.
    Ok,
    /// It failed (its error was printed).
    Failed,
    /// It could not run here (the reason was printed).
    Skipped,
}

/// One row of the table.
pub(crate) struct Row {
    /// The step.
    pub(crate) name: &'static str,
    /// How long it took (none when skipped).
    time: Option<Duration>,
    /// How it ended.
    pub(crate) status: Status,
}

/// The steps, in the order they ran.
#[derive(Default)]
pub(crate) struct Report {
    /// A row per step.
    pub(crate) rows: Vec<Row>,
}

impl Report {
    /// Runs a step under a heading of its own (see [`Report::timed`]).
    pub(crate) fn step<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T, Error>) -> Option<T> {
        println!("\n== {name} ==");
        self.timed(name, f)
    }

    /// Runs a step, timing it and recording whether it succeeded; a failure is printed at once.
    pub(crate) fn timed<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T, Error>) -> Option<T> {
        let start = Instant::now();
        let result = f();
        let status = if result.is_ok() { Status::Ok } else { Status::Failed };
        self.rows.push(Row { name, time: Some(start.elapsed()), status });
        result.map_err(|e| eprintln!("  error: {}", describe(e.as_ref()))).ok()
    }

    /// Records a step that cannot run here, and why.
    pub(crate) fn skip(&mut self, name: &'static str, why: &str) {
        println!("\n== {name} ==\n  skipped: {why}");
        self.rows.push(Row { name, time: None, status: Status::Skipped });
    }

    /// How many steps ended with `status`.
    pub(crate) fn count(&self, status: Status) -> usize {
        self.rows.iter().filter(|r| r.status == status).count()
    }

    /// Prints the table of steps.
    pub(crate) fn print(&self) {
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(4);
        println!("\n{:<width$}  {:>10}  result", "step", "time");
        for row in &self.rows {
            let time = row.time.map_or_else(|| "-".to_string(), format_duration);
            let status = match row.status {
                Status::Ok => "ok",
                Status::Failed => "FAILED",
                Status::Skipped => "skipped",
            };
            println!("{:<width$}  {time:>10}  {status}", row.name);
        }
    }
}
