//! `AsyncChannel` (feature `tokio`): the frames of a [`Channel`] on Tokio's readiness
//! (`AsyncFd`), for servers that must not block a thread per peer. What is cancelled loses
//! nothing: a receive's bytes and descriptors wait in the channel for the next receive, and a
//! send either went out whole or not at all (a frame it began is finished by the next send, or
//! [`AsyncChannel::flush`]).

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use rustix::io::Errno;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
use tokio::io::unix::AsyncFd;

use crate::assembly::RawMessage;
use crate::assembly::{CONTROL_SPACE, FrameAssembly, RECV_BEFORE_ANY_BYTE_CONTEXT, Step};
use crate::channel::{Channel, SEND_AFTER_BROKEN_CONTEXT, SEND_BEFORE_ANY_BYTE_CONTEXT, SEND_CONTEXT, check_limits};
use crate::error::{IpcError, ProtocolError, Result};
use crate::listener::{PeerCredentials, PeerPolicy};
use crate::peer::PeerId;
use crate::wire::{FRAME_HEADER_LEN, FrameHeader, MAX_FDS};

/// A [`Channel`]'s frames, sent and received without blocking a thread: `recv` and `send` are
/// futures of Tokio's runtime (they need one with I/O enabled), on the same wire as the
/// blocking channel, so either end may be either kind (or Python's `cuda_mem_exchange`).
///
/// # Cancellation
///
/// - A [`recv`](AsyncChannel::recv) dropped before it returns loses nothing: the bytes and
///   descriptors of the frame it was reading stay in the channel, and the next `recv` goes on
///   from there. No descriptor is leaked or lost.
/// - A [`send`](AsyncChannel::send) dropped before it returns sent its frame whole or not at
///   all, as the peer sees it: nothing went out, or the rest of the frame goes out first at
///   the next `send` (or [`flush`](AsyncChannel::flush)), before any other frame. Its
///   descriptors went with its first bytes.
///
/// # Backpressure
///
/// A send waits (without blocking a thread) while the peer does not read: the socket's buffer
/// bounds what is in flight.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), cuda_mem_ipc::IpcError> {
/// use cuda_mem_ipc::AsyncChannel;
///
/// let (server, worker) = AsyncChannel::pair()?;
/// let serving = tokio::spawn(async move {
///     let request = server.recv().await?;
///     server.send(request.kind, b"block 7", &[]).await
/// });
/// worker.send(2, b"a block, please", &[]).await?;
/// assert_eq!(worker.recv().await?.payload, b"block 7");
/// serving.await.expect("the server task")?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct AsyncChannel {
    io: AsyncFd<UnixStream>,
    receiving: tokio::sync::Mutex<Receiving>,
    sending: tokio::sync::Mutex<Sending>,
    /// The process at the other end, where the kernel vouches for it.
    peer: Option<PeerId>,
    /// How many frames have had their first bytes sent: a frame counted here reaches the peer
    /// whole, or the channel breaks (a cancelled send's caller tells so whether it went).
    frames_begun: std::sync::atomic::AtomicU64,
}

/// What receiving left in the channel.
#[derive(Debug, Default)]
struct Receiving {
    /// The frame being read, when a receive was dropped in the middle of it.
    assembly: Option<FrameAssembly>,
    /// A receive failed partway through a frame: message boundaries are lost.
    broken: bool,
}

/// What sending left in the channel.
#[derive(Debug, Default)]
struct Sending {
    /// The bytes of a frame a dropped send began and did not finish: they go out first.
    rest: Vec<u8>,
    /// A send failed partway through a frame.
    broken: bool,
}

impl AsyncChannel {
    /// The channel `channel` is, without blocking: its socket is made non-blocking and registered
    /// with the current Tokio runtime.
    ///
    /// # Errors
    /// [`IpcError::Io`]: the socket cannot be made non-blocking or registered (no runtime, or
    /// one without I/O).
    pub fn new(channel: Channel) -> Result<AsyncChannel> {
        let (stream, peer) = channel.into_parts();
        stream.set_nonblocking(true).map_err(|e| IpcError::io("making the IPC socket non-blocking", e))?;
        // Registering outside a runtime would panic: refused here instead.
        tokio::runtime::Handle::try_current().map_err(|e| IpcError::io(NO_RUNTIME, std::io::Error::other(e)))?;
        // SAFETY: the descriptor is the stream's own, open while the stream lives, and the
        // stream is owned by the `AsyncFd` (never handed out mutably), so it stays the same
        // open socket for the registration's whole life.
        let io = unsafe { AsyncFd::register(stream) }
            .map_err(|e| IpcError::io("registering the IPC socket with the runtime", e.into_parts().1))?;
        Ok(AsyncChannel {
            io,
            receiving: Default::default(),
            sending: Default::default(),
            peer,
            frames_begun: Default::default(),
        })
    }

    /// Two connected channels in this process (as [`Channel::pair`]).
    ///
    /// # Errors
    /// As [`Channel::pair`] and [`AsyncChannel::new`].
    pub fn pair() -> Result<(AsyncChannel, AsyncChannel)> {
        let (a, b) = Channel::pair()?;
        Ok((AsyncChannel::new(a)?, AsyncChannel::new(b)?))
    }

    /// Connects to a [`ChannelListener`](crate::ChannelListener) (or an
    /// [`AsyncChannelListener`]) at `name` in Linux's abstract namespace.
    ///
    /// # Errors
    /// As [`Channel::connect_abstract`] and [`AsyncChannel::new`].
    pub fn connect_abstract(name: impl AsRef<[u8]>) -> Result<AsyncChannel> {
        AsyncChannel::new(Channel::connect_abstract(name)?)
    }

    /// Connects to a listener at the socket path `path`.
    ///
    /// # Errors
    /// As [`Channel::connect`] and [`AsyncChannel::new`].
    pub fn connect(path: impl AsRef<std::path::Path>) -> Result<AsyncChannel> {
        AsyncChannel::new(Channel::connect(path)?)
    }

    /// The peer's credentials, as the kernel recorded them when the connection was made.
    pub fn peer_credentials(&self) -> Option<PeerCredentials> {
        PeerCredentials::of(self.io.get_ref().as_fd())
    }

    /// The process at the other end, where the kernel vouches for it.
    pub(crate) fn peer(&self) -> Option<PeerId> {
        self.peer
    }

    /// How many frames have had their first bytes sent (see `frames_begun`).
    pub(crate) fn frames_begun(&self) -> u64 {
        self.frames_begun.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The peer's process id, where the kernel vouches for it (as [`Channel::peer_process_id`]).
    pub fn peer_process_id(&self) -> Option<u32> {
        self.peer.map(PeerId::pid)
    }

    /// Receives the next message, whole. Cancellation-safe (see the type's documentation).
    ///
    /// # Errors
    /// As [`Channel::recv`], less the time-outs: bound a receive with `tokio::time::timeout`,
    /// which cancels it safely.
    pub async fn recv(&self) -> Result<RawMessage> {
        let mut side = self.receiving.lock().await;
        if side.broken {
            return Err(ProtocolError::OutOfStep.into());
        }
        loop {
            let mut ready = self.io.readable().await.map_err(|e| IpcError::io(RECV_BEFORE_ANY_BYTE_CONTEXT, e))?;
            let assembly = side.assembly.get_or_insert_with(|| FrameAssembly::new(MAX_FDS));
            match assembly.step(self.io.get_ref()) {
                Ok(Step::More) => {}
                Ok(Step::WouldBlock) => ready.clear_ready(),
                Ok(Step::Done(message)) => {
                    side.assembly = None;
                    return Ok(message);
                }
                Err(error) => {
                    // As the blocking channel: out of descriptors, the frame was read to its
                    // end; any other failure after its first byte breaks the stream's step.
                    side.broken = assembly.consumed() > 0 && !matches!(error, IpcError::OutOfDescriptors { .. });
                    // Dropped: every descriptor of the frame is closed.
                    side.assembly = None;
                    return Err(error);
                }
            }
        }
    }

    /// Sends a message: `kind`, `payload` and `fds` (duplicated into the peer). Waits while the
    /// peer does not read. Cancellation-safe (see the type's documentation).
    ///
    /// # Errors
    /// As [`Channel::send`], less the time-outs.
    pub async fn send(&self, kind: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        check_limits(payload.len(), fds.len())?;
        let header = FrameHeader { kind, payload_len: payload.len(), fds: fds.len() }.encode();
        let mut side = self.sending.lock().await;
        self.finish_started(&mut side).await?;
        let mut frame = Outgoing { side: &mut side, header, payload, sent: 0 };
        loop {
            let mut ready = self.io.writable().await.map_err(|e| frame.failed(errno_of(&e)))?;
            let first = frame.sent == 0;
            let written = frame.write_some(self.io.get_ref(), fds);
            if first && frame.sent > 0 {
                self.frames_begun.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            match written {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(Errno::AGAIN) => ready.clear_ready(),
                Err(errno) => return Err(frame.failed(errno)),
            }
        }
    }

    /// Sends the rest of a frame that a dropped [`send`](AsyncChannel::send) began, if any: a
    /// peer waiting for that frame gets it now rather than at the next send.
    ///
    /// # Errors
    /// As [`send`](AsyncChannel::send).
    pub async fn flush(&self) -> Result<()> {
        let mut side = self.sending.lock().await;
        self.finish_started(&mut side).await
    }

    /// Writes what a dropped send left of its frame.
    async fn finish_started(&self, side: &mut Sending) -> Result<()> {
        if side.broken {
            return Err(IpcError::ChannelBroken {
                context: SEND_AFTER_BROKEN_CONTEXT,
                source: std::io::ErrorKind::BrokenPipe.into(),
            });
        }
        while !side.rest.is_empty() {
            let mut ready = self.io.writable().await.map_err(|e| broken(side, errno_of(&e)))?;
            match sendmsg(self.io.get_ref(), &[std::io::IoSlice::new(&side.rest)], &mut Default::default(), FLAGS) {
                Ok(0) => return Err(broken(side, Errno::PIPE)),
                Ok(n) => drop(side.rest.drain(..n.min(side.rest.len()))),
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => ready.clear_ready(),
                Err(errno) => return Err(broken(side, errno)),
            }
        }
        Ok(())
    }
}

/// What registering with no current runtime says.
const NO_RUNTIME: &str = "registering the IPC socket: no Tokio runtime is current (create the channel inside one)";

/// `sendmsg`'s flags: no `SIGPIPE` (a closed peer is an error), never blocking.
const FLAGS: SendFlags = SendFlags::NOSIGNAL.union(SendFlags::DONTWAIT);

/// The `errno` of an I/O error (`EIO` for one without).
fn errno_of(error: &std::io::Error) -> Errno {
    error.raw_os_error().map_or(Errno::IO, Errno::from_raw_os_error)
}

/// The channel's sends are broken by `errno` partway through a frame.
fn broken(side: &mut Sending, errno: Errno) -> IpcError {
    side.broken = true;
    side.rest.clear();
    partway(errno)
}

/// The error of a send that failed after part of its frame went out.
fn partway(errno: Errno) -> IpcError {
    match errno {
        Errno::PIPE | Errno::CONNRESET => IpcError::PeerClosed,
        errno => IpcError::ChannelBroken { context: SEND_CONTEXT, source: errno.into() },
    }
}

/// A frame on its way out. Dropped before it is done (a cancelled send) after some of it went
/// out, it leaves the rest for the channel's next send.
struct Outgoing<'a> {
    side: &'a mut Sending,
    header: [u8; FRAME_HEADER_LEN],
    payload: &'a [u8],
    /// Bytes of the frame written; `usize::MAX` once done or failed.
    sent: usize,
}

impl Outgoing<'_> {
    fn len(&self) -> usize {
        FRAME_HEADER_LEN + self.payload.len()
    }

    /// One `sendmsg` of what is left (with `fds` on the first bytes): whether the frame is out.
    fn write_some(&mut self, stream: &UnixStream, fds: &[BorrowedFd<'_>]) -> std::result::Result<bool, Errno> {
        let (first, second): (&[u8], &[u8]) = if self.sent < FRAME_HEADER_LEN {
            (&self.header[self.sent..], self.payload)
        } else {
            (&self.payload[self.sent - FRAME_HEADER_LEN..], &[])
        };
        let iov = [std::io::IoSlice::new(first), std::io::IoSlice::new(second)];
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); CONTROL_SPACE];
        let mut control = SendAncillaryBuffer::new(&mut space);
        // Room for MAX_FDS, checked before: `push` cannot fail.
        if self.sent == 0 && !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(Errno::TOOMANYREFS);
        }
        match sendmsg(stream, &iov, &mut control, FLAGS) {
            Ok(0) => Err(Errno::PIPE),
            Ok(n) => {
                self.sent += n;
                let done = self.sent >= self.len();
                if done {
                    self.sent = usize::MAX;
                }
                Ok(done)
            }
            Err(Errno::INTR) => Ok(false),
            Err(errno) => Err(errno),
        }
    }

    /// The send's error: before any byte, the channel goes on; after, it is broken.
    fn failed(&mut self, errno: Errno) -> IpcError {
        let sent = std::mem::replace(&mut self.sent, usize::MAX);
        if sent == 0 {
            match errno {
                Errno::PIPE | Errno::CONNRESET => IpcError::PeerClosed,
                errno => IpcError::Io { context: SEND_BEFORE_ANY_BYTE_CONTEXT, source: errno.into() },
            }
        } else {
            broken(self.side, errno)
        }
    }
}

impl Drop for Outgoing<'_> {
    fn drop(&mut self) {
        // Cancelled after some of the frame went out: the rest goes first next time.
        if self.sent > 0 && self.sent != usize::MAX {
            let mut rest = Vec::with_capacity(self.len() - self.sent);
            if self.sent < FRAME_HEADER_LEN {
                rest.extend_from_slice(&self.header[self.sent..]);
                rest.extend_from_slice(self.payload);
            } else {
                rest.extend_from_slice(&self.payload[self.sent - FRAME_HEADER_LEN..]);
            }
            self.side.rest = rest;
        }
    }
}

/// A [`ChannelListener`](crate::ChannelListener) whose `accept` is a future: workers connect
/// by socket path or abstract name, each admitted by the [`PeerPolicy`] (the same user by
/// default) and served as an [`AsyncChannel`].
#[derive(Debug)]
pub struct AsyncChannelListener {
    listener: tokio::net::UnixListener,
    policy: PeerPolicy,
}

impl AsyncChannelListener {
    /// Listens at `name` in Linux's abstract namespace (as
    /// [`ChannelListener::bind_abstract`](crate::ChannelListener::bind_abstract)), with the
    /// current Tokio runtime.
    ///
    /// # Errors
    /// As [`ChannelListener::bind_abstract`](crate::ChannelListener::bind_abstract), and
    /// [`IpcError::Io`] outside a runtime with I/O.
    pub fn bind_abstract(name: impl AsRef<[u8]>) -> Result<AsyncChannelListener> {
        AsyncChannelListener::from_std(crate::ChannelListener::bind_abstract(name)?.into_std())
    }

    /// Listens at `path` (as [`ChannelListener::bind`](crate::ChannelListener::bind)).
    ///
    /// # Errors
    /// As [`ChannelListener::bind`](crate::ChannelListener::bind), and [`IpcError::Io`] outside
    /// a runtime with I/O.
    pub fn bind(path: impl AsRef<std::path::Path>) -> Result<AsyncChannelListener> {
        AsyncChannelListener::from_std(crate::ChannelListener::bind(path)?.into_std())
    }

    fn from_std(listener: std::os::unix::net::UnixListener) -> Result<AsyncChannelListener> {
        listener.set_nonblocking(true).map_err(|e| IpcError::io("making the IPC listener non-blocking", e))?;
        tokio::runtime::Handle::try_current().map_err(|e| IpcError::io(NO_RUNTIME, std::io::Error::other(e)))?;
        let listener = tokio::net::UnixListener::from_std(listener)
            .map_err(|e| IpcError::io("registering the IPC listener with the runtime", e))?;
        Ok(AsyncChannelListener { listener, policy: PeerPolicy::default() })
    }

    /// The listener, admitting the peers `policy` does.
    pub fn with_policy(mut self, policy: PeerPolicy) -> AsyncChannelListener {
        self.policy = policy;
        self
    }

    /// The next connection, if the policy admits it. Cancellation-safe: a connection not
    /// accepted stays in the queue.
    ///
    /// # Errors
    /// As [`ChannelListener::accept`](crate::ChannelListener::accept).
    pub async fn accept(&self) -> Result<AsyncChannel> {
        let (stream, _) = self
            .listener
            .accept()
            .await
            .map_err(|e| IpcError::io("accepting a connection on the IPC channel's socket", e))?;
        let stream = stream.into_std().map_err(|e| IpcError::io("taking the accepted IPC socket", e))?;
        crate::listener::admit(&self.policy, &stream)?;
        AsyncChannel::new(Channel::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::test_fds::{contents, memfd};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// A frame's bytes, as a peer puts them on the wire.
    fn frame(kind: u16, payload: &[u8], fds: usize) -> Vec<u8> {
        let mut bytes = FrameHeader { kind, payload_len: payload.len(), fds }.encode().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    /// Writes `bytes` with `fds` on the first of them, in pieces of `piece` bytes with a pause
    /// between them, from a raw socket.
    fn trickle(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>], piece: usize) {
        for (index, chunk) in bytes.chunks(piece.max(1)).enumerate() {
            let mut space = [std::mem::MaybeUninit::uninit(); CONTROL_SPACE];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if index == 0 && !fds.is_empty() {
                assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
            }
            let mut sent = 0;
            while sent < chunk.len() {
                let mut control = if sent == 0 { std::mem::take(&mut control) } else { SendAncillaryBuffer::default() };
                sent += sendmsg(stream, &[std::io::IoSlice::new(&chunk[sent..])], &mut control, SendFlags::empty())
                    .unwrap();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[test]
    fn messages_with_descriptors_round_trip_and_a_large_one_waits_for_the_reader() {
        runtime().block_on(async {
            let (a, b) = AsyncChannel::pair().unwrap();
            let file = memfd(b"an fd");
            a.send(9, b"hello", &[file.as_fd()]).await.unwrap();
            let message = b.recv().await.unwrap();
            assert_eq!((message.kind, message.payload.as_slice()), (9, &b"hello"[..]));
            assert_eq!(contents(&message.fds[0]), b"an fd");
            // 16 MiB: far more than the socket holds, so the send waits for the reader.
            let big: Vec<u8> = (0..crate::MAX_PAYLOAD_LEN).map(|i| (i % 251) as u8).collect();
            let (sent, received) = tokio::join!(a.send(1, &big, &[]), b.recv());
            sent.unwrap();
            assert!(received.unwrap().payload == big);
            drop(a);
            assert!(matches!(b.recv().await, Err(IpcError::PeerClosed)));
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

        /// Receives cancelled at random points (a time-out of a few microseconds each) while a
        /// peer trickles frames in pieces: every frame arrives whole, in order, with its
        /// descriptor.
        #[test]
        fn receives_cancelled_anywhere_lose_nothing(pieces in proptest::collection::vec(1usize..64, 4), wait_us in 1u64..300) {
            let (raw, ours) = UnixStream::pair().unwrap();
            let frames: Vec<(u16, Vec<u8>)> =
                pieces.iter().enumerate().map(|(i, &n)| (i as u16, vec![i as u8; n * 7])).collect();
            let sending = frames.clone();
            let writer = std::thread::spawn(move || {
                for ((kind, payload), piece) in sending.iter().zip(&pieces) {
                    let file = memfd(&payload[..1]);
                    trickle(&raw, &frame(*kind, payload, 1), &[file.as_fd()], *piece);
                }
                raw
            });
            runtime().block_on(async {
                let channel = AsyncChannel::new(Channel::new(ours)).unwrap();
                let mut cancelled = 0;
                for (kind, payload) in &frames {
                    let message = loop {
                        match tokio::time::timeout(Duration::from_micros(wait_us), channel.recv()).await {
                            Ok(message) => break message.unwrap(),
                            Err(_) => cancelled += 1,
                        }
                    };
                    assert_eq!(message.kind, *kind);
                    assert_eq!(&message.payload, payload);
                    assert_eq!(message.fds.len(), 1);
                    assert_eq!(contents(&message.fds[0]), &payload[..1]);
                }
                assert!(cancelled > 0, "some receives were cancelled");
            });
            drop(writer.join().unwrap());
        }
    }

    #[test]
    fn a_send_cancelled_partway_is_finished_before_the_next_frame() {
        runtime().block_on(async {
            let (a, b) = AsyncChannel::pair().unwrap();
            let big = vec![7u8; 4 << 20];
            // Nobody reads: the socket fills and the send waits, then is cancelled partway.
            let cancelled = tokio::time::timeout(Duration::from_millis(50), a.send(1, &big, &[])).await;
            assert!(cancelled.is_err(), "the send was still waiting for the reader");
            let (second, first) = tokio::join!(a.send(2, b"after", &[]), async {
                let first = b.recv().await.unwrap();
                (first, b.recv().await.unwrap())
            });
            second.unwrap();
            let (first, second) = first;
            assert_eq!((first.kind, first.payload.len()), (1, big.len()), "the cancelled frame, whole");
            assert!(first.payload.iter().all(|&x| x == 7));
            assert_eq!((second.kind, second.payload.as_slice()), (2, &b"after"[..]));
        });
    }

    #[test]
    fn garbage_breaks_receiving_and_a_dropped_channel_closes_a_partial_frames_descriptors() {
        runtime().block_on(async {
            let (raw, ours) = UnixStream::pair().unwrap();
            let channel = AsyncChannel::new(Channel::new(ours)).unwrap();
            std::io::Write::write_all(&mut &raw, b"not a frame header at all").unwrap();
            assert!(matches!(channel.recv().await, Err(IpcError::Protocol(ProtocolError::Frame(_)))));
            assert!(matches!(channel.recv().await, Err(IpcError::Protocol(ProtocolError::OutOfStep))));

            // A frame cut short, with a socket end as its descriptor: cancelled mid-frame, then
            // dropped with the channel, which closes the descriptor.
            let (raw, ours) = UnixStream::pair().unwrap();
            let channel = AsyncChannel::new(Channel::new(ours)).unwrap();
            let (canary, watcher) = UnixStream::pair().unwrap();
            let bytes = frame(3, b"payload", 1);
            trickle(&raw, &bytes[..FRAME_HEADER_LEN + 2], &[canary.as_fd()], 64);
            drop(canary);
            assert!(tokio::time::timeout(Duration::from_millis(20), channel.recv()).await.is_err());
            drop(channel);
            watcher.set_nonblocking(true).unwrap();
            assert!(matches!((&watcher).read(&mut [0u8; 1]), Ok(0)), "the descriptor was closed");
        });
    }

    #[test]
    fn outside_a_runtime_it_is_an_error_not_a_panic() {
        let (a, _b) = Channel::pair().unwrap();
        let error = AsyncChannel::new(a).unwrap_err();
        assert!(error.to_string().contains("no Tokio runtime"), "{error}");
    }

    #[test]
    fn an_async_listener_admits_this_user_and_serves_a_blocking_worker() {
        let name = format!("cuda-mem-async-listener-{}", uuid::Uuid::new_v4());
        runtime().block_on(async {
            let listener = AsyncChannelListener::bind_abstract(&name).unwrap();
            let worker_name = name.clone();
            let worker = std::thread::spawn(move || {
                let channel = Channel::connect_abstract(&worker_name).unwrap();
                channel.send(5, b"blocking worker", &[]).unwrap();
                channel.recv().unwrap().payload
            });
            let channel = listener.accept().await.unwrap();
            assert_eq!(channel.peer_credentials().map(|c| c.pid), Some(std::process::id()));
            assert_eq!(channel.recv().await.unwrap().payload, b"blocking worker");
            channel.send(6, b"served", &[]).await.unwrap();
            assert_eq!(worker.join().unwrap(), b"served");
            let refusing = AsyncChannelListener::bind_abstract(format!("{name}-2"))
                .unwrap()
                .with_policy(PeerPolicy::Allow(std::sync::Arc::new(|_: &PeerCredentials| false)));
            let _refused = Channel::connect_abstract(format!("{name}-2")).unwrap();
            assert!(matches!(refusing.accept().await, Err(IpcError::PeerRefused { .. })));
        });
    }
}
