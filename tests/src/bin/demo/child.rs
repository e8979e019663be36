//! Steps 5 and 8, the child process: this program again with `--child`, started with
//! `spawn_with_channel`, the parent's handle on it (requests and replies kept in step), and its
//! exit (killed if it outstays its time or is left behind).

use std::cell::Cell;
use std::process::{Command, Stdio};
use std::time::Duration;

use cuda_mem_core::Stream;
use cuda_mem_core::sys::DRIVER_ENV;
use cuda_mem_integration::child_process::KillOnDrop;
use cuda_mem_ipc::{IpcChannel, IpcError, Received, spawn_with_channel};

use crate::devices::Demo;
use crate::protocol::Request;
use crate::{CHILD_ARG, Error};

/// How long either process waits for the other's reply, and the child for its exit.
pub(crate) const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts this program again as the child, connected by a channel, and waits for it to say it
/// is ready.
pub(crate) fn spawn_child(demo: &Demo) -> Result<ChildProcess, Error> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(&exe);
    command.arg(CHILD_ARG).env(DRIVER_ENV, &demo.driver_path).stdin(Stdio::null());
    let (process, channel) = spawn_with_channel(&mut command)?;
    let child =
        ChildProcess { process: KillOnDrop::new(process), ipc: IpcChannel::new(channel), in_step: Cell::new(true) };
    child.ipc.channel().set_read_timeout(Some(CHILD_TIMEOUT))?;
    let hello = child.reply(&demo.gpu.stream)?;
    println!(
        "  started `{} {CHILD_ARG}` (pid {}) with spawn_with_channel, {DRIVER_ENV}={}",
        exe.file_name().map_or_else(|| exe.display().to_string(), |n| n.to_string_lossy().into_owned()),
        child.process.id(),
        demo.driver_path.display()
    );
    println!("  the child says: {hello}");
    Ok(child)
}

/// Asks the child to quit (or, after a failure left the channel out of step, closes it) and
/// checks that it exits successfully.
pub(crate) fn finish_child(child: ChildProcess) -> Result<(), Error> {
    let ChildProcess { mut process, ipc, in_step } = child;
    let asked = in_step.get() && ipc.send_data(Request::Quit.encode().as_bytes()).is_ok();
    drop(ipc);
    let status = process.wait(CHILD_TIMEOUT)?;
    if !asked {
        return Err(format!("the channel was out of step, so it was closed; the child exited with {status}").into());
    }
    if !status.success() {
        return Err(format!("the child exited with {status}").into());
    }
    println!("  the child exited: {status}");
    Ok(())
}

/// The child process and the channel to it.
pub(crate) struct ChildProcess {
    process: KillOnDrop,
    pub(crate) ipc: IpcChannel,
    /// Whether every request so far has had its reply: after a step failed part way, the next
    /// message on the channel is not what either side expects, and no new request is sent.
    pub(crate) in_step: Cell<bool>,
}

impl ChildProcess {
    /// Sends a request (its reply is due before the next one).
    pub(crate) fn request(&self, request: &Request) -> Result<(), Error> {
        if !self.in_step.get() {
            return Err("the channel to the child is out of step after an earlier failure".into());
        }
        self.in_step.set(false);
        Ok(self.ipc.send_data(request.encode().as_bytes())?)
    }

    /// The child's next reply: `ok …` is its text, `error …` an error.
    pub(crate) fn reply(&self, stream: &Stream) -> Result<String, Error> {
        let bytes = match self.ipc.recv(stream) {
            Ok(Received::Data(bytes)) => bytes,
            Ok(_) => return Err("the child sent a pool or buffers where a reply was due".into()),
            Err(IpcError::PeerClosed) => {
                return Err("the child closed the channel (it exited: see its errors above)".into());
            }
            Err(e) => return Err(e.into()),
        };
        let text = String::from_utf8_lossy(&bytes);
        let reply = match text.split_once(' ') {
            Some(("ok", rest)) => Ok(rest.to_string()),
            Some(("error", rest)) => Err(format!("the child reports: {rest}").into()),
            _ => return Err(format!("the child replied {text:?}").into()),
        };
        self.in_step.set(true);
        reply
    }
}
