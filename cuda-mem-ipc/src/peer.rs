//! Who is at the other end of a channel, as the kernel vouches for it: [`PeerId`].
//!
//! A peer names its pools with UUIDs, which are only its word: a hostile peer can name another
//! process's pool. A UUID is trusted only together with the process that named it, and that
//! process is told by the kernel, not by the peer:
//!
//! - On a channel end this process adopted (from the environment, `accept`, `connect`, a socket
//!   handed over), the socket's peer credentials (`SO_PEERCRED`): the process that created the
//!   other end (a socket pair's creator) or connected it (`connect`, `listen`). The kernel records
//!   them when the connection is made; no peer can change them.
//! - On the parent's end of [`spawn_with_channel`](crate::spawn_with_channel), whose socket pair
//!   this process created (so its peer credentials name this process itself), the child it
//!   started, by the process id the spawn returned.
//!
//! Peer credentials name a process by its id, which the system gives to a new process once the
//! old one has exited and been reaped. So a peer is its id *and its start time*
//! (`/proc/<pid>/stat`, field 22, in clock ticks since boot), read when the channel is adopted:
//! a later process under the same id started later, and is another peer. The start time is read
//! while the peer is known to be there: the socket's other end is still open (not hung up) after
//! the read, and the peer that created it holds it (see below); a child this process started
//! keeps its id until this process reaps it.
//!
//! Where the kernel does not tell, a channel has no peer identity and imports on its own (as
//! every channel did before): a socket pair this process created itself ([`Channel::pair`]:
//! both ends name this process), a peer the kernel reports as process 0 (in a pid namespace
//! this process does not see), a peer that already hung up, or a system without `/proc`.
//!
//! What the kernel vouches for is who created or connected the other end, not who holds it now:
//! a process that hands its end to another (over a channel, or by `fork`) lets that process
//! speak as itself, and a broker that creates socket pairs and hands out both ends is the peer
//! of each. Give channel ends only to processes that may speak for you, and connect through
//! [`spawn_with_channel`](crate::spawn_with_channel) or a
//! [`ChannelListener`](crate::ChannelListener), where each process makes its own end.
//!
//! [`Channel::pair`]: crate::Channel::pair

use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

/// A process at the other end of a channel, as the kernel vouches for it: its id and its start
/// time (see the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PeerId {
    pid: i32,
    /// `/proc/<pid>/stat`'s start time, in clock ticks since boot.
    start_time: u64,
}

impl PeerId {
    /// The peer of `socket` by its peer credentials: `None` when the credentials name this
    /// process, no process visible here, or a process that cannot be read in `/proc`, or when
    /// the other end has hung up by the time the start time was read.
    pub(crate) fn of_socket(socket: BorrowedFd<'_>) -> Option<PeerId> {
        let pid = peer_pid(socket)?;
        if pid <= 0 || pid == own_pid() {
            return None;
        }
        let peer = PeerId::of_process(pid)?;
        // Read while the other end is open: its creator held it, so the id was that creator's.
        (!hung_up(socket)).then_some(peer)
    }

    /// A child this process started (and has not reaped: its id is still its own), by the id
    /// the spawn returned.
    pub(crate) fn of_child(pid: u32) -> Option<PeerId> {
        PeerId::of_process(i32::try_from(pid).ok()?)
    }

    /// The process `pid` as it is now.
    fn of_process(pid: i32) -> Option<PeerId> {
        Some(PeerId { pid, start_time: start_time(pid)? })
    }

    /// The process's id.
    pub(crate) fn pid(self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// Whether the process is still there (the same id, started at the same time) and has not
    /// exited: a zombie (exited, not yet reaped) holds nothing any more, the driver's mappings
    /// included.
    pub(crate) fn is_alive(&self) -> bool {
        std::fs::read(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| parse_stat(&stat))
            .is_some_and(|(state, start)| start == self.start_time && !matches!(state, 'Z' | 'X' | 'x'))
    }

    /// A descriptor of the process (`pidfd_open`) that becomes readable once it exits; `None`
    /// when it has exited already (or the kernel has no pidfds: the caller then polls
    /// [`is_alive`](Self::is_alive)).
    pub(crate) fn exit_notifier(&self) -> Option<std::os::fd::OwnedFd> {
        let pid = rustix::process::Pid::from_raw(self.pid)?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
        // Opened before this check: if the id is still this process's now, the descriptor is
        // of this process (an id is not reused while the process it names is there).
        self.is_alive().then_some(pidfd)
    }
}

/// This process's id.
fn own_pid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// The process id in `socket`'s peer credentials (`SO_PEERCRED`), 0 when the kernel reports
/// none visible here.
///
/// Through `libc`, not `rustix::net::sockopt::socket_peercred`: rustix's `UCred` holds a
/// non-zero `Pid`, and the kernel does report 0 (a peer in a pid namespace this process does not
/// see, an unconnected socket), which that type cannot hold without undefined behaviour.
fn peer_pid(socket: BorrowedFd<'_>) -> Option<i32> {
    peer_credentials(socket).map(|credentials| credentials.pid)
}

/// `socket`'s peer credentials (`SO_PEERCRED`), as the kernel recorded them.
pub(crate) fn peer_credentials(socket: BorrowedFd<'_>) -> Option<libc::ucred> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    // SAFETY: `socket` is an open descriptor for the call; `credentials` is a writable
    // `struct ucred` and `len` its size, which the kernel writes at most.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut credentials).cast(),
            &mut len,
        )
    };
    (result == 0 && usize::try_from(len).ok() == Some(std::mem::size_of::<libc::ucred>())).then_some(credentials)
}

/// Whether `socket`'s other end has closed, or shut down its sending side.
fn hung_up(socket: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&socket, PollFlags::RDHUP)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&now)) {
        Ok(_) => fds[0].revents().intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
        // Cannot tell: not vouched for.
        Err(_) => true,
    }
}

/// The start time of process `pid` (`/proc/<pid>/stat`, field 22), if it can be read.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line.
fn parse_start_time(stat: &[u8]) -> Option<u64> {
    parse_stat(stat).map(|(_, start)| start)
}

/// Fields 3 (the state: `R`, `S`, … `Z` for a zombie) and 22 (the start time) of a
/// `/proc/<pid>/stat` line. The second field, the command name in parentheses, may hold spaces
/// and parentheses itself, so the fields are counted from the last `)`.
fn parse_stat(stat: &[u8]) -> Option<(char, u64)> {
    let after_name = stat.iter().rposition(|&b| b == b')')? + 1;
    let rest = std::str::from_utf8(&stat[after_name..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 onwards; the start time is the 22nd field, the 19th of these.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::{UnixListener, UnixStream};

    use super::*;

    #[test]
    fn the_start_time_is_counted_from_the_last_parenthesis() {
        let line = b"1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987_654));
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_start_time(b"1234 (short) S 1"), None);
        assert_eq!(parse_start_time(b"no parenthesis"), None);
    }

    #[test]
    fn this_process_has_a_start_time_that_stays() {
        let me = PeerId::of_process(own_pid()).expect("/proc/self is readable");
        assert!(me.is_alive());
        assert!(!PeerId { start_time: me.start_time + 1, ..me }.is_alive(), "another start is another process");
    }

    #[test]
    fn a_child_that_exited_is_not_alive_even_before_it_is_reaped() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let peer = PeerId::of_child(child.id()).unwrap();
        let notifier = peer.exit_notifier();
        // Exited, not reaped (a zombie): the pidfd turns readable, and the peer is not alive.
        if let Some(pidfd) = &notifier {
            let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
            poll(&mut fds, None).unwrap();
        } else {
            while peer.is_alive() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while peer.is_alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!peer.is_alive(), "a zombie holds nothing");
        assert!(peer.exit_notifier().is_none());
        child.wait().unwrap();
        assert!(!peer.is_alive());
    }

    #[test]
    fn a_socket_pair_of_this_process_names_no_peer() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(peer_pid(a.as_fd()), Some(own_pid()));
        assert_eq!(PeerId::of_socket(a.as_fd()), None);
        assert_eq!(PeerId::of_socket(b.as_fd()), None);
    }

    #[test]
    fn no_peer_on_a_socket_that_is_not_connected() {
        let path = std::env::temp_dir().join(format!("cuda-mem-ipc-peer-{}.sock", uuid::Uuid::new_v4()));
        let listener = UnixListener::bind(&path).unwrap();
        assert_eq!(PeerId::of_socket(listener.as_fd()), None);
        drop(listener);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_hung_up_socket_is_seen_so() {
        let (a, b) = UnixStream::pair().unwrap();
        assert!(!hung_up(a.as_fd()));
        b.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(hung_up(a.as_fd()));
        drop(b);
        assert!(hung_up(a.as_fd()));
    }
}
