//! The questions asked from another process (importing what this process exported): this
//! program again, with `--child NAME`, started with `spawn_with_channel` on the same driver.
//!
//! The parent sends one message (bytes and file descriptors); the child opens device 0's
//! primary context, runs the question's child side and sends each observation as it makes it,
//! then `done` or its error. A child that crashes (a driver call that faults) leaves what it
//! sent before, and its exit status says how it ended: an answer too.
//!
//! A question whose parent must act part way through the child's work (free what the child
//! holds, say) asks with [`ask_and_answer`]: the parent sees each observation as it arrives and
//! may answer one with a message of its own, which the child side waits for with
//! [`Input::wait_for_parent`].

use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode, Stdio};
use std::rc::Rc;
use std::time::Duration;

use cuda_mem_integration::child_process::{KillOnDrop, read_in_background};
use cuda_mem_ipc::{Channel, spawn_with_channel};
use cuda_mem_sys::DRIVER_ENV;

use crate::Error;
use crate::owned::{OwnedPool, PrimaryContext};
use crate::raw::{code, device_location, pool_props};
use crate::report::Details;

/// The argument that makes this program a probe's child side: `--child NAME`.
pub(crate) const CHILD_ARG: &str = "--child";

/// How long the parent waits for each message of the child, and for its exit.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// The child sides that initialize the driver themselves, with no context opened for them
/// (they ask what a process sees, devices hidden included).
const OPENS_ITS_OWN_CONTEXT: [&str; 1] = [crate::visible_devices::QUESTION.name];

/// Message kinds: the parent's input, an observation, the end, the child's error, and the
/// parent's answer to an observation (its word to go on).
const KIND_INPUT: u16 = 1;
const KIND_DETAIL: u16 = 2;
const KIND_DONE: u16 = 3;
const KIND_ERROR: u16 = 4;
const KIND_ANSWER: u16 = 5;

/// What the parent hands the child side.
pub(crate) struct Input {
    /// The bytes (export data, a tag).
    pub(crate) payload: Vec<u8>,
    /// The file descriptors (exported pools), in the order sent.
    pub(crate) fds: Vec<OwnedFd>,
    /// The channel to the parent, for a side that waits for the parent's answer.
    channel: Rc<Channel>,
}

impl Input {
    /// The descriptor at `index`, as the driver takes it.
    pub(crate) fn fd(&self, index: usize) -> Result<c_int, Error> {
        self.fds.get(index).map(AsRawFd::as_raw_fd).ok_or_else(|| format!("no file descriptor #{index}").into())
    }

    /// Waits for the parent's answer to an observation already sent (see [`ask_and_answer`]),
    /// at most [`CHILD_TIMEOUT`]: its bytes.
    pub(crate) fn wait_for_parent(&self) -> Result<Vec<u8>, Error> {
        let message = self.channel.recv()?;
        if message.kind != KIND_ANSWER {
            return Err(format!("expected the parent's answer, got a message of kind {}", message.kind).into());
        }
        Ok(message.payload)
    }
}

/// A child side: what the child does with the input, recording what it observes.
pub(crate) type ChildSide = fn(&Input, &mut Details) -> Result<(), Error>;

/// The detail naming the signal that ended a child, where one did (a crash: 11 is `SIGSEGV`).
pub(crate) const SIGNAL_KEY: &str = "child_signal";

/// Runs the child side `name` in a new process, hands it `payload` and `fds`, and returns what
/// it observed; the detail `child` says how it ended, and [`SIGNAL_KEY`] the signal that ended
/// it, if one did.
pub(crate) fn ask(name: &str, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<Details, Error> {
    ask_and_answer(name, payload, fds, |_, _| None)
}

/// [`ask`], with the parent acting part way: `react` sees each observation (key and value) as
/// it arrives and may answer it with bytes, which the child side receives with
/// [`Input::wait_for_parent`]. A child side that waits for an answer `react` does not give
/// fails after [`CHILD_TIMEOUT`].
pub(crate) fn ask_and_answer(
    name: &str,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    react: impl FnMut(&str, &str) -> Option<Vec<u8>>,
) -> Result<Details, Error> {
    run_child(name, payload, fds, &[], react)
}

/// [`ask`] of a child started with the environment variables `env` set besides the parent's
/// (`CUDA_VISIBLE_DEVICES`, which the driver reads when the child initializes it).
pub(crate) fn ask_with_env(
    name: &str,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    env: &[(&str, &str)],
) -> Result<Details, Error> {
    run_child(name, payload, fds, env, |_, _| None)
}

/// Starts the child side `name` with `env` set, hands it its input and collects what it sends.
fn run_child(
    name: &str,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    env: &[(&str, &str)],
    mut react: impl FnMut(&str, &str) -> Option<Vec<u8>>,
) -> Result<Details, Error> {
    let exe = std::env::current_exe()?;
    let driver = cuda_mem_sys::driver()?.path().to_path_buf();
    let mut command = Command::new(exe);
    command
        .args([CHILD_ARG, name])
        .env(DRIVER_ENV, driver)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (process, channel) = spawn_with_channel(&mut command)?;
    let mut process = KillOnDrop::new(process);
    let stderr = process.child().stderr.take().map(read_in_background);
    channel.set_read_timeout(Some(CHILD_TIMEOUT))?;
    channel.send(KIND_INPUT, payload, fds)?;
    let mut details = Details::default();
    let end = loop {
        let message = match channel.recv() {
            Ok(message) => message,
            Err(e) => break format!("stopped before the end ({e})"),
        };
        let text = String::from_utf8_lossy(&message.payload).into_owned();
        match message.kind {
            KIND_DETAIL => {
                let (key, value) = text.split_once('\t').unwrap_or((text.as_str(), ""));
                details.put(key, value);
                if let Some(answer) = react(key, value)
                    && let Err(e) = channel.send(KIND_ANSWER, &answer, &[])
                {
                    break format!("could not be answered after {key} ({e})");
                }
            }
            KIND_DONE => break "finished".to_string(),
            KIND_ERROR => break format!("error: {text}"),
            other => break format!("sent a message of unknown kind {other}"),
        }
    };
    drop(channel);
    let status = match process.wait(CHILD_TIMEOUT) {
        Ok(status) => {
            if let Some(signal) = status.signal() {
                details.put(SIGNAL_KEY, signal);
            }
            status.to_string()
        }
        Err(e) => e.to_string(),
    };
    details.put("child", format!("{end}; {status}"));
    let stderr = stderr.and_then(|reader| reader.join().ok()).unwrap_or_default();
    let stderr = stderr.trim();
    if !stderr.is_empty() {
        let tail: String = stderr.chars().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect();
        details.put("child_stderr", tail);
    }
    Ok(details)
}

/// The child's `main`: runs the child side `name` on the input its parent sends.
pub(crate) fn child_main(name: &str) -> ExitCode {
    // SAFETY: this process was started by the probe's parent with `spawn_with_channel`, which
    // handed it the descriptor the environment names; nothing else in this process has taken it.
    let channel = match unsafe { Channel::from_env() } {
        Ok(channel) => Rc::new(channel),
        Err(e) => {
            eprintln!("probe {CHILD_ARG} {name}: {e} (this is started by the probe itself)");
            return ExitCode::FAILURE;
        }
    };
    let result = run_side(name, &channel);
    let sent = match &result {
        Ok(()) => channel.send(KIND_DONE, b"", &[]),
        Err(e) => channel.send(KIND_ERROR, e.to_string().as_bytes(), &[]),
    };
    if result.is_ok() && sent.is_ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn run_side(name: &str, channel: &Rc<Channel>) -> Result<(), Error> {
    let side = crate::child_side(name).ok_or_else(|| format!("no question has a child side named {name}"))?;
    channel.set_read_timeout(Some(CHILD_TIMEOUT))?;
    let message = channel.recv()?;
    if message.kind != KIND_INPUT {
        return Err(format!("expected the input, got a message of kind {}", message.kind).into());
    }
    let input = Input { payload: message.payload, fds: message.fds, channel: Rc::clone(channel) };
    // A side that asks what the driver sees before any context opens its own.
    let _context = if OPENS_ITS_OWN_CONTEXT.contains(&name) { None } else { Some(PrimaryContext::open()?) };
    let forward = Rc::clone(channel);
    let mut details = Details::forwarding(move |key, value| {
        // A parent that is gone no longer reads; the child finishes on its own.
        let _ = forward.send(KIND_DETAIL, format!("{key}\t{value}").as_bytes(), &[]);
    });
    side(&input, &mut details)
}

/// The child side's last step in questions that may leave the process broken: a pool of its
/// own made after everything else, noted as `lived_on` (read back by [`lived_on`]).
pub(crate) fn note_lived_on(details: &mut Details) {
    let own = OwnedPool::new(&pool_props(device_location(0), false, 0));
    details.put("lived_on", code(&own));
}

/// What [`note_lived_on`] saw, as an answer's clause about `who` (the child process, in the
/// question's words); `child` is how the child ended, for one that did not get that far.
pub(crate) fn lived_on(observed: &Details, who: &str, child: &str) -> String {
    match observed.get("lived_on") {
        Some("CUDA_SUCCESS") => format!("{who} lived on (a pool of its own made after)"),
        Some(code) => format!("{who}'s pool of its own made after: {code}"),
        None => format!("{who} did not get through ({child})"),
    }
}
