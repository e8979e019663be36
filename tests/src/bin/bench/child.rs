//! The parent's side of `bench --child` (cases 2 and 4): spawning it with a data channel and a
//! control socket, and the control socket's line protocol (a command, then a reply line, or
//! `error: …`). The child's side is [`crate::server`].

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};

use cuda_mem_core::sys::DRIVER_ENV;
use cuda_mem_ipc::{IpcChannel, spawn_with_channel};

use crate::Error;
use crate::cli::CHILD_ARG;

/// The message kind of the raw sharing path (export data as plain bytes).
pub(crate) const RAW_KIND: u16 = 100;
/// The message kind of the control socket's handover.
const CONTROL_KIND: u16 = 101;

/// The parent's side of a child: the data channel and a control socket.
pub(crate) struct Child {
    process: std::process::Child,
    /// The data channel: pools and buffers through our layer, raw exports as plain bytes.
    pub(crate) ipc: IpcChannel,
    control: BufReader<UnixStream>,
}

impl Child {
    /// Starts `bench --child` on the driver at `driver_path`, and hands it the control socket.
    pub(crate) fn spawn(driver_path: &Path) -> Result<Child, Error> {
        let mut command = Command::new(std::env::current_exe()?);
        command.arg(CHILD_ARG).env(DRIVER_ENV, driver_path).stdin(Stdio::null());
        let (process, channel) = spawn_with_channel(&mut command)?;
        let ipc = IpcChannel::new(channel);
        // The control socket: commands and replies, apart from the data channel, so that the
        // child starts its clock only when the data is already in its socket.
        let (here, there) = UnixStream::pair()?;
        ipc.channel().send(CONTROL_KIND, b"control", &[std::os::fd::AsFd::as_fd(&there)])?;
        drop(there);
        Ok(Child { process, ipc, control: BufReader::new(here) })
    }

    /// Sends the command `line`.
    pub(crate) fn command(&mut self, line: &str) -> Result<(), Error> {
        self.control.get_mut().write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }

    /// The child's reply to the last command, or the error it reported.
    pub(crate) fn reply(&mut self) -> Result<String, Error> {
        let mut line = String::new();
        if self.control.read_line(&mut line)? == 0 {
            return Err("the child closed its control socket".into());
        }
        let line = line.trim_end().to_string();
        match line.strip_prefix("error: ") {
            Some(error) => Err(format!("the child failed: {error}").into()),
            None => Ok(line),
        }
    }

    /// Tells the child to exit, and checks that it exits successfully.
    pub(crate) fn exit(mut self) -> Result<(), Error> {
        self.command("exit")?;
        let status = self.process.wait()?;
        if !status.success() {
            return Err(format!("the child exited with {status}").into());
        }
        Ok(())
    }
}
