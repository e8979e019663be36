//! Starting a child process connected to this one by a [`Channel`].
//!
//! Documented on [`spawn_with_channel`].

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use rustix::fs::FileType;
use rustix::io::FdFlags;
use rustix::net::{AddressFamily, SocketType};

use crate::channel::Channel;
use crate::channel_env::{CHANNEL_FD_ENV, CHANNEL_INODE_ENV, ChannelEnvError};
use crate::error::{IpcError, Result};

/// Whether this process has taken its channel from the environment.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Starts `command` with one end of a new [`Channel`] and returns the child and the other end.
///
/// [`spawn_with_channel`] creates a socket pair, keeps one end, and starts the child (through
/// [`Command::spawn`]: `fork` and `exec`, never a `fork` that goes on running Rust code) with the
/// other end inherited. The child's end is inheritable in that child only: the parent's copy keeps
/// close-on-exec, so children spawned at the same time by other threads do not inherit it, and the
/// flag is cleared between `fork` and `exec` in the new process alone.
///
/// The child finds its end through two environment variables: [`CHANNEL_FD_ENV`], the descriptor
/// number, and [`CHANNEL_INODE_ENV`], the socket's inode, which lets [`Channel::from_env`] check
/// that the descriptor is the socket the parent meant and not some other file that happens to have
/// that number (as in a grandchild that inherited the environment but not the descriptor).
///
/// Taking the channel is `unsafe`: it adopts a descriptor by number, and only the caller can
/// know that nothing else in the process owns it (see [`Channel::from_env`]).
///
/// ```no_run
/// use std::process::Command;
/// use cuda_mem_ipc::{Channel, spawn_with_channel};
///
/// // In the parent:
/// let (mut child, channel) = spawn_with_channel(&mut Command::new("./worker"))?;
/// channel.send(1, b"work", &[])?;
/// let reply = channel.recv()?;
/// child.wait().map_err(|e| cuda_mem_ipc::IpcError::Io { context: "waiting", source: e })?;
///
/// // In ./worker, started by the parent above; nothing else in it adopts inherited descriptors.
/// // SAFETY: the descriptor named by the environment was inherited from the parent for this
/// // call, and nothing else in this process owns it.
/// let channel = unsafe { Channel::from_env()? };
/// let job = channel.recv()?;
/// # Ok::<(), cuda_mem_ipc::IpcError>(())
/// ```
///
/// Sets [`CHANNEL_FD_ENV`] and [`CHANNEL_INODE_ENV`] in the child's environment and arranges for
/// the descriptor to survive `exec` in the child; the child takes it with
/// [`Channel::from_env`]. Everything else about `command` (arguments, other environment
/// variables, standard streams) is as the caller set it up.
///
/// This adds a `pre_exec` hook to `command` that is active for this call only: spawning the same
/// `command` again starts a process without a channel (whose `from_env` fails).
///
/// The parent's channel knows its peer, the child ([`Channel::peer_process_id`]), and the child's
/// knows the parent (the socket pair's creator): an [`IpcChannel`](crate::IpcChannel) keys the
/// pools it imports by that process.
///
/// # Errors
///
/// - [`IpcError::Io`]: the socket pair cannot be created, or the process cannot be started.
pub fn spawn_with_channel(command: &mut Command) -> Result<(Child, Channel)> {
    let (parent, child_end) = UnixStream::pair().map_err(|e| IpcError::io("creating a socket pair", e))?;
    // The child's standard streams are set up on descriptors 0 to 2 between fork and exec; keep
    // the channel clear of them (they can be free in the parent if it closed its own).
    let child_end: OwnedFd = if child_end.as_raw_fd() < 3 {
        rustix::io::fcntl_dupfd_cloexec(&child_end, 3)
            .map_err(|e| IpcError::io("moving the child's channel descriptor above 2", e))?
    } else {
        child_end.into()
    };
    let inode =
        rustix::fs::fstat(&child_end).map_err(|e| IpcError::io("reading the channel socket's inode", e))?.st_ino;
    let raw = child_end.as_raw_fd();

    // The hook reads the number through this cell, which is cleared once the spawn is over, so a
    // later spawn of the same command does not touch whatever then has that number.
    let target = Arc::new(AtomicI32::new(raw));
    let hook_target = Arc::clone(&target);
    command.env(CHANNEL_FD_ENV, raw.to_string()).env(CHANNEL_INODE_ENV, inode.to_string());
    let hook = move || {
        let fd = hook_target.load(Ordering::Relaxed);
        if fd < 0 {
            return Ok(());
        }
        // SAFETY: `fd` is the child's channel end, open in this process for the duration of
        // this call: the parent keeps `child_end` open until `spawn` has returned (when the cell
        // is cleared), and fork copies the descriptor table.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        rustix::io::fcntl_setfd(fd, FdFlags::empty()).map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))
    };
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe work is
    // allowed. It does an atomic load (a plain memory read) and one fcntl(F_SETFD) system call
    // through rustix, which neither allocates nor takes locks; its error path builds an
    // io::Error from an OS error code, which does not allocate either.
    unsafe {
        command.pre_exec(hook);
    }
    let spawned = command.spawn();
    target.store(-1, Ordering::Relaxed);
    drop(child_end);
    let child = spawned.map_err(|e| IpcError::io("starting the child process", e))?;
    // The socket pair is this process's own, so its peer credentials name this process: the
    // peer is the child, which keeps its id until this process reaps it.
    let peer = crate::peer::PeerId::of_child(child.id());
    Ok((child, Channel::with_peer(parent, peer)))
}

/// Checks that `fd` is a Unix stream socket with inode `inode`.
fn check_channel_fd(fd: BorrowedFd<'_>, inode: u64) -> std::result::Result<(), ChannelEnvError> {
    let n = fd.as_raw_fd();
    let stat = rustix::fs::fstat(fd).map_err(|e| ChannelEnvError::NotOpen { fd: n, source: e.into() })?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err(ChannelEnvError::NotASocket { fd: n, mode: stat.st_mode });
    }
    if stat.st_ino != inode {
        return Err(ChannelEnvError::WrongInode { fd: n, found: stat.st_ino, expected: inode });
    }
    let kind = rustix::net::sockopt::socket_type(fd)
        .map_err(|e| ChannelEnvError::SocketTypeUnreadable { fd: n, source: e.into() })?;
    if kind != SocketType::STREAM {
        return Err(ChannelEnvError::NotAStreamSocket { fd: n, socket_type: kind.as_raw() });
    }
    let address =
        rustix::net::getsockname(fd).map_err(|e| ChannelEnvError::AddressUnreadable { fd: n, source: e.into() })?;
    if address.address_family() != AddressFamily::UNIX {
        return Err(ChannelEnvError::NotAUnixSocket { fd: n, family: address.address_family().as_raw() });
    }
    Ok(())
}

/// Parses an environment variable, if set.
fn env_number<T: std::str::FromStr>(variable: &'static str) -> std::result::Result<Option<T>, ChannelEnvError> {
    let value = match std::env::var(variable) {
        Ok(value) => value,
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => return Err(ChannelEnvError::NotANumber { variable, value }),
    };
    value.trim().parse().map(Some).map_err(|_| ChannelEnvError::NotANumber { variable, value: value.into() })
}

impl Channel {
    /// The channel a parent passed with [`spawn_with_channel`], in the child.
    ///
    /// Takes ownership of the descriptor named by [`CHANNEL_FD_ENV`] after checking that it is
    /// open, a Unix domain stream socket and the very socket the parent passed (its inode is
    /// the one [`CHANNEL_INODE_ENV`] names; without that variable nothing is taken), then sets
    /// close-on-exec on it again so that processes this one starts do not inherit it, and puts
    /// it in blocking mode. The environment variables are left as they are (changing the
    /// environment is not thread-safe); the inode check makes them harmless to a grandchild.
    ///
    /// A process has at most one such channel: a second call fails.
    ///
    /// # Safety
    ///
    /// When [`CHANNEL_FD_ENV`] names an open socket whose inode is the one
    /// [`CHANNEL_INODE_ENV`] names, that descriptor must be this process's to take: it was
    /// inherited from the parent for this call (through [`spawn_with_channel`], or set up the
    /// same way), and nothing else in this process owns it or will adopt it (no code but an
    /// earlier `from_env`, which makes later calls fail, takes that number as its own, with
    /// [`FromRawFd::from_raw_fd`] or through another library that adopts inherited
    /// descriptors). The returned channel closes it when dropped. Otherwise (a variable missing,
    /// or a descriptor that is not that socket) nothing is taken and the call has no effect but
    /// its error.
    ///
    /// This is `unsafe` because no check can establish it. Which code owns a descriptor is not
    /// something the system records: the checks tell the channel's socket from other files that
    /// have its number, not from the same socket already adopted by other code. Had something
    /// else owned it, that owner would go on using a closed, perhaps reused, number (std aborts
    /// the process when it notices). [`FromRawFd::from_raw_fd`] and `jobserver::Client::from_env`
    /// are `unsafe` for the same reason.
    ///
    /// ```compile_fail,E0133
    /// // Without `unsafe`, taking the channel does not compile.
    /// let _channel = cuda_mem_ipc::Channel::from_env();
    /// ```
    ///
    /// # Errors
    ///
    /// - [`IpcError::ChannelEnv`]: a variable is missing or malformed, the descriptor fails the
    ///   checks, or the channel was already taken ([`ChannelEnvError`] says which). Nothing is
    ///   taken.
    /// - [`IpcError::Io`]: setting the descriptor's flags failed. The descriptor was taken and is
    ///   closed.
    pub unsafe fn from_env() -> Result<Channel> {
        let fd: RawFd = env_number(CHANNEL_FD_ENV)?.ok_or(ChannelEnvError::NoDescriptor)?;
        if fd < 0 {
            return Err(ChannelEnvError::NegativeDescriptor { fd }.into());
        }
        let inode: u64 = env_number(CHANNEL_INODE_ENV)?.ok_or(ChannelEnvError::NoInode { fd })?;
        {
            // SAFETY: the borrow lasts for these checks only, during which nothing closes `fd`:
            // the caller promises nothing else in this process owns it, and nothing in this
            // function closes it. If `fd` is not open, the first check (fstat) fails with EBADF
            // without touching any resource and nothing further uses it.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            check_channel_fd(borrowed, inode)?;
        }
        if TAKEN.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(ChannelEnvError::AlreadyTaken.into());
        }
        // SAFETY: `fd` is open and is the socket the parent passed (checked above, inode
        // included). Nothing else in this process owns it: the caller promises so, and the TAKEN
        // flag makes sure `from_env` itself takes it once.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        rustix::io::fcntl_setfd(&owned, FdFlags::CLOEXEC)
            .map_err(|e| IpcError::io("setting close-on-exec on the inherited channel", e))?;
        Channel::from_stream(UnixStream::from(owned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::{UnixDatagram, UnixListener};

    fn is_cloexec(fd: impl AsFd) -> std::result::Result<bool, rustix::io::Errno> {
        rustix::io::fcntl_getfd(fd).map(|f| f.contains(FdFlags::CLOEXEC))
    }

    /// The refusal, with its message (which names what was found).
    fn refusal(result: std::result::Result<(), ChannelEnvError>) -> (ChannelEnvError, String) {
        let error = result.expect_err("a refusal");
        let text = error.to_string();
        (error, text)
    }

    fn inode(fd: impl AsFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    #[test]
    fn a_unix_stream_socket_passes() {
        let (a, _b) = UnixStream::pair().unwrap();
        check_channel_fd(a.as_fd(), inode(&a)).unwrap();
    }

    #[test]
    fn the_wrong_inode_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let (error, text) = refusal(check_channel_fd(a.as_fd(), inode(&b)));
        let expected = (a.as_raw_fd(), inode(&a), inode(&b));
        assert!(
            matches!(error, ChannelEnvError::WrongInode { fd, found, expected: e } if (fd, found, e) == expected),
            "{error:?}"
        );
        assert!(text.contains("not the channel the parent passed"), "{text}");
    }

    #[test]
    fn files_and_other_sockets_are_refused() {
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let (error, text) = refusal(check_channel_fd(file.as_fd(), inode(&file)));
        assert!(matches!(error, ChannelEnvError::NotASocket { .. }), "{error:?}");
        assert!(text.contains("is a RegularFile, not a socket"), "{text}");

        let (d, _e) = UnixDatagram::pair().unwrap();
        let (error, text) = refusal(check_channel_fd(d.as_fd(), inode(&d)));
        assert!(
            matches!(error, ChannelEnvError::NotAStreamSocket { socket_type, .. } if socket_type == SocketType::DGRAM.as_raw())
        );
        assert!(text.contains("not a stream socket"), "{text}");

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (error, text) = refusal(check_channel_fd(tcp.as_fd(), inode(&tcp)));
        assert!(
            matches!(error, ChannelEnvError::NotAUnixSocket { family, .. } if family == AddressFamily::INET.as_raw())
        );
        assert!(text.contains("not a Unix domain socket"), "{text}");

        // A listening Unix socket is a stream socket too; recv on it fails later with an Io
        // error, which is acceptable: it is at least the right kind of object.
        let path = std::env::temp_dir().join(format!("cuda-mem-ipc-{}.sock", uuid::Uuid::new_v4()));
        let l = UnixListener::bind(&path).unwrap();
        check_channel_fd(l.as_fd(), inode(&l)).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_closed_descriptor_is_refused() {
        // Past the kernel's largest descriptor number (`fs.nr_open` is at most 2^30), so never
        // open, whatever the soft limit says (valgrind keeps its own descriptors just under the
        // limit it shows the program).
        // SAFETY: the number is never an open descriptor; fstat on it fails with EBADF and
        // touches nothing.
        let never_open = unsafe { BorrowedFd::borrow_raw(i32::MAX) };
        let error = IpcError::from(check_channel_fd(never_open, 0).unwrap_err());
        let IpcError::ChannelEnv(ChannelEnvError::NotOpen { fd: i32::MAX, source }) = &error else {
            panic!("expected a ChannelEnv error with the system's answer as its source, got {error:?}");
        };
        assert_eq!(source.raw_os_error(), Some(rustix::io::Errno::BADF.raw_os_error()));
        // The system's answer is in the source chain.
        let cause = std::error::Error::source(&error).and_then(std::error::Error::source);
        assert!(cause.is_some_and(|s| s.is::<std::io::Error>()));
        // The message still ends with what the system said, then what to do.
        let text = error.to_string();
        assert!(text.contains(&format!("which is not open here ({source}); start this process with")), "{text}");
    }

    #[test]
    fn spawned_child_inherits_only_its_end() {
        // `sh` checks that the descriptor named in the environment is the socket the inode
        // variable names.
        let script = r#"
            fd=$CUDA_MEM_IPC_CHANNEL_FD
            test -S /proc/self/fd/$fd || exit 10
            ino=$(stat -L -c %i /proc/self/fd/$fd) || exit 11
            test "$ino" = "$CUDA_MEM_IPC_CHANNEL_INODE" || exit 12
        "#;
        let (mut child, channel) = spawn_with_channel(Command::new("sh").arg("-c").arg(script)).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{status}");
        // The parent's end keeps close-on-exec.
        assert_eq!(is_cloexec(&channel), Ok(true));
    }

    #[test]
    fn respawning_the_same_command_gives_no_channel() {
        let mut command = Command::new("sh");
        command.arg("-c").arg(r#"test -e /proc/self/fd/$CUDA_MEM_IPC_CHANNEL_FD"#);
        let (mut first, _channel) = spawn_with_channel(&mut command).unwrap();
        assert!(first.wait().unwrap().success(), "the first child has it");
        // The hook is now inert. Were it not, it would run fcntl on a number the parent has
        // closed, and the spawn would fail with EBADF (unless another thread reopened that
        // number meanwhile).
        let mut second = command.spawn().unwrap();
        let _ = second.wait().unwrap();
    }

    #[test]
    fn a_failed_spawn_is_an_io_error() {
        match spawn_with_channel(&mut Command::new("/nonexistent/cuda-mem-ipc-child")) {
            Err(IpcError::Io { context, .. }) => assert!(context.contains("starting")),
            other => panic!("expected an Io error, got {other:?}"),
        }
    }
}
