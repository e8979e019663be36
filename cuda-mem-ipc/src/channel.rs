//! A message channel between two processes that carries file descriptors.
//!
//! Documented on [`Channel`]: its frames, errors, descriptors and threads.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};

use crate::assembly::{CONTROL_SPACE, FrameAssembly, RawMessage, Step};
use crate::error::{ChannelOperation, IpcError, MessageLimit, ProtocolError, Result};
use crate::peer::PeerId;
use crate::wire::{FRAME_HEADER_LEN, FrameHeader, MAX_FDS, MAX_PAYLOAD_LEN};

/// One end of a connected channel between two processes, which carries file descriptors.
///
/// A [`Channel`] is one end of a connected Unix domain stream socket. It sends framed messages:
/// a kind (a `u16` the application chooses), a byte payload, and file descriptors, which the
/// kernel duplicates into the receiving process (`SCM_RIGHTS`). This is how pools are shared: the
/// exporting process sends the pool's file descriptor, the importing process receives its own
/// descriptor for the same pool.
///
/// Channels come from [`Channel::pair`] (both ends in this process, to hand one to a child: see
/// [`spawn_with_channel`](crate::spawn_with_channel)), from [`Channel::connect`],
/// [`Channel::connect_abstract`] and [`ChannelListener::accept`](crate::ChannelListener::accept)
/// (unrelated processes meeting at a socket path or an abstract name), and from
/// [`Channel::from_env`] (a child started by [`spawn_with_channel`](crate::spawn_with_channel)).
///
/// # Frames
///
/// Each message is one frame: a 24-byte header ([`FrameHeader`], whose docs have the layout),
/// then the payload, at most [`MAX_PAYLOAD_LEN`] bytes with at most [`MAX_FDS`] descriptors.
///
/// The descriptors travel as one `SCM_RIGHTS` control message on the first `sendmsg` of the
/// frame, so they arrive with the first bytes of its header. The receiver accepts them anywhere
/// within the frame's bytes, and requires their number to match the header. It counts them after
/// every `recvmsg` and stops as soon as there are more than the header announced (or, before the
/// header is complete, more than [`MAX_FDS`]), so a peer cannot make it hold more than that plus
/// one `recvmsg`'s worth.
///
/// # Errors and peer input
///
/// Nothing a peer sends makes [`Channel::recv`] panic. Descriptors are wrapped in [`OwnedFd`](std::os::fd::OwnedFd) as
/// soon as they arrive, so every one received is either returned in a [`RawMessage`] or closed,
/// including when the frame turns out to be malformed. Receiving uses `MSG_CMSG_CLOEXEC`, so
/// received descriptors are never inherited by children spawned later. A malformed frame is an
/// [`ProtocolError::Frame`] (in [`IpcError::Protocol`]); an end of stream between frames is
/// [`IpcError::PeerClosed`].
///
/// Once a frame has been partly consumed and then failed (a malformed header, an end of stream
/// or a time-out in the middle of a frame), the byte stream is out of step: the channel refuses
/// further receives with [`ProtocolError::OutOfStep`]. Likewise a send that fails partway through a
/// frame makes further sends fail ([`IpcError::ChannelBroken`]). Drop such a channel and open a
/// new one: [`IpcError::channel_usable`] says which errors leave the channel usable, and each
/// error's message says it too.
///
/// # Time-outs
///
/// A receive or send that runs past the channel's time-out ([`Channel::set_read_timeout`],
/// [`Channel::set_write_timeout`]) is an [`IpcError::Timeout`]: before any byte of the message
/// the channel is still usable, partway through one it is not.
///
/// # The peer
///
/// A channel knows which process is at its other end when the kernel vouches for it (the
/// socket's peer credentials, or the child [`spawn_with_channel`](crate::spawn_with_channel)
/// started): [`Channel::peer_process_id`]. An [`IpcChannel`](crate::IpcChannel) keys the pools it
/// imports by that process and the UUID it names them with, so a pool one process sends on two
/// channels is imported once.
///
/// # Running out of descriptors
///
/// When this process has no free descriptor numbers (`RLIMIT_NOFILE`), the system cannot hand
/// over a message's descriptors: it drops them and marks the control data truncated. That is not
/// the peer's fault, and the receiver tells the two apart (a truncation with room left in its
/// control buffer is this process's; one that filled the buffer is the peer's). It reads the rest
/// of the frame, closes whatever descriptors of it did arrive, and reports
/// [`IpcError::OutOfDescriptors`]; the channel stays in step, so the next message is received
/// normally once descriptors are free again.
///
/// # Threads
///
/// [`Channel::send`] and [`Channel::recv`] take `&self`, and a `Channel` is `Send` and `Sync`.
/// Sends are serialized with one lock and receives with another, so concurrent senders never
/// interleave their frames and concurrent receivers each get whole messages, while one thread
/// may send as another receives.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    send_lock: Mutex<()>,
    recv_lock: Mutex<()>,
    /// A send failed partway through a frame.
    send_broken: AtomicBool,
    /// A receive failed partway through a frame.
    recv_broken: AtomicBool,
    /// How long one `recv` may take, in nanoseconds (0: no limit), from the call to the
    /// message's last byte. The socket's own time-out bounds each read only, which a peer
    /// sending a byte at a time would renew indefinitely.
    read_timeout_ns: AtomicU64,
    /// The process at the other end, where the kernel vouches for it.
    peer: Option<PeerId>,
}

/// A lock that shrugs off poisoning: the guarded data is `()`, so there is nothing to corrupt.
fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) const SEND_CONTEXT: &str = "sending a message on the IPC channel";
pub(crate) const SEND_BEFORE_ANY_BYTE_CONTEXT: &str =
    "sending a message on the IPC channel (nothing of it went out, and the channel is still usable)";
pub(crate) const SEND_AFTER_BROKEN_CONTEXT: &str = "sending on the IPC channel: an earlier send failed partway through a message, so the peer cannot find where \
     the next one starts";

/// A read time-out in nanoseconds, 0 for none (a zero time-out is refused by the socket).
fn timeout_ns(timeout: Option<Duration>) -> u64 {
    timeout.map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1))
}

impl Channel {
    /// Two connected ends (`socketpair`, close-on-exec).
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: the socket pair cannot be created (such as out of descriptors).
    pub fn pair() -> Result<(Channel, Channel)> {
        let (a, b) = UnixStream::pair().map_err(|e| IpcError::io("creating a socket pair", e))?;
        Ok((Channel::new(a), Channel::new(b)))
    }

    /// Connects to a [`ChannelListener`](crate::ChannelListener) bound at `path`.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: nothing listens at `path`, or the connection is refused.
    pub fn connect(path: impl AsRef<Path>) -> Result<Channel> {
        let stream =
            UnixStream::connect(path).map_err(|e| IpcError::io("connecting to the IPC channel's socket", e))?;
        Ok(Channel::new(stream))
    }

    /// A channel over a connected Unix stream socket, which is put in blocking mode.
    ///
    /// The peer must speak this channel's protocol.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: the socket cannot be put in blocking mode.
    pub fn from_stream(stream: UnixStream) -> Result<Channel> {
        stream.set_nonblocking(false).map_err(|e| IpcError::io("putting the IPC socket in blocking mode", e))?;
        Ok(Channel::new(stream))
    }

    pub(crate) fn new(stream: UnixStream) -> Channel {
        let peer = PeerId::of_socket(stream.as_fd());
        Channel::with_peer(stream, peer)
    }

    /// Its socket and its peer (for an [`AsyncChannel`](crate::AsyncChannel)).
    #[cfg(feature = "tokio")]
    pub(crate) fn into_parts(self) -> (UnixStream, Option<PeerId>) {
        (self.stream, self.peer)
    }

    /// A channel over `stream` whose other end is `peer`'s.
    pub(crate) fn with_peer(stream: UnixStream, peer: Option<PeerId>) -> Channel {
        // A socket handed over with a time-out set keeps it (a failed query: none).
        let timeout = stream.read_timeout().ok().flatten();
        Channel {
            stream,
            send_lock: Mutex::new(()),
            recv_lock: Mutex::new(()),
            send_broken: AtomicBool::new(false),
            recv_broken: AtomicBool::new(false),
            read_timeout_ns: AtomicU64::new(timeout_ns(timeout)),
            peer,
        }
    }

    /// The id of the process at the other end, where the kernel vouches for it: the process
    /// that created or connected the other end (the socket's peer credentials, read when this
    /// channel was made), or the child [`spawn_with_channel`](crate::spawn_with_channel)
    /// started. `None` where it does not tell: both ends made in this process
    /// ([`Channel::pair`]), a process in a pid namespace this one does not see, or a peer that had
    /// hung up already. The crate's `peer` notes (on [`IpcChannel`](crate::IpcChannel), *Pools*)
    /// say what it is used for, and what it cannot tell.
    pub fn peer_process_id(&self) -> Option<u32> {
        self.peer.map(PeerId::pid)
    }

    /// The process at the other end, where the kernel vouches for it.
    pub(crate) fn peer(&self) -> Option<PeerId> {
        self.peer
    }

    /// Sets how long [`recv`](Self::recv) waits; `None` (the default) waits indefinitely. The
    /// time counts from the call to the message's last byte, however the peer spreads the bytes
    /// out.
    ///
    /// Running out is an [`IpcError::Timeout`] (its source has kind
    /// [`WouldBlock`](std::io::ErrorKind::WouldBlock)): before the first byte of a message it
    /// leaves the channel usable; in the middle of a message it breaks the channel (see the
    /// [`Channel`] docs, *Errors and peer input*).
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: the duration is zero, or the socket refuses the option.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        self.stream.set_read_timeout(timeout).map_err(|e| IpcError::io("setting the IPC channel's read timeout", e))?;
        self.read_timeout_ns.store(timeout_ns(timeout), Ordering::Release);
        Ok(())
    }

    /// Sets how long [`send`](Self::send) waits for room in the socket; `None` (the default)
    /// waits indefinitely.
    ///
    /// Running out is an [`IpcError::Timeout`]: before any byte of a message went out it leaves
    /// the channel usable; partway through a message it breaks the channel for sending.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: the duration is zero, or the socket refuses the option.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        self.stream.set_write_timeout(timeout).map_err(|e| IpcError::io("setting the IPC channel's write timeout", e))
    }

    /// Sends one message: `kind`, `payload` and duplicates of `fds` for the peer.
    ///
    /// Blocks until the whole frame is in the socket (the peer may need to receive for that, if
    /// the payload is larger than the socket's buffer). The caller's descriptors stay open and
    /// owned by the caller.
    ///
    /// # Errors
    ///
    /// - [`IpcError::MessageTooLarge`]: more than [`MAX_PAYLOAD_LEN`] bytes or more than
    ///   [`MAX_FDS`] descriptors; nothing was sent.
    /// - [`IpcError::PeerClosed`]: the peer's end is closed.
    /// - [`IpcError::Timeout`]: the write time-out ran out.
    /// - [`IpcError::Io`]: the system refused before anything went out (such as `ETOOMANYREFS`,
    ///   too many descriptors in flight); the channel is still usable.
    /// - [`IpcError::ChannelBroken`]: the system refused partway through the message, or an
    ///   earlier send broke the channel.
    pub fn send(&self, kind: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        check_limits(payload.len(), fds.len())?;
        let header = FrameHeader { kind, payload_len: payload.len(), fds: fds.len() }.encode();

        let _guard = lock(&self.send_lock);
        if self.send_broken.load(Ordering::Acquire) {
            return Err(IpcError::ChannelBroken {
                context: SEND_AFTER_BROKEN_CONTEXT,
                source: std::io::ErrorKind::BrokenPipe.into(),
            });
        }
        let result = self.send_frame(&header, payload, fds);
        if let Err((sent, _)) = &result
            && *sent > 0
        {
            self.send_broken.store(true, Ordering::Release);
        }
        result.map_err(|(sent, e)| send_error(sent, e))
    }

    /// Writes a whole frame; on failure, also says how many bytes went out.
    fn send_frame(
        &self,
        header: &[u8; FRAME_HEADER_LEN],
        payload: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> std::result::Result<(), (usize, SendFailure)> {
        let total = FRAME_HEADER_LEN + payload.len();
        let mut sent = 0;
        let mut space = [MaybeUninit::<u8>::uninit(); CONTROL_SPACE];
        while sent < total {
            let (first, second): (&[u8], &[u8]) = if sent < FRAME_HEADER_LEN {
                (&header[sent..], payload)
            } else {
                (&payload[sent - FRAME_HEADER_LEN..], &[])
            };
            let iov = [IoSlice::new(first), IoSlice::new(second)];
            let mut control = SendAncillaryBuffer::new(&mut space);
            // The descriptors ride on the frame's first bytes, and only on them.
            if sent == 0 && !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                // Unreachable: the buffer has room for MAX_FDS, checked above.
                return Err((
                    sent,
                    SendFailure::Error(IpcError::MessageTooLarge {
                        what: MessageLimit::FileDescriptors,
                        actual: fds.len(),
                        limit: MAX_FDS,
                    }),
                ));
            }
            match sendmsg(&self.stream, &iov, &mut control, SendFlags::NOSIGNAL) {
                Ok(0) => return Err((sent, SendFailure::System(std::io::ErrorKind::WriteZero.into()))),
                Ok(n) => sent += n,
                Err(Errno::INTR) => {}
                Err(Errno::PIPE | Errno::CONNRESET) => return Err((sent, SendFailure::Error(IpcError::PeerClosed))),
                Err(e) => return Err((sent, SendFailure::System(e.into()))),
            }
        }
        Ok(())
    }

    /// Receives the next message, blocking until it has arrived whole.
    ///
    /// # Errors
    ///
    /// - [`IpcError::PeerClosed`]: the peer closed its end, and every message it sent before
    ///   has been received.
    /// - [`IpcError::Protocol`] with [`ProtocolError::Frame`]: the peer sent a malformed frame
    ///   (a [`FrameError`](crate::wire::FrameError) says which check failed). Descriptors that came with it are closed.
    /// - [`IpcError::Protocol`] with [`ProtocolError::OutOfStep`]: an earlier such failure broke
    ///   the channel.
    /// - [`IpcError::OutOfDescriptors`]: this process had no free descriptor numbers for the
    ///   message's descriptors. The message was read to its end and dropped; the channel is
    ///   still usable.
    /// - [`IpcError::Timeout`]: the read time-out ran out (see [`Channel::set_read_timeout`]).
    /// - [`IpcError::Io`]: the system call failed before any byte of the message came in; the
    ///   channel is still usable.
    /// - [`IpcError::ChannelBroken`]: the system call failed partway through the message.
    pub fn recv(&self) -> Result<RawMessage> {
        self.recv_with_fd_room(MAX_FDS)
    }

    /// [`recv`](Self::recv) with a control buffer that has room for `fd_room` descriptors per
    /// `recvmsg` (at most [`MAX_FDS`]): fewer only in tests, to make the kernel truncate
    /// control data.
    fn recv_with_fd_room(&self, fd_room: usize) -> Result<RawMessage> {
        let _guard = lock(&self.recv_lock);
        if self.recv_broken.load(Ordering::Acquire) {
            return Err(ProtocolError::OutOfStep.into());
        }
        let timeout = self.read_timeout_ns.load(Ordering::Acquire);
        // A deadline past what `Instant` holds is none (`+` would panic there).
        let deadline = (timeout > 0).then(|| Instant::now().checked_add(Duration::from_nanos(timeout))).flatten();
        let mut assembly = FrameAssembly::new(fd_room);
        let result = loop {
            if let Err(e) = wait_readable(&self.stream, deadline, &assembly) {
                break Err(e);
            }
            match assembly.step(&self.stream) {
                Ok(Step::Done(message)) => break Ok(message),
                Ok(Step::More) => {}
                // The socket's own time-out, set behind the channel's back: a time-out too.
                Ok(Step::WouldBlock) => break Err(assembly.failed(Errno::AGAIN)),
                Err(e) => break Err(e),
            }
        };
        // Running out of descriptors is reported once the frame has been read to its end: the
        // stream is still in step. Any other failure after the frame's first byte is not.
        if let Err(e) = &result
            && assembly.consumed() > 0
            && !matches!(e, IpcError::OutOfDescriptors { .. })
        {
            self.recv_broken.store(true, Ordering::Release);
        }
        // On error, the assembly is dropped here: every descriptor received is closed.
        result
    }
}

/// Refuses a message of more than [`MAX_PAYLOAD_LEN`] bytes or [`MAX_FDS`] descriptors, before
/// anything of it is sent.
pub(crate) fn check_limits(payload_len: usize, fds: usize) -> Result<()> {
    if payload_len > MAX_PAYLOAD_LEN {
        return Err(IpcError::MessageTooLarge {
            what: MessageLimit::Payload,
            actual: payload_len,
            limit: MAX_PAYLOAD_LEN,
        });
    }
    if fds > MAX_FDS {
        return Err(IpcError::MessageTooLarge { what: MessageLimit::FileDescriptors, actual: fds, limit: MAX_FDS });
    }
    Ok(())
}

/// Why a send failed, before it is told whether the channel still goes on.
enum SendFailure {
    /// The error as it is.
    Error(IpcError),
    /// A system call's failure.
    System(std::io::Error),
}

/// The error of a send that failed after `sent` bytes of its frame went out: a time-out or a
/// system error breaks the channel once any byte went out.
fn send_error(sent: usize, failure: SendFailure) -> IpcError {
    match failure {
        SendFailure::Error(error) => error,
        SendFailure::System(source) if source.kind() == std::io::ErrorKind::WouldBlock => {
            IpcError::Timeout { operation: ChannelOperation::Send, channel_usable: sent == 0, source }
        }
        SendFailure::System(source) if sent == 0 => IpcError::Io { context: SEND_BEFORE_ANY_BYTE_CONTEXT, source },
        SendFailure::System(source) => IpcError::ChannelBroken { context: SEND_CONTEXT, source },
    }
}

/// Waits until `stream` has something to read, or fails as the socket's own time-out does
/// (`EAGAIN`, a time-out of `assembly`'s frame) once `deadline` has passed; without a deadline,
/// at once (the blocking `recvmsg` waits).
fn wait_readable(stream: &UnixStream, deadline: Option<Instant>, assembly: &FrameAssembly) -> Result<()> {
    let Some(deadline) = deadline else { return Ok(()) };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(assembly.failed(Errno::AGAIN));
        }
        let left = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(stream, PollFlags::IN)];
        match poll(&mut fds, Some(&left)) {
            // Readable, closed or failed: the `recvmsg` that follows says which.
            Ok(n) if n > 0 => return Ok(()),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(assembly.failed(e)),
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fds::{contents, memfd};
    use crate::wire::FrameError;
    use proptest::prelude::*;
    use std::fs::File;
    use std::io::{Read, Write};
    use std::os::unix::fs::FileExt;

    fn inode(fd: impl AsFd) -> (u64, u64) {
        let st = rustix::fs::fstat(fd).unwrap();
        (st.st_dev, st.st_ino)
    }

    /// A channel and the raw socket of its peer, to send arbitrary bytes.
    fn raw_pair() -> (Channel, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Channel::from_stream(a).unwrap(), b)
    }

    /// Sends `bytes` on a raw socket with `fds` attached.
    fn raw_send(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::uninit(); CONTROL_SPACE];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        let n = sendmsg(stream, &[IoSlice::new(bytes)], &mut control, SendFlags::empty()).unwrap();
        assert_eq!(n, bytes.len());
    }

    /// `n` sockets to send, and their peers, which see end-of-file once every copy of the sent
    /// end is closed.
    fn canaries(n: usize) -> (Vec<UnixStream>, Vec<UnixStream>) {
        (0..n).map(|_| UnixStream::pair().unwrap()).unzip()
    }

    fn all_closed(peers: &[UnixStream]) -> bool {
        peers.iter().all(|p| {
            p.set_nonblocking(true).unwrap();
            matches!((&*p).read(&mut [0u8; 1]), Ok(0))
        })
    }

    /// Time-outs on both ends, so that a failing test fails instead of hanging.
    fn no_hang(a: &Channel, b: &Channel) {
        for c in [a, b] {
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            c.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
        }
    }

    fn header(kind: u16, len: u32, fds: u32) -> Vec<u8> {
        FrameHeader { kind, payload_len: len as usize, fds: fds as usize }.encode().to_vec()
    }

    /// Expects the frame error `expected`.
    fn expect_frame(result: Result<RawMessage>, expected: FrameError) {
        match result {
            Err(IpcError::Protocol(ProtocolError::Frame(error))) => assert_eq!(error, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
    }

    /// Expects a refusal because an earlier frame broke the channel.
    fn expect_out_of_step(result: Result<RawMessage>) {
        match result {
            Err(error @ IpcError::Protocol(ProtocolError::OutOfStep)) => {
                assert!(error.to_string().contains("message boundaries are lost"), "{error}")
            }
            other => panic!("expected the channel out of step, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_without_fds() {
        let (a, b) = Channel::pair().unwrap();
        a.send(7, b"hello", &[]).unwrap();
        a.send(u16::MAX, b"", &[]).unwrap();
        let m = b.recv().unwrap();
        assert_eq!((m.kind, m.payload.as_slice(), m.fds.len()), (7, &b"hello"[..], 0));
        let m = b.recv().unwrap();
        assert_eq!((m.kind, m.payload.len(), m.fds.len()), (u16::MAX, 0, 0));
        // And the other way.
        b.send(1, b"back", &[]).unwrap();
        assert_eq!(a.recv().unwrap().payload, b"back");
    }

    #[test]
    fn round_trip_with_one_fd() {
        let (a, b) = Channel::pair().unwrap();
        let file = memfd(b"shared bytes");
        a.send(3, b"one", &[file.as_fd()]).unwrap();
        let m = b.recv().unwrap();
        assert_eq!(m.kind, 3);
        assert_eq!(m.fds.len(), 1);
        assert_eq!(inode(&m.fds[0]), inode(&file), "the same file");
        assert_ne!(
            std::os::fd::AsRawFd::as_raw_fd(&m.fds[0]),
            std::os::fd::AsRawFd::as_raw_fd(&file),
            "a new descriptor"
        );
        assert_eq!(contents(&m.fds[0]), b"shared bytes");
        // Writes through the received descriptor are seen through the original.
        File::from(m.fds[0].try_clone().unwrap()).write_all_at(b"SHARED", 0).unwrap();
        let mut buf = [0u8; 12];
        file.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"SHARED bytes");
        let flags = rustix::io::fcntl_getfd(&m.fds[0]).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC), "MSG_CMSG_CLOEXEC");
    }

    #[test]
    fn round_trip_with_100_fds() {
        let (a, b) = Channel::pair().unwrap();
        let files: Vec<File> = (0..100).map(|i| memfd(format!("file {i}").as_bytes())).collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        a.send(100, b"many", &fds).unwrap();
        let m = b.recv().unwrap();
        assert_eq!(m.fds.len(), 100);
        for (i, (fd, file)) in m.fds.iter().zip(&files).enumerate() {
            assert_eq!(contents(fd), format!("file {i}").as_bytes());
            assert_eq!(inode(fd), inode(file));
        }
    }

    #[test]
    fn fd_limit_is_enforced_on_send() {
        let (a, b) = Channel::pair().unwrap();
        let file = memfd(b"x");
        let at_limit = vec![file.as_fd(); MAX_FDS];
        a.send(1, b"", &at_limit).unwrap();
        assert_eq!(b.recv().unwrap().fds.len(), MAX_FDS);

        let over = vec![file.as_fd(); MAX_FDS + 1];
        match a.send(2, b"", &over) {
            Err(IpcError::MessageTooLarge { actual: 254, limit: 253, .. }) => {}
            other => panic!("expected MessageTooLarge, got {other:?}"),
        }
        // Nothing was sent and the channel still works.
        a.send(3, b"after", &[]).unwrap();
        let m = b.recv().unwrap();
        assert_eq!((m.kind, m.payload.as_slice()), (3, &b"after"[..]));
    }

    #[test]
    fn payload_limit_is_enforced_on_send_and_large_payloads_arrive_whole() {
        let (a, b) = Channel::pair().unwrap();
        no_hang(&a, &b);
        let big: Vec<u8> = (0..MAX_PAYLOAD_LEN).map(|i| (i % 251) as u8).collect();
        std::thread::scope(|s| {
            s.spawn(|| a.send(9, &big, &[]).unwrap());
            let m = b.recv().unwrap();
            assert_eq!(m.kind, 9);
            assert!(m.payload == big, "the payload arrived intact");
        });
        let over = vec![0u8; MAX_PAYLOAD_LEN + 1];
        assert!(matches!(a.send(1, &over, &[]), Err(IpcError::MessageTooLarge { what: MessageLimit::Payload, .. })));
        a.send(2, b"still fine", &[]).unwrap();
        assert_eq!(b.recv().unwrap().payload, b"still fine");
    }

    #[test]
    fn peer_closing_between_messages_is_peer_closed() {
        let (a, b) = Channel::pair().unwrap();
        a.send(1, b"last", &[]).unwrap();
        drop(a);
        assert_eq!(b.recv().unwrap().payload, b"last");
        assert!(matches!(b.recv(), Err(IpcError::PeerClosed)));
        assert!(matches!(b.recv(), Err(IpcError::PeerClosed)));
    }

    #[test]
    fn sending_to_a_closed_peer_is_peer_closed() {
        let (a, b) = Channel::pair().unwrap();
        drop(b);
        // No SIGPIPE: the test process survives.
        assert!(matches!(a.send(1, b"anyone?", &[]), Err(IpcError::PeerClosed)));
    }

    #[test]
    fn garbage_is_a_protocol_error_and_breaks_the_channel() {
        let (ch, mut raw) = raw_pair();
        raw.write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n").unwrap();
        let error = ch.recv().unwrap_err();
        assert!(matches!(error, IpcError::Protocol(ProtocolError::Frame(FrameError::Magic { found: _ }))));
        assert!(error.to_string().contains("expected b\"CUMEMMSG\""), "{error}");
        // The stream is out of step: later receives are refused, even of a good frame.
        raw.write_all(&header(1, 0, 0)).unwrap();
        expect_out_of_step(ch.recv());
    }

    #[test]
    fn truncated_frames_are_protocol_errors() {
        let (ch, mut raw) = raw_pair();
        raw.write_all(&header(1, 0, 0)[..10]).unwrap();
        drop(raw);
        expect_frame(ch.recv(), FrameError::TruncatedHeader { received: 10, len: 24 });

        let (ch, mut raw) = raw_pair();
        raw.write_all(&header(1, 100, 0)).unwrap();
        raw.write_all(&[0xAB; 10]).unwrap();
        drop(raw);
        expect_frame(ch.recv(), FrameError::Truncated { received: 34, len: 124 });
    }

    #[test]
    fn bad_headers_are_protocol_errors() {
        let mut bad_version = header(1, 0, 0);
        bad_version[8] = 2;
        let mut bad_reserved = header(1, 0, 0);
        bad_reserved[23] = 1;
        let cases = [
            (bad_version, FrameError::UnsupportedVersion { found: 2, supported: 1 }),
            (bad_reserved, FrameError::Reserved { found: 0x0100_0000 }),
            (
                header(1, MAX_PAYLOAD_LEN as u32 + 1, 0),
                FrameError::PayloadTooLarge { len: MAX_PAYLOAD_LEN + 1, max: MAX_PAYLOAD_LEN },
            ),
            (header(1, u32::MAX, 0), FrameError::PayloadTooLarge { len: u32::MAX as usize, max: MAX_PAYLOAD_LEN }),
            (header(1, 0, 254), FrameError::TooManyFds { count: 254, max: MAX_FDS }),
        ];
        for (bytes, expected) in cases {
            let (ch, mut raw) = raw_pair();
            raw.write_all(&bytes).unwrap();
            expect_frame(ch.recv(), expected);
        }
    }

    #[test]
    fn fds_on_a_bad_frame_are_closed() {
        let (ch, raw) = raw_pair();
        let (send, peers) = canaries(3);
        let fds: Vec<BorrowedFd<'_>> = send.iter().map(|s| s.as_fd()).collect();
        raw_send(&raw, b"garbage garbage garbage garbage", &fds);
        drop(send);
        assert!(!all_closed(&peers), "in flight, still open");
        expect_frame(ch.recv(), FrameError::Magic { found: *b"garbage " });
        assert!(all_closed(&peers), "the received descriptors were closed");
    }

    #[test]
    fn fd_count_must_match_the_header() {
        // More descriptors than announced: rejected as soon as the header is read.
        let (ch, raw) = raw_pair();
        let (send, peers) = canaries(2);
        let fds: Vec<BorrowedFd<'_>> = send.iter().map(|s| s.as_fd()).collect();
        let mut frame = header(1, 4, 1);
        frame.extend_from_slice(b"data");
        raw_send(&raw, &frame, &fds);
        drop(send);
        expect_frame(ch.recv(), FrameError::FdCount { announced: 1, arrived: 2 });
        assert!(all_closed(&peers));

        // Fewer than announced.
        let (ch, raw) = raw_pair();
        let (send, peers) = canaries(1);
        let mut frame = header(1, 4, 3);
        frame.extend_from_slice(b"data");
        raw_send(&raw, &frame, &[send[0].as_fd()]);
        drop(send);
        expect_frame(ch.recv(), FrameError::FdCount { announced: 3, arrived: 1 });
        assert!(all_closed(&peers));

        // None announced, one attached.
        let (ch, raw) = raw_pair();
        let (send, peers) = canaries(1);
        raw_send(&raw, &header(1, 0, 0), &[send[0].as_fd()]);
        drop(send);
        expect_frame(ch.recv(), FrameError::FdCount { announced: 0, arrived: 1 });
        assert!(all_closed(&peers));
    }

    fn is_closed(peer: &UnixStream) -> bool {
        all_closed(std::slice::from_ref(peer))
    }

    /// Bytes sent to `ch` that it has not read yet.
    fn unread(ch: &Channel) -> u64 {
        rustix::io::ioctl_fionread(ch).unwrap()
    }

    #[test]
    fn fds_beyond_the_announced_count_are_refused_as_they_arrive() {
        // The header announces 2 descriptors and brings them; then the payload arrives one byte
        // at a time, each byte with 3 more descriptors (each piece a separate `recvmsg`).
        const PIECES: usize = 40;
        let (ch, raw) = raw_pair();
        let (announced, announced_peers) = canaries(2);
        let (extra, extra_peers) = canaries(PIECES);
        raw_send(&raw, &header(1, PIECES as u32, 2), &[announced[0].as_fd(), announced[1].as_fd()]);
        for socket in &extra {
            let fd = socket.as_fd();
            raw_send(&raw, b"x", &[fd, fd, fd]);
        }
        drop((announced, extra));
        // Refused at the first piece beyond the count: 2 + 3, not 2 + 3 * 40.
        expect_frame(ch.recv(), FrameError::FdCount { announced: 2, arrived: 5 });
        assert!(all_closed(&announced_peers), "what arrived is closed");
        assert!(is_closed(&extra_peers[0]), "the piece that went over is closed");
        // The receiver stopped there: the other pieces, and their descriptors, were never taken.
        assert_eq!(unread(&ch), PIECES as u64 - 1);
        assert!(extra_peers[1..].iter().all(|p| !is_closed(p)), "still in flight, not received");
        expect_out_of_step(ch.recv());
        // Dropping the channel releases what is still in flight.
        drop(ch);
        assert!(all_closed(&extra_peers));
    }

    #[test]
    fn fds_before_the_header_is_complete_are_limited_to_max_fds() {
        // The header one byte at a time, 200 descriptors on each byte: the count is unknown
        // until the header is whole, so the limit is MAX_FDS (253), passed on the second byte.
        let (ch, raw) = raw_pair();
        let (send, peers) = canaries(FRAME_HEADER_LEN);
        for (byte, socket) in header(1, 0, 0).iter().zip(&send) {
            raw_send(&raw, std::slice::from_ref(byte), &vec![socket.as_fd(); 200]);
        }
        drop(send);
        expect_frame(ch.recv(), FrameError::FdsBeforeHeader { arrived: 400, max: MAX_FDS });
        assert!(all_closed(&peers[..2]));
        assert_eq!(unread(&ch), FRAME_HEADER_LEN as u64 - 2);
        assert!(peers[2..].iter().all(|p| !is_closed(p)), "still in flight, not received");
        drop(ch);
        assert!(all_closed(&peers));
    }

    #[test]
    fn fds_may_arrive_anywhere_within_their_frame() {
        // A peer that sends the header, then the payload with the descriptor attached.
        let (ch, raw) = raw_pair();
        let file = memfd(b"late");
        (&raw).write_all(&header(5, 3, 1)).unwrap();
        raw_send(&raw, b"abc", &[file.as_fd()]);
        let m = ch.recv().unwrap();
        assert_eq!((m.kind, m.payload.as_slice()), (5, &b"abc"[..]));
        assert_eq!(contents(&m.fds[0]), b"late");
    }

    #[test]
    fn truncated_control_data_is_a_protocol_error_and_closes_what_arrived() {
        let (a, b) = Channel::pair().unwrap();
        let (send, peers) = canaries(5);
        let fds: Vec<BorrowedFd<'_>> = send.iter().map(|s| s.as_fd()).collect();
        a.send(1, b"five", &fds).unwrap();
        drop(fds);
        drop(send);
        // Room for one descriptor only: the kernel truncates and sets MSG_CTRUNC.
        expect_frame(b.recv_with_fd_room(1), FrameError::ControlDataTruncated { max: MAX_FDS });
        assert!(all_closed(&peers), "none of the five leaked");
        // Part of the frame was consumed: the channel is out of step.
        expect_out_of_step(b.recv());
    }

    /// A time-out, as [`Channel::recv`] or [`Channel::send`] reports it: its own variant, which
    /// says whether the channel goes on, in its flag, [`IpcError::channel_usable`] and its text.
    fn expect_timeout<T: std::fmt::Debug>(
        result: Result<T>,
        expected: ChannelOperation,
        usable: bool,
    ) -> std::io::ErrorKind {
        let error = result.unwrap_err();
        let IpcError::Timeout { operation, channel_usable, source } = &error else {
            panic!("expected a time-out, got {error:?}")
        };
        assert_eq!((*operation, *channel_usable, error.channel_usable()), (expected, usable, usable), "{error}");
        let text = error.to_string();
        assert!(text.contains("timed out"), "{text}");
        assert!(!text.contains("os error 11"), "not the system's words for EAGAIN: {text}");
        let advice = if usable { crate::error::CHANNEL_USABLE } else { crate::error::CHANNEL_BROKEN };
        assert!(text.ends_with(advice), "{text}");
        source.kind()
    }

    #[test]
    fn read_timeout_between_messages_leaves_the_channel_usable() {
        let (a, b) = Channel::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let kind = expect_timeout(b.recv(), ChannelOperation::Receive, true);
        assert_eq!(kind, std::io::ErrorKind::WouldBlock);
        a.send(4, b"late", &[]).unwrap();
        assert_eq!(b.recv().unwrap().payload, b"late");
    }

    /// A time-out set on the socket directly (not through the channel) is a time-out too.
    #[test]
    fn a_socket_time_out_set_behind_the_channels_back_is_a_time_out() {
        let (a, b) = Channel::pair().unwrap();
        rustix::net::sockopt::set_socket_timeout(
            &b,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_millis(20)),
        )
        .unwrap();
        expect_timeout(b.recv(), ChannelOperation::Receive, true);
        a.send(4, b"on", &[]).unwrap();
        assert_eq!(b.recv().unwrap().payload, b"on");
    }

    /// A time-out too long for a deadline is no deadline: the message arrives.
    #[test]
    fn the_longest_read_timeout_waits_for_the_message() {
        let (a, b) = Channel::pair().unwrap();
        b.set_read_timeout(Some(Duration::MAX)).unwrap();
        a.send(4, b"soon", &[]).unwrap();
        assert_eq!(b.recv().unwrap().payload, b"soon");
    }

    #[test]
    fn read_timeout_inside_a_frame_breaks_the_channel() {
        let (ch, mut raw) = raw_pair();
        ch.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        raw.write_all(&header(1, 10, 0)).unwrap();
        expect_timeout(ch.recv(), ChannelOperation::Receive, false);
        raw.write_all(&[0; 10]).unwrap();
        expect_out_of_step(ch.recv());
    }

    /// A peer that sends a byte every 25 ms: each read finds a byte well within the 150 ms
    /// time-out, and the 64-byte frame would take 1.6 s. The time-out is the message's: it ends
    /// inside the frame, which breaks the channel. Set on the channel, or on the socket before
    /// the channel took it.
    fn a_trickled_message_times_out(set_on_socket: bool) {
        let timeout = Duration::from_millis(150);
        let (ours, raw) = UnixStream::pair().unwrap();
        if set_on_socket {
            ours.set_read_timeout(Some(timeout)).unwrap();
        }
        let ch = Channel::from_stream(ours).unwrap();
        if !set_on_socket {
            ch.set_read_timeout(Some(timeout)).unwrap();
        }
        let mut frame = header(3, 40, 0);
        frame.extend_from_slice(&[0xAB; 40]);
        let trickle = std::thread::spawn(move || {
            let mut raw = raw;
            for byte in frame {
                // Stops once the receiver has gone (EPIPE).
                if raw.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        assert_eq!(expect_timeout(ch.recv(), ChannelOperation::Receive, false), std::io::ErrorKind::WouldBlock);
        expect_out_of_step(ch.recv());
        drop(ch);
        trickle.join().unwrap();
    }

    #[test]
    fn read_timeout_bounds_a_whole_message_however_slowly_it_comes() {
        a_trickled_message_times_out(false);
    }

    #[test]
    fn a_read_timeout_set_on_the_socket_before_bounds_the_whole_message_too() {
        a_trickled_message_times_out(true);
    }

    #[test]
    fn write_timeouts_before_and_inside_a_frame() {
        let (a, b) = Channel::pair().unwrap();
        a.set_write_timeout(Some(Duration::from_millis(20))).unwrap();
        // Fill the socket until a send cannot start: a clean time-out, nothing sent.
        let chunk = vec![0u8; 64 << 10];
        let mut sent = 0usize;
        let error = loop {
            match a.send(1, &chunk, &[]) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 10_000, "the socket never filled");
        };
        let IpcError::Timeout { operation: ChannelOperation::Send, channel_usable, .. } = error else {
            panic!("expected a time-out, got {error:?}")
        };
        assert!(error.to_string().contains("sending a message on the IPC channel timed out"), "{error}");
        // The receiver sees every whole message.
        b.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        for _ in 0..sent {
            assert_eq!(b.recv().unwrap().payload.len(), chunk.len());
        }
        // Whether the time-out struck before the frame's first byte or partway through it, the
        // two ends agree about it.
        let after = a.send(2, b"after", &[]);
        let next = b.recv();
        match after {
            // Nothing of the timed-out message went out: the channel is intact.
            Ok(()) => {
                assert!(channel_usable, "the time-out said the channel goes on");
                assert_eq!(next.unwrap().payload, b"after");
            }
            // Part of it went out: sending is refused, the receiver is stuck inside a frame.
            Err(error @ IpcError::ChannelBroken { .. }) => {
                assert!(!channel_usable && !error.channel_usable(), "{error}");
                assert!(error.to_string().ends_with(crate::error::CHANNEL_BROKEN), "{error}");
                let IpcError::ChannelBroken { source, .. } = &error else { unreachable!() };
                assert_eq!(source.kind(), std::io::ErrorKind::BrokenPipe);
                expect_timeout(next, ChannelOperation::Receive, false);
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn concurrent_senders_never_interleave_frames() {
        const SENDERS: u16 = 8;
        const EACH: usize = 50;
        let (a, b) = Channel::pair().unwrap();
        no_hang(&a, &b);
        let file = memfd(b"f");
        std::thread::scope(|s| {
            for sender in 0..SENDERS {
                let a = &a;
                let file = &file;
                s.spawn(move || {
                    for i in 0..EACH {
                        // Sizes up to 300 KB, beyond the socket buffer, force partial writes.
                        let len = (i * 7919 + usize::from(sender) * 104_729) % 300_000;
                        let payload = vec![sender as u8; len];
                        let fds = vec![file.as_fd(); i % 3];
                        a.send(sender, &payload, &fds).unwrap();
                    }
                });
            }
            let mut counts = [0usize; SENDERS as usize];
            for _ in 0..usize::from(SENDERS) * EACH {
                let m = b.recv().unwrap();
                let sender = usize::from(m.kind);
                let i = counts[sender];
                let len = (i * 7919 + sender * 104_729) % 300_000;
                assert_eq!(m.payload.len(), len, "sender {sender} message {i}");
                assert!(m.payload.iter().all(|&x| x == sender as u8));
                assert_eq!(m.fds.len(), i % 3);
                counts[sender] += 1;
            }
            assert!(counts.iter().all(|&c| c == EACH));
        });
    }

    #[test]
    fn concurrent_receivers_each_get_whole_messages() {
        let (a, b) = Channel::pair().unwrap();
        no_hang(&a, &b);
        const TOTAL: usize = 400;
        let received = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let receivers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut seen = Vec::new();
                        loop {
                            match b.recv() {
                                Ok(m) => {
                                    let n = u32::from_le_bytes(m.payload[..4].try_into().unwrap());
                                    assert_eq!(m.payload.len(), 4 + (n as usize % 5000));
                                    assert!(m.payload[4..].iter().all(|&x| x == n as u8));
                                    received.fetch_add(1, Ordering::Relaxed);
                                    seen.push(n);
                                }
                                Err(IpcError::PeerClosed) => return seen,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    })
                })
                .collect();
            for n in 0..TOTAL as u32 {
                let mut payload = n.to_le_bytes().to_vec();
                payload.resize(4 + (n as usize % 5000), n as u8);
                a.send(0, &payload, &[]).unwrap();
            }
            drop(a);
            let mut all: Vec<u32> = receivers.into_iter().flat_map(|r| r.join().unwrap()).collect();
            all.sort_unstable();
            assert_eq!(all, (0..TOTAL as u32).collect::<Vec<_>>());
        });
        assert_eq!(received.into_inner(), TOTAL);
    }

    #[test]
    fn listener_and_connect() {
        use crate::ChannelListener;
        let path = std::env::temp_dir().join(format!("cuda-mem-ipc-{}.sock", uuid::Uuid::new_v4()));
        let listener = ChannelListener::bind(&path).unwrap();
        assert!(matches!(
            ChannelListener::bind(&path),
            Err(IpcError::Io { context, .. }) if context.contains("binding")
        ));
        std::thread::scope(|s| {
            s.spawn(|| {
                let c = Channel::connect(&path).unwrap();
                let file = memfd(b"via path");
                c.send(11, b"hi", &[file.as_fd()]).unwrap();
                assert_eq!(c.recv().unwrap().kind, 12);
            });
            let server = listener.accept().unwrap();
            let m = server.recv().unwrap();
            assert_eq!((m.kind, m.payload.as_slice()), (11, &b"hi"[..]));
            assert_eq!(contents(&m.fds[0]), b"via path");
            server.send(12, b"", &[]).unwrap();
        });
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            Channel::connect(&path),
            Err(IpcError::Io { context, .. }) if context.contains("connecting")
        ));
    }

    #[test]
    fn channels_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Channel>();
        check::<crate::ChannelListener>();
        check::<RawMessage>();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever bytes a peer sends, then closes: errors, never a panic, never a hang.
        #[test]
        fn arbitrary_peer_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let (ch, mut raw) = raw_pair();
            raw.write_all(&bytes).unwrap();
            drop(raw);
            let mut messages = 0;
            loop {
                match ch.recv() {
                    Ok(_) => messages += 1,
                    Err(IpcError::PeerClosed) => { prop_assert!(bytes.is_empty() || messages > 0); break }
                    Err(IpcError::Protocol(_)) => { prop_assert!(!bytes.is_empty()); break }
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
                prop_assert!(messages <= bytes.len() / FRAME_HEADER_LEN);
            }
        }

        /// A valid frame with one byte of its header changed: a result or an error, no panic.
        #[test]
        fn mutated_headers_never_panic(
            at in 0..FRAME_HEADER_LEN,
            xor in 1..=255u8,
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let (ch, mut raw) = raw_pair();
            let mut frame = header(2, payload.len() as u32, 0);
            frame[at] ^= xor;
            frame.extend_from_slice(&payload);
            raw.write_all(&frame).unwrap();
            drop(raw);
            let result = ch.recv();
            match at {
                // The kind: still a valid frame.
                10 | 11 => prop_assert!(result.is_ok()),
                // The payload length: a shorter frame, or a truncated one.
                12..=15 => {}
                _ => prop_assert!(matches!(result, Err(IpcError::Protocol(_)))),
            }
        }
    }
}
