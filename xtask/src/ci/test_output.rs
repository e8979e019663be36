//! What `cargo test` prints, passed through as it comes, and the summary lines kept from it.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::describe;

/// Runs `command`, passing its output through as it comes, and returns, with its result, the
/// lines that announce a test binary (`Running …`, `Doc-tests …`), the `test result:` lines,
/// cargo's `error: test failed, to rerun pass …` lines (a binary that exited non-zero after its
/// tests passed, as a sanitizer's report makes it) and the sanitizers' `SUMMARY: …` lines, in
/// order.
pub(crate) fn run_collecting_summaries(command: &mut Command) -> (Result<(), String>, Vec<String>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let spawned = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return (Err(format!("cannot run `{}`: {e}", describe(command))), Vec::new());
        }
    };
    let stdout = child.stdout.take().map(|out| relay(out, false, Arc::clone(&lines)));
    let stderr = child.stderr.take().map(|err| relay(err, true, Arc::clone(&lines)));
    for relay in [stdout, stderr].into_iter().flatten() {
        let _ = relay.join();
    }
    let status = child.wait();
    let lines = std::mem::take(&mut *lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    let result = match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("`{}` failed ({status})", describe(command))),
        Err(e) => Err(format!("waiting for `{}`: {e}", describe(command))),
    };
    (result, lines)
}

/// Copies `source` to this process's stdout (or stderr) as it arrives, and keeps the summary
/// lines among it.
fn relay(
    source: impl Read + Send + 'static,
    is_stderr: bool,
    keep: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            // Pass partial lines through at once (libtest prints `test x ... ` before running x).
            let chunk = match reader.fill_buf() {
                Ok([]) | Err(_) => break,
                Ok(chunk) => chunk.to_vec(),
            };
            reader.consume(chunk.len());
            let _ = if is_stderr {
                let mut err = std::io::stderr().lock();
                err.write_all(&chunk).and_then(|()| err.flush())
            } else {
                let mut out = std::io::stdout().lock();
                out.write_all(&chunk).and_then(|()| out.flush())
            };
            for byte in chunk {
                if byte == b'\n' {
                    keep_if_summary(&line, &keep);
                    line.clear();
                } else {
                    line.push(byte);
                }
            }
        }
        keep_if_summary(&line, &keep);
    })
}

fn keep_if_summary(line: &[u8], keep: &Mutex<Vec<String>>) {
    let line = String::from_utf8_lossy(line);
    let trimmed = line.trim();
    if trimmed.starts_with("test result:")
        || trimmed.starts_with("Running ")
        || trimmed.starts_with("Doc-tests ")
        || trimmed.starts_with("error: test failed")
        || trimmed.starts_with("SUMMARY: ")
    {
        keep.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line.trim_end().to_string());
    }
}

/// Totals of the `test result:` lines, as "N passed, N failed, N ignored".
pub(crate) fn count_tests(summaries: &[String]) -> String {
    let (passed, failed, ignored) = totals(summaries);
    format!("{passed} passed, {failed} failed, {ignored} ignored")
}

/// Passed, failed and ignored tests over every `test result:` line.
pub(crate) fn totals(summaries: &[String]) -> (u64, u64, u64) {
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in summaries.iter().filter(|l| l.trim_start().starts_with("test result:")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            let Ok(n) = pair[0].parse::<u64>() else {
                continue;
            };
            match pair[1].trim_end_matches([';', ',']) {
                "passed" => passed += n,
                "failed" => failed += n,
                "ignored" => ignored += n,
                _ => {}
            }
        }
    }
    (passed, failed, ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_the_test_result_lines() {
        let lines = [
            "     Running unittests src/lib.rs (target/debug/deps/a-1)".to_string(),
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s".to_string(),
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out".to_string(),
        ];
        assert_eq!(count_tests(&lines), "5 passed, 1 failed, 1 ignored");
    }
}
