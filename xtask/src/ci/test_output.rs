//! What `cargo test` prints: passed through as it comes, with the summary lines kept and each
//! binary's tests counted, those that only printed SKIP apart from those that passed.
//!
//! A test that cannot run here says so and returns, which libtest counts as a pass. Such a test
//! prints `SKIP-DECLARED: reason` (`cuda_sim::testing::skip`, into the output libtest captures)
//! or `SKIP <test>: reason` (the Python tests, straight to the standard error). The test steps
//! run the binaries with `--show-output`, so that libtest prints what each passed test captured
//! under `---- <test> stdout ----` in a `successes:` section; those sections are read here, not
//! shown. A test that printed SKIP and passed counts as skipped.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use crate::describe;

/// The argument, after `--`, that makes libtest print what passed tests captured.
pub(crate) const SHOW_OUTPUT: &str = "--show-output";

/// One test binary's counts, or several added up.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Passed, not counting those that only printed SKIP.
    pub(crate) passed: u64,
    /// Passed after printing SKIP: they did not run here.
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Counts { passed, skipped, failed, ignored } = self;
        write!(f, "{passed} passed, {skipped} skipped (printed SKIP), {failed} failed, {ignored} ignored")
    }
}

/// What the test runs printed that the summary keeps.
#[derive(Default)]
pub(crate) struct Summary {
    /// In order: the lines that announce a test binary (`Running …`, `Doc-tests …`), the `test
    /// result:` lines, each followed by the tests that only printed SKIP where there are any,
    /// cargo's `error: test failed, to rerun pass …` lines (a binary that exited non-zero after
    /// its tests passed, as a sanitizer's report makes it) and the sanitizers' `SUMMARY: …` lines.
    pub(crate) lines: Vec<String>,
    /// Each binary's counts, in the order their results came.
    pub(crate) binaries: Vec<Counts>,
}

impl Summary {
    /// The counts of every binary added up.
    pub(crate) fn total(&self) -> Counts {
        self.binaries.iter().fold(Counts::default(), |sum, c| Counts {
            passed: sum.passed + c.passed,
            skipped: sum.skipped + c.skipped,
            failed: sum.failed + c.failed,
            ignored: sum.ignored + c.ignored,
        })
    }

    /// Adds `other`'s lines and binaries after this one's.
    pub(crate) fn extend(&mut self, other: Summary) {
        self.lines.extend(other.lines);
        self.binaries.extend(other.binaries);
    }
}

/// Runs `command`, passing its output through as it comes (both streams into one, in the order
/// they were written, on this process's standard output; the `successes:` sections left out), and
/// returns its result and [`Summary`].
pub(crate) fn run_collecting_summaries(command: &mut Command) -> (Result<(), String>, Summary) {
    let mut reader = Reader::default();
    let result = run_through(command, &mut reader, &mut std::io::stdout());
    (result, reader.summary)
}

/// Runs `command` with its standard output and error into one pipe read by `reader`, what it
/// shows written to `out`.
fn run_through(command: &mut Command, reader: &mut Reader, out: &mut dyn Write) -> Result<(), String> {
    let described = describe(command);
    let cannot_run = |e: std::io::Error| format!("cannot run `{described}`: {e}");
    let (source, sink) = std::io::pipe().map_err(cannot_run)?;
    let sink_too = sink.try_clone().map_err(cannot_run)?;
    let spawned = command.stdout(sink).stderr(sink_too).spawn();
    // The command holds the pipe's write ends: replaced, they are closed here, so that the read
    // ends when the child and its children have closed theirs.
    command.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = spawned.map_err(cannot_run)?;
    relay(source, reader, out);
    match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("`{described}` failed ({status})")),
        Err(e) => Err(format!("waiting for `{described}`: {e}")),
    }
}

/// Copies `source` to `out` as it arrives, each line read by `reader`, which says which to leave
/// out. Partial lines pass at once (libtest prints `test x ... ` before running x), except in a
/// section left out.
fn relay(source: impl Read, reader: &mut Reader, out: &mut dyn Write) {
    let mut source = BufReader::new(source);
    let (mut line, mut shown) = (Vec::new(), 0);
    loop {
        let chunk = match source.fill_buf() {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk.to_vec(),
        };
        source.consume(chunk.len());
        for byte in chunk {
            line.push(byte);
            if byte == b'\n' {
                let show = reader.read(String::from_utf8_lossy(&line).trim_end());
                if show || shown > 0 {
                    let _ = out.write_all(&line[shown..]);
                }
                (line, shown) = (Vec::new(), 0);
            }
        }
        if !reader.hiding() {
            let _ = out.write_all(&line[shown..]);
            shown = line.len();
        }
        let _ = out.flush();
    }
    if !line.is_empty() && (reader.read(String::from_utf8_lossy(&line).trim_end()) || shown > 0) {
        let _ = out.write_all(&line[shown..]);
        let _ = out.flush();
    }
}

/// Where the lines are in a binary's output.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Section {
    /// Running, or between binaries.
    #[default]
    Running,
    /// The captured output of passed tests, after the first `successes:`.
    Captured,
    /// The passed tests' names, after the second `successes:`.
    Passed,
}

/// Reads the output line by line: keeps the summary lines and counts each binary's tests.
#[derive(Default)]
struct Reader {
    summary: Summary,
    section: Section,
    /// The test whose captured output the lines are (`---- <test> stdout ----`).
    test: Option<String>,
    /// The running binary's tests that printed SKIP.
    skipped: BTreeSet<String>,
    /// The running binary's tests listed as passed.
    passed: BTreeSet<String>,
}

impl Reader {
    /// Whether the lines now are left out (a `successes:` section).
    fn hiding(&self) -> bool {
        self.section != Section::Running
    }

    /// Reads one line; returns whether it is shown.
    fn read(&mut self, line: &str) -> bool {
        let trimmed = line.trim();
        if self.hiding() {
            if trimmed == "failures:" || trimmed.starts_with("test result:") {
                self.section = Section::Running;
            } else {
                self.read_success(trimmed);
                return false;
            }
        }
        if trimmed == "successes:" {
            (self.section, self.test) = (Section::Captured, None);
            return false;
        }
        if let Some(test) = uncaptured_skip(trimmed) {
            self.skipped.insert(test.to_string());
        }
        if trimmed.starts_with("Running ") || trimmed.starts_with("Doc-tests ") {
            (self.skipped, self.passed) = (BTreeSet::new(), BTreeSet::new());
            self.summary.lines.push(line.to_string());
        } else if trimmed.starts_with("test result:") {
            self.read_result(line);
        } else if trimmed.starts_with("error: test failed") || trimmed.starts_with("SUMMARY: ") {
            self.summary.lines.push(line.to_string());
        }
        true
    }

    /// A line of a `successes:` section.
    fn read_success(&mut self, trimmed: &str) {
        match self.section {
            Section::Captured if trimmed == "successes:" => self.section = Section::Passed,
            Section::Captured => {
                let header = trimmed.strip_prefix("---- ").and_then(|rest| rest.strip_suffix(" stdout ----"));
                if let Some(test) = header {
                    self.test = Some(test.to_string());
                } else if (trimmed.contains("SKIP-DECLARED:") || uncaptured_skip(trimmed).is_some())
                    && let Some(test) = &self.test
                {
                    self.skipped.insert(test.clone());
                }
            }
            Section::Passed if !trimmed.is_empty() => {
                self.passed.insert(trimmed.to_string());
            }
            Section::Passed | Section::Running => {}
        }
    }

    /// A binary's `test result:` line: its counts, those of its passed tests that printed SKIP
    /// counted apart (and named on a line of their own).
    fn read_result(&mut self, line: &str) {
        let mut counts = result_counts(line);
        let skipped: Vec<&String> = self.skipped.intersection(&self.passed).collect();
        counts.skipped = skipped.len() as u64;
        counts.passed = counts.passed.saturating_sub(counts.skipped);
        self.summary.lines.push(line.to_string());
        if !skipped.is_empty() {
            let names: Vec<&str> = skipped.iter().map(|s| s.as_str()).collect();
            self.summary.lines.push(format!("    {} only printed SKIP: {}", names.len(), names.join(", ")));
        }
        self.summary.binaries.push(counts);
        (self.skipped, self.passed) = (BTreeSet::new(), BTreeSet::new());
    }
}

/// The test named by `SKIP <test>: reason` in `line`, anywhere in it: written from the test's
/// thread, it may land in the middle of the harness's `test x ... ok` line.
fn uncaptured_skip(line: &str) -> Option<&str> {
    line.match_indices("SKIP ").find_map(|(at, marker)| {
        let (test, _) = line[at + marker.len()..].split_once(": ")?;
        (!test.is_empty() && !test.contains(' ')).then_some(test)
    })
}

/// The passed, failed and ignored tests of a `test result:` line.
fn result_counts(line: &str) -> Counts {
    let mut counts = Counts::default();
    let words: Vec<&str> = line.split_whitespace().collect();
    for pair in words.windows(2) {
        let Ok(n) = pair[0].parse::<u64>() else { continue };
        match pair[1].trim_end_matches([';', ',']) {
            "passed" => counts.passed += n,
            "failed" => counts.failed += n,
            "ignored" => counts.ignored += n,
            _ => {}
        }
    }
    counts
}

/// The totals of `summary`, in words.
pub(crate) fn count_tests(summary: &Summary) -> String {
    summary.total().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `reader` keeps of `output`, and which lines it shows.
    fn read(output: &str) -> (Summary, Vec<String>) {
        let mut reader = Reader::default();
        let shown = output.lines().filter(|line| reader.read(line)).map(str::to_string).collect();
        (reader.summary, shown)
    }

    #[test]
    fn totals_the_test_result_lines() {
        let (summary, _) = read(
            "     Running unittests src/lib.rs (target/debug/deps/a-1)\n\
             test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
             test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n",
        );
        assert_eq!(count_tests(&summary), "5 passed, 0 skipped (printed SKIP), 1 failed, 1 ignored");
        assert_eq!(summary.lines.len(), 3);
    }

    /// A binary run with `--show-output`: `b` declared a skip (captured), `c` printed one
    /// straight to the standard error, `a` passed, `d` printed SKIP and failed.
    const WITH_SKIPS: &str = "     Running tests/x.rs (target/debug/deps/x-1)

running 4 tests
test m::a ... ok
test m::c ... SKIP m::c: CUDA_MEM_PYTHON is not set
ok
test m::b ... ok
test m::d ... FAILED

successes:

---- m::a stdout ----
made a pool

---- m::b stdout ----
SKIP-DECLARED: needs two devices


successes:
    m::a
    m::b
    m::c

failures:

---- m::d stdout ----
SKIP-DECLARED: not really

failures:
    m::d

test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s
";

    #[test]
    fn a_passed_test_that_printed_skip_counts_as_skipped() {
        let (summary, shown) = read(WITH_SKIPS);
        assert_eq!(summary.binaries, [Counts { passed: 1, skipped: 2, failed: 1, ignored: 0 }]);
        assert!(summary.lines.iter().any(|l| l == "    2 only printed SKIP: m::b, m::c"), "{:?}", summary.lines);
        // The successes sections are left out; the rest, failures included, shown.
        assert!(!shown.iter().any(|l| l.contains("made a pool") || l == "successes:" || l == "    m::a"));
        assert!(shown.iter().any(|l| l.contains("SKIP m::c")) && shown.iter().any(|l| l == "    m::d"));
        assert!(shown.iter().any(|l| l.starts_with("test result: FAILED")));
    }

    #[test]
    fn counts_restart_with_each_binary() {
        let (summary, _) = read(&format!(
            "{WITH_SKIPS}     Running tests/y.rs (target/debug/deps/y-1)\n\nrunning 1 test\ntest m::b ... ok\n\n\
             successes:\n\nsuccesses:\n    m::b\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured\n"
        ));
        assert_eq!(summary.binaries[1], Counts { passed: 1, skipped: 0, failed: 0, ignored: 0 });
        assert_eq!(summary.total(), Counts { passed: 2, skipped: 2, failed: 1, ignored: 0 });
    }

    #[test]
    fn the_output_passes_through_whole_and_in_order() {
        let script = "printf 'running 1 test\\ntest t ... '; sleep 0.1; echo ok; echo 'SKIP t: why' >&2; \
                      printf '\\nsuccesses:\\n\\nsuccesses:\\n    t\\n\\ntest result: ok. 1 passed; 0 failed;\\n'; \
                      printf 'partial'";
        let mut command = Command::new("bash");
        command.args(["-c", script]);
        let (mut reader, mut out) = (Reader::default(), Vec::new());
        assert!(run_through(&mut command, &mut reader, &mut out).is_ok());
        assert_eq!(
            String::from_utf8_lossy(&out),
            "running 1 test\ntest t ... ok\nSKIP t: why\n\ntest result: ok. 1 passed; 0 failed;\npartial"
        );
        assert_eq!(reader.summary.binaries, [Counts { passed: 0, skipped: 1, failed: 0, ignored: 0 }]);
        let mut failing = Command::new("bash");
        failing.args(["-c", "exit 3"]);
        assert!(run_through(&mut failing, &mut Reader::default(), &mut Vec::new()).is_err());
    }
}
