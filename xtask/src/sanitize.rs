//! `cargo xtask sanitize [--miri] [--asan] [--tsan] [--valgrind] [--install]`: the tests under
//! Miri, AddressSanitizer, ThreadSanitizer and valgrind. Without a tool named it runs every one
//! this machine can run and lists the others as unavailable, with why and how to get them.
//!
//! - **Miri** (nightly, components `miri` and `rust-src`): the unit tests of the modules that need
//!   no driver (Miri cannot `dlopen` one) and no system call Miri lacks: [`MIRI_SUITES`].
//! - **ASan** (nightly; LeakSanitizer included) and **TSan** (nightly and `rust-src`: std is
//!   rebuilt instrumented with `-Zbuild-std`, and rustix uses its libc backend so that TSan sees
//!   `mmap`): the unit and integration tests of [`SUITES`], against the simulator.
//! - **valgrind** (memcheck, no leak check: LeakSanitizer does that): the same tests, built as
//!   usual by the toolchain that runs xtask, less [`VALGRIND_SKIPS`].
//!
//! The simulator is built with the same sanitizer as the tests. It is opened by `dlopen` into the
//! test process, and its stream threads do the device side of every copy and fill, ordered
//! against the host by its own locks: uninstrumented, it would hide from TSan the races between
//! stream work and host access that TSan is run to find, and report false ones where only its
//! locks order two accesses; under ASan its own unsafe bookkeeping is checked too. The sanitizer
//! runtime is linked statically into each test executable, so the executables export its symbols
//! (`--export-dynamic-symbol=__asan_*`, `__tsan_*`) for the simulator to bind to. Exporting every
//! symbol (`-rdynamic`) does not do: the simulator would then bind to the copy of `cuda-sim`
//! linked into the test executable for its test helpers, and two simulators' state would mix.
//!
//! Each sanitizer builds into a target folder of its own (`target/sanitize-miri`, `-asan`,
//! `-tsan`), so that the ordinary build is not invalidated; valgrind needs no other flags and
//! uses the ordinary `target/`. The nightly toolchain is checked first: what is missing is named
//! with the command that gets it, `--install` runs that command, and a tool named on the command
//! line that cannot run stops the run, before anything is built, with a non-zero status.
//! `cargo xtask ci` does not run this command.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ci::{Outcome, Record, Summary, count_tests, cuda_mem_sys_env, print_summary, run_collecting_summaries};
use crate::{cargo, create_dir, run_command};

/// The rustup toolchain the sanitizers and Miri need.
const NIGHTLY: &str = "nightly";

/// The packages whose unit and integration tests run under ASan, TSan and valgrind.
const SUITES: [&str; 3] = ["cuda-mem-core", "cuda-mem-ipc", "cuda-mem-vmm"];

/// The unit tests Miri runs: per package, libtest filters naming the modules whose tests need no
/// driver and no system call Miri lacks (sockets, `memfd_create`, shared or `MAP_NORESERVE`
/// mappings). Tests in these modules that Miri cannot run in reasonable time carry
/// `#[cfg_attr(miri, ignore)]`.
const MIRI_SUITES: &[(&str, &[&str])] = &[
    ("cuda-mem-sys", &["error::"]),
    ("cuda-mem-core", &["access::", "handle_types::"]),
    (
        "cuda-mem-ipc",
        &[
            "descriptor::",
            "registry::",
            "error::",
            "wire::buffers::",
            "wire::envelope::",
            "wire::frame::",
            "wire::message::",
            "wire::resource::",
            "wire::snapshot_request::",
            "peer::tests::the_start_time_is_counted_from_the_last_parenthesis",
        ],
    ),
    ("cuda-sim", &["config::", "device::", "pool::", "stream::"]),
];

/// Leaks LeakSanitizer is not to report: allocations a test leaks on purpose.
const LSAN_SUPPRESSIONS: &str = "\
# The test forgets a resource whose pool it destroyed behind the wrapper's back.
leak:the_simulator_models_inherited_access_when_a_pool_is_destroyed_without_revoking
";

/// Races ThreadSanitizer is not to report: ones it cannot see the ordering of.
///
/// Tokio's I/O driver: a task registers a socket (`AsyncFd::new`), which allocates the socket's
/// readiness state and hands the kernel its address as the epoll token; a worker thread gets the
/// address back from `epoll_wait` and sets the readiness. The kernel orders the two, but the
/// runtime's `epoll_ctl`/`epoll_wait` interceptors do not make that an edge TSan sees, so on a
/// multi-thread runtime every first wake of a new socket reads as a race with its allocation.
/// Tokio does not run TSan for such reasons (tokio-rs/tokio#7299). Only frames of that state's
/// own code match: our code, run by the same workers, is still checked.
const TSAN_SUPPRESSIONS: &str = "\
race:tokio::runtime::io::scheduled_io::ScheduledIo
";

/// Tests that cannot run under valgrind. It keeps descriptors of its own at the top of the
/// open-file limit and fakes `RLIMIT_NOFILE` for the program, so a child that lowers the limit to
/// run out of descriptors has the ones it receives closed by valgrind behind its back (std then
/// aborts on the second close). The test runs natively, under ASan and under TSan.
const VALGRIND_SKIPS: [&str; 1] = ["running_out_of_descriptors_skips_the_message_and_keeps_the_channel"];

/// The exit status valgrind gives a test binary in which it found an error.
const VALGRIND_ERROR_STATUS: u8 = 97;

/// The hosts the sanitizers are set up for (their runtimes ship with these targets' `rust-std`).
const SANITIZER_HOSTS: [&str; 2] = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"];

/// One of the tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Miri,
    Asan,
    Tsan,
    Valgrind,
}

impl Tool {
    const ALL: [Tool; 4] = [Tool::Miri, Tool::Asan, Tool::Tsan, Tool::Valgrind];

    /// Its name in the summary and its option without the dashes.
    fn name(self) -> &'static str {
        match self {
            Tool::Miri => "miri",
            Tool::Asan => "asan",
            Tool::Tsan => "tsan",
            Tool::Valgrind => "valgrind",
        }
    }

    /// The nightly toolchain's components it needs, or `None` when it needs no nightly.
    fn nightly_components(self) -> Option<&'static [&'static str]> {
        match self {
            Tool::Miri => Some(&["miri", "rust-src"]),
            Tool::Asan => Some(&[]),
            Tool::Tsan => Some(&["rust-src"]),
            Tool::Valgrind => None,
        }
    }
}

/// The command line.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    tools: Vec<Tool>,
    /// Whether the tools were named (each must run) rather than taken by default.
    named: bool,
    install: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut tools = Vec::new();
    let mut install = false;
    for arg in args {
        if arg == "--install" {
            install = true;
            continue;
        }
        let tool = Tool::ALL
            .into_iter()
            .find(|t| arg.strip_prefix("--") == Some(t.name()))
            .ok_or_else(|| format!("sanitize: unknown option `{arg}`\n{}", crate::usage()))?;
        if !tools.contains(&tool) {
            tools.push(tool);
        }
    }
    let named = !tools.is_empty();
    if !named {
        tools = Tool::ALL.to_vec();
    }
    // Always in the same order, cheapest first.
    tools.sort_by_key(|t| Tool::ALL.iter().position(|a| a == t));
    Ok(Options { tools, named, install })
}

/// What this machine has of what the tools need.
struct Machine {
    rustup: bool,
    /// The nightly toolchain's host triple and installed components, when it is installed.
    nightly: Option<Nightly>,
    valgrind: bool,
}

struct Nightly {
    host: String,
    /// `rustup component list --installed` lines (`miri-x86_64-unknown-linux-gnu`, `rust-src`).
    components: Vec<String>,
}

impl Machine {
    fn probe() -> Machine {
        let rustup = output(Command::new("rustup").arg("--version")).is_some();
        let nightly = rustup.then(probe_nightly).flatten();
        let valgrind = output(Command::new("valgrind").arg("--version")).is_some();
        Machine { rustup, nightly, valgrind }
    }

    /// The components of `wanted` the nightly toolchain lacks (all of them without one).
    fn missing_components<'a>(&self, wanted: &[&'a str]) -> Vec<&'a str> {
        wanted.iter().copied().filter(|c| self.nightly.as_ref().is_none_or(|n| !n.has(c))).collect()
    }

    /// Why `tool` cannot run here and how to get it, or `None` when it can.
    fn missing(&self, tool: Tool) -> Option<String> {
        let Some(components) = tool.nightly_components() else {
            return (!self.valgrind)
                .then(|| "valgrind is not installed (Debian, Ubuntu: `sudo apt-get install valgrind`)".to_string());
        };
        if !self.rustup {
            return Some(format!(
                "it needs rustup's {NIGHTLY} toolchain and rustup is not installed (https://rustup.rs)"
            ));
        }
        let why_src = if tool == Tool::Tsan {
            " (std must be rebuilt instrumented: without that, TSan reports races inside std's own \
             synchronization, which it cannot see, so its reports could not be trusted)"
        } else {
            ""
        };
        let Some(nightly) = &self.nightly else {
            return Some(format!(
                "the {NIGHTLY} toolchain is not installed: `{}`{why_src}, or run with --install",
                install_command(None, &["miri", "rust-src"])
            ));
        };
        let lacking = self.missing_components(components);
        if !lacking.is_empty() {
            return Some(format!(
                "the {NIGHTLY} toolchain lacks {}: `{}`{why_src}, or run with --install",
                lacking.join(" and "),
                install_command(Some(nightly), &lacking)
            ));
        }
        if matches!(tool, Tool::Asan | Tool::Tsan) && !SANITIZER_HOSTS.contains(&nightly.host.as_str()) {
            return Some(format!(
                "the sanitizers are set up here for {} only; this host is {}",
                SANITIZER_HOSTS.join(" and "),
                nightly.host
            ));
        }
        None
    }
}

fn probe_nightly() -> Option<Nightly> {
    let installed = output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !has_toolchain(&installed, NIGHTLY) {
        return None;
    }
    let version = output(Command::new("rustup").args(["run", NIGHTLY, "rustc", "-vV"]))?;
    let host = host_triple(&version)?;
    let components = output(Command::new("rustup").args(["component", "list", "--installed", "--toolchain", NIGHTLY]))?;
    Some(Nightly { host, components: components.lines().map(|l| l.trim().to_string()).collect() })
}

/// Whether `rustup toolchain list` output names `toolchain` (`nightly-x86_64-… (default)`).
fn has_toolchain(list: &str, toolchain: &str) -> bool {
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|name| name == toolchain || name.strip_prefix(toolchain).is_some_and(|rest| rest.starts_with('-')))
}

impl Nightly {
    /// Whether it has `component`, which rustup lists as `miri-<host>` or, for
    /// target-independent ones, `rust-src`.
    fn has(&self, component: &str) -> bool {
        let for_host = format!("{component}-{}", self.host);
        self.components.iter().any(|line| *line == component || *line == for_host)
    }
}

/// The `host:` line of `rustc -vV`.
fn host_triple(version: &str) -> Option<String> {
    version.lines().find_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string())
}

/// The arguments of the rustup command that installs `components` (and the toolchain, when
/// there is none yet).
fn install_args(nightly: Option<&Nightly>, components: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = match nightly {
        None => ["toolchain", "install", NIGHTLY, "--profile", "minimal"].map(String::from).to_vec(),
        Some(_) => vec!["component".to_string(), "add".to_string()],
    };
    for component in components {
        if nightly.is_none() {
            args.push("--component".to_string());
        }
        args.push(component.to_string());
    }
    if nightly.is_some() {
        args.extend(["--toolchain".to_string(), NIGHTLY.to_string()]);
    }
    args
}

/// That rustup command, for messages.
fn install_command(nightly: Option<&Nightly>, components: &[&str]) -> String {
    std::iter::once("rustup".to_string()).chain(install_args(nightly, components)).collect::<Vec<_>>().join(" ")
}

/// Stdout of `command` when it runs and exits with 0.
fn output(command: &mut Command) -> Option<String> {
    let out = command.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs with rustup what the nightly `tools` lack; says so when it cannot.
fn install(machine: &Machine, tools: &[Tool]) {
    if !machine.rustup {
        return;
    }
    let needs_nightly = tools.iter().any(|t| t.nightly_components().is_some());
    let mut wanted: Vec<&str> = tools.iter().filter_map(|t| t.nightly_components()).flatten().copied().collect();
    wanted.sort_unstable();
    wanted.dedup();
    let lacking = machine.missing_components(&wanted);
    if !needs_nightly || (machine.nightly.is_some() && lacking.is_empty()) {
        return;
    }
    println!("==> sanitize: installing: {}", install_command(machine.nightly.as_ref(), &lacking));
    if let Err(e) = run_command(Command::new("rustup").args(install_args(machine.nightly.as_ref(), &lacking))) {
        println!("could not install ({e}); the tools that need it are unavailable");
    }
}

/// Runs the subcommand.
pub fn run(workspace: &Path, args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    let mut machine = Machine::probe();
    if options.install {
        install(&machine, &options.tools);
        machine = Machine::probe();
    }
    let plan: Vec<(Tool, Option<String>)> = options.tools.iter().map(|&t| (t, machine.missing(t))).collect();
    let unavailable: Vec<&(Tool, Option<String>)> = plan.iter().filter(|(_, why)| why.is_some()).collect();
    for (tool, why) in &unavailable {
        println!("sanitize: {} cannot run: {}", tool.name(), why.as_deref().unwrap_or_default());
    }
    let unavailable_record = |tool: Tool, why: &str| Record {
        name: tool.name(),
        time: Duration::ZERO,
        outcome: Outcome::Unavailable(why.to_string()),
    };
    if (options.named && !unavailable.is_empty()) || unavailable.len() == plan.len() {
        let records: Vec<Record> =
            unavailable.iter().map(|(t, why)| unavailable_record(*t, why.as_deref().unwrap_or_default())).collect();
        print_summary("sanitize", &records, &Summary::default());
        let names: Vec<&str> = unavailable.iter().map(|(t, _)| t.name()).collect();
        return Err(format!("sanitize: nothing was run: {} cannot run here (see above)", names.join(", ")));
    }

    let host = machine.nightly.as_ref().map(|n| n.host.clone());
    let mut records = Vec::new();
    let mut failures = Vec::new();
    let runnable = plan.len() - unavailable.len();
    let mut ran = 0;
    for (tool, why) in &plan {
        if let Some(why) = why {
            records.push(unavailable_record(*tool, why));
            continue;
        }
        ran += 1;
        println!("\n==> sanitize [{ran}/{runnable}] {}", tool.name());
        let start = Instant::now();
        let (outcome, lines) = match tool {
            Tool::Miri => miri(workspace),
            Tool::Asan | Tool::Tsan => sanitizer(workspace, *tool, host.as_deref().unwrap_or_default()),
            Tool::Valgrind => valgrind(workspace),
        };
        failures.extend(failure_lines(&lines.lines).into_iter().map(|l| format!("[{}] {l}", tool.name())));
        records.push(Record { name: tool.name(), time: start.elapsed(), outcome });
    }
    print_summary("sanitize", &records, &Summary::default());
    if !failures.is_empty() {
        println!("\n==> failed test binaries");
        for line in &failures {
            println!("{line}");
        }
    }
    // A named tool that turned out unable to run (Miri's standard library would not build) fails
    // the run too.
    let failed: Vec<&str> = records
        .iter()
        .filter(|r| match r.outcome {
            Outcome::Failed(_) => true,
            Outcome::Unavailable(_) => options.named,
            _ => false,
        })
        .map(|r| r.name)
        .collect();
    if failed.is_empty() { Ok(()) } else { Err(format!("sanitize: {} failed", failed.join(", "))) }
}

/// A cargo command of the nightly toolchain, run from the workspace root.
fn nightly_cargo(workspace: &Path) -> Command {
    let mut command = Command::new("rustup");
    command.args(["run", NIGHTLY, "cargo"]).current_dir(workspace);
    // Settings that would give this cargo another compiler or other flags than the ones chosen
    // here.
    for name in ["RUSTC", "RUSTDOC", "CARGO_ENCODED_RUSTFLAGS"] {
        command.env_remove(name);
    }
    command
}

/// Miri on [`MIRI_SUITES`], one package at a time.
fn miri(workspace: &Path) -> (Outcome, Summary) {
    let target_dir = workspace.join("target/sanitize-miri");
    // Miri's standard library is built once per toolchain (its dependencies come from crates.io).
    if let Err(e) = run_command(nightly_cargo(workspace).args(["miri", "setup"])) {
        return (Outcome::Unavailable(format!("Miri could not build its standard library: {e}")), Summary::default());
    }
    let mut all = Summary::default();
    let mut problems = Vec::new();
    for (package, filters) in MIRI_SUITES {
        let mut command = nightly_cargo(workspace);
        command
            .args(["miri", "test", "-p", package, "--lib", "--target-dir"])
            .arg(&target_dir)
            .arg("--")
            .args(*filters);
        let (result, summary) = run_collecting_summaries(&mut command);
        if let Err(e) = result {
            problems.push(e);
        } else if summary.total().passed == 0 {
            problems.push(format!(
                "no test of {package} matched {}: update MIRI_SUITES in xtask/src/sanitize.rs",
                filters.join(" ")
            ));
        }
        all.extend(summary);
    }
    (tests_outcome(&all, problems), all)
}

/// The unit and integration tests of [`SUITES`] built with `tool`'s sanitizer.
fn sanitizer(workspace: &Path, tool: Tool, host: &str) -> (Outcome, Summary) {
    let target_dir = workspace.join("target").join(format!("sanitize-{}", tool.name()));
    if let Err(e) = create_dir(&target_dir) {
        return (Outcome::Failed(e), Summary::default());
    }
    let mut command = nightly_cargo(workspace);
    // `--target` keeps the flags off build scripts and proc macros.
    suite_tests(&mut command).args(["--target", host, "--target-dir"]).arg(&target_dir);
    let (runtime, rustflags) = match tool {
        Tool::Asan => ("__asan_*", "-Zsanitizer=address".to_string()),
        _ => {
            command.arg("-Zbuild-std");
            ("__tsan_*", "-Zsanitizer=thread --cfg=rustix_use_libc".to_string())
        }
    };
    command.env("RUSTFLAGS", format!("{rustflags} -Clink-arg=-Wl,--export-dynamic-symbol={runtime}"));
    if tool == Tool::Asan {
        let suppressions = target_dir.join("lsan-suppressions.txt");
        if let Err(e) = std::fs::write(&suppressions, LSAN_SUPPRESSIONS) {
            return (Outcome::Failed(format!("writing {}: {e}", suppressions.display())), Summary::default());
        }
        // The caller's own options come last, so that they win.
        command.env("ASAN_OPTIONS", with_callers("ASAN_OPTIONS", "detect_leaks=1"));
        command.env("LSAN_OPTIONS", with_callers("LSAN_OPTIONS", &format!("suppressions={}", suppressions.display())));
    } else {
        let suppressions = target_dir.join("tsan-suppressions.txt");
        if let Err(e) = std::fs::write(&suppressions, TSAN_SUPPRESSIONS) {
            return (Outcome::Failed(format!("writing {}: {e}", suppressions.display())), Summary::default());
        }
        command.env("TSAN_OPTIONS", with_callers("TSAN_OPTIONS", &format!("suppressions={}", suppressions.display())));
    }
    run_on_the_simulator(&mut command)
}

/// The unit and integration tests of [`SUITES`] under valgrind's memcheck.
fn valgrind(workspace: &Path) -> (Outcome, Summary) {
    let Some(host) = output(Command::new("rustc").arg("-vV")).as_deref().and_then(host_triple) else {
        return (Outcome::Failed("`rustc -vV` names no host".to_string()), Summary::default());
    };
    let mut command = cargo(workspace);
    suite_tests(&mut command).env(
        runner_variable(&host),
        // Children too (the tests re-run themselves for simulated machines), but not the shell
        // and system tools some tests start.
        format!(
            "valgrind --quiet --error-exitcode={VALGRIND_ERROR_STATUS} --leak-check=no --trace-children=yes \
             --trace-children-skip=/bin/*,/usr/bin/*"
        ),
    );
    command.arg("--");
    for test in VALGRIND_SKIPS {
        command.args(["--skip", test]);
    }
    run_on_the_simulator(&mut command)
}

/// `command` (a cargo) made to test the unit and integration tests of [`SUITES`], every one
/// even after a failure.
fn suite_tests(command: &mut Command) -> &mut Command {
    command.arg("test");
    for package in SUITES {
        command.args(["-p", package]);
    }
    command.args(["--all-features", "--lib", "--tests", "--no-fail-fast"])
}

/// Runs the tests of `command` against the simulator (removing what would send them to another
/// driver, as `ci` does) and returns how they ended with the summary lines.
fn run_on_the_simulator(command: &mut Command) -> (Outcome, Summary) {
    command
        .env_remove(cuda_mem_sys_env::DRIVER)
        .env_remove(cuda_mem_sys_env::REQUIRE_GPU)
        .env_remove(cuda_mem_sys_env::SIM_LIB);
    let (result, summary) = run_collecting_summaries(command);
    (tests_outcome(&summary, result.err().into_iter().collect()), summary)
}

/// `CARGO_TARGET_<TRIPLE>_RUNNER` for `host`.
fn runner_variable(host: &str) -> String {
    format!("CARGO_TARGET_{}_RUNNER", host.to_uppercase().replace(['-', '.'], "_"))
}

/// `ours`, then the caller's own value of `variable` (sanitizer options: the last one wins).
fn with_callers(variable: &str, ours: &str) -> String {
    match std::env::var(variable) {
        Ok(theirs) if !theirs.is_empty() => format!("{ours}:{theirs}"),
        _ => ours.to_string(),
    }
}

/// Passed with the test counts, or failed with them and the problems.
fn tests_outcome(summary: &Summary, problems: Vec<String>) -> Outcome {
    let counts = count_tests(summary);
    if problems.is_empty() {
        Outcome::PassedWith(counts)
    } else {
        Outcome::Failed(format!("{counts}; {}", problems.join("; ")))
    }
}

/// The lines that say which test binary failed and why: a `Running …` line followed by a failed
/// result, a sanitizer's `SUMMARY: …` lines and cargo's `error: test failed, to rerun pass …`
/// lines.
fn failure_lines(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut running: Option<&str> = None;
    for line in lines {
        let trimmed = line.trim();
        if trimmed.starts_with("Running ") || trimmed.starts_with("Doc-tests ") {
            running = Some(trimmed);
        } else if trimmed.starts_with("test result: FAILED") {
            out.extend(running.take().map(str::to_string));
            out.push(trimmed.to_string());
        } else if trimmed.starts_with("error: test failed") || trimmed.starts_with("SUMMARY: ") {
            out.push(trimmed.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_tool_named_means_all_of_them_and_names_keep_one_order() {
        let all = parse(&[]).unwrap();
        assert_eq!((all.tools, all.named, all.install), (Tool::ALL.to_vec(), false, false));
        let some = parse(&args(&["--valgrind", "--install", "--asan", "--asan"])).unwrap();
        assert_eq!((some.tools, some.named, some.install), (vec![Tool::Asan, Tool::Valgrind], true, true));
        let install_only = parse(&args(&["--install"])).unwrap();
        assert_eq!((install_only.tools.len(), install_only.named), (4, false));
        let error = parse(&args(&["--msan"])).unwrap_err();
        assert!(error.contains("unknown option `--msan`"), "{error}");
    }

    #[test]
    fn reads_rustup_and_rustc_listings() {
        let toolchains = "stable-x86_64-unknown-linux-gnu (active, default)\nnightly-x86_64-unknown-linux-gnu\n";
        assert!(has_toolchain(toolchains, "nightly"));
        assert!(!has_toolchain("stable-x86_64-unknown-linux-gnu\nnightlyish\n", "nightly"));
        let nightly = Nightly {
            host: "x86_64-unknown-linux-gnu".to_string(),
            components: [
                "cargo-x86_64-unknown-linux-gnu",
                "rust-std-x86_64-unknown-linux-gnu",
                "miri-x86_64-unknown-linux-gnu",
            ]
            .map(String::from)
            .to_vec(),
        };
        assert!(nightly.has("miri"));
        assert!(!nightly.has("rust-src"), "rust-std is not rust-src");
        assert!(!nightly.has("rust"), "nor is it rust");
        assert!(Nightly { components: vec!["rust-src".to_string()], ..nightly }.has("rust-src"));
        assert_eq!(
            host_triple("rustc 1.97.0-nightly\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\n").as_deref(),
            Some("x86_64-unknown-linux-gnu")
        );
        assert_eq!(runner_variable("x86_64-unknown-linux-gnu"), "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER");
    }

    #[test]
    fn says_what_is_missing_and_how_to_get_it() {
        let nightly = |components: &[&str]| Nightly {
            host: "x86_64-unknown-linux-gnu".to_string(),
            components: components.iter().map(|c| c.to_string()).collect(),
        };
        let bare = Machine { rustup: true, nightly: None, valgrind: false };
        let why = bare.missing(Tool::Miri).unwrap();
        assert!(
            why.contains("rustup toolchain install nightly --profile minimal --component miri --component rust-src"),
            "{why}"
        );
        assert!(bare.missing(Tool::Valgrind).unwrap().contains("valgrind is not installed"));

        let no_src =
            Machine { rustup: true, nightly: Some(nightly(&["miri-x86_64-unknown-linux-gnu"])), valgrind: true };
        assert_eq!(no_src.missing(Tool::Asan), None, "ASan needs no rust-src");
        assert_eq!(no_src.missing(Tool::Valgrind), None);
        let why = no_src.missing(Tool::Tsan).unwrap();
        assert!(why.contains("`rustup component add rust-src --toolchain nightly`"), "{why}");
        assert!(why.contains("races inside std"), "{why}");
        let why = no_src.missing(Tool::Miri).unwrap();
        assert!(why.contains("lacks rust-src"), "{why}");

        let complete = Machine {
            rustup: true,
            nightly: Some(nightly(&["miri-x86_64-unknown-linux-gnu", "rust-src"])),
            valgrind: true,
        };
        assert!(Tool::ALL.iter().all(|&t| complete.missing(t).is_none()));
        let elsewhere = Machine {
            nightly: Some(Nightly { host: "riscv64gc-unknown-linux-gnu".to_string(), ..nightly(&["rust-src"]) }),
            ..complete
        };
        assert!(elsewhere.missing(Tool::Asan).unwrap().contains("this host is riscv64gc-unknown-linux-gnu"));

        let no_rustup = Machine { rustup: false, nightly: None, valgrind: true };
        assert!(no_rustup.missing(Tool::Asan).unwrap().contains("rustup is not installed"));
    }

    #[test]
    fn failure_lines_name_the_binaries_that_failed() {
        let lines = args(&[
            "     Running tests/a.rs (target/debug/deps/a-1)",
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
            "     Running tests/b.rs (target/debug/deps/b-1)",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "     Running tests/c.rs (target/debug/deps/c-1)",
            "SUMMARY: ThreadSanitizer: data race src/c.rs:1:1 in c::f",
            "test result: ok. 7 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
            "error: test failed, to rerun pass `-p x --test c`",
        ]);
        assert_eq!(
            failure_lines(&lines),
            [
                "Running tests/b.rs (target/debug/deps/b-1)",
                "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
                "SUMMARY: ThreadSanitizer: data race src/c.rs:1:1 in c::f",
                "error: test failed, to rerun pass `-p x --test c`",
            ]
        );
    }
}
