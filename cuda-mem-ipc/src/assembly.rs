//! `FrameAssembly`: one frame read from a socket one `recvmsg` at a time, whatever waits
//! between the reads. Its state (the bytes and descriptors that came so far) lives in the
//! value, so the blocking [`Channel`](crate::Channel) drives it with `poll`, and the async
//! channel with the runtime's readiness, where a receive dropped between two reads loses
//! nothing: the next one goes on with the same assembly.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use rustix::io::Errno;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, recvmsg};

use crate::error::{ChannelOperation, IpcError, Result};
use crate::wire::{FRAME_HEADER_LEN, FrameError, FrameHeader, MAX_FDS};

/// A message as received: its kind, payload and file descriptors.
#[derive(Debug)]
pub struct RawMessage {
    /// The kind the sender gave it.
    pub kind: u16,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The descriptors, in the order they were sent; each is owned (closed on drop) and has
    /// close-on-exec set.
    pub fds: Vec<OwnedFd>,
}

/// Room for one `SCM_RIGHTS` control message of [`MAX_FDS`] descriptors.
pub(crate) const CONTROL_SPACE: usize = rustix::cmsg_space!(ScmRights(MAX_FDS));

/// What came in so far: an error names the context of a failed receive by it.
pub(crate) const RECV_CONTEXT: &str = "receiving a message on the IPC channel";
/// A receive that failed before any byte of its message came in.
pub(crate) const RECV_BEFORE_ANY_BYTE_CONTEXT: &str =
    "receiving a message on the IPC channel (nothing of it came in, and the channel is still usable)";

/// What one read did.
#[derive(Debug)]
pub(crate) enum Step {
    /// Bytes came in (or a signal interrupted the read): read again.
    More,
    /// The frame is whole.
    Done(RawMessage),
    /// Nothing to read now (a non-blocking socket, or the socket's own time-out).
    WouldBlock,
}

/// A frame being read, and every descriptor that came with it so far.
#[derive(Debug)]
pub(crate) struct FrameAssembly {
    /// How many descriptors one `recvmsg` has room for.
    fd_room: usize,
    /// The header's bytes.
    raw: [u8; FRAME_HEADER_LEN],
    /// Bytes of the frame read so far.
    consumed: usize,
    /// The frame's header, once read.
    header: Option<FrameHeader>,
    /// The payload, sized once the header is read.
    payload: Vec<u8>,
    /// Descriptors received with the frame's bytes so far, including any already closed.
    arrived: usize,
    /// Descriptors received with the frame's bytes so far, while the frame can still be
    /// delivered.
    fds: Vec<OwnedFd>,
    /// The system could not install some of the frame's descriptors in this process (out of
    /// descriptor numbers): the frame is read to its end and dropped.
    out_of_descriptors: bool,
}

impl FrameAssembly {
    /// A frame to read, with room for `fd_room` descriptors per `recvmsg` (at most
    /// [`MAX_FDS`]; fewer only in tests, to make the kernel truncate control data).
    pub(crate) fn new(fd_room: usize) -> FrameAssembly {
        FrameAssembly {
            fd_room: fd_room.min(MAX_FDS),
            raw: [0; FRAME_HEADER_LEN],
            consumed: 0,
            header: None,
            payload: Vec::new(),
            arrived: 0,
            fds: Vec::new(),
            out_of_descriptors: false,
        }
    }

    /// Bytes of the frame read so far: once any came, a failure breaks the stream's step.
    pub(crate) fn consumed(&self) -> usize {
        self.consumed
    }

    /// The frame's length, once its header is read (the header's before).
    fn frame_len(&self) -> usize {
        self.header.map_or(FRAME_HEADER_LEN, |header| FRAME_HEADER_LEN + header.payload_len)
    }

    /// One `recvmsg` from `stream` into what of the frame is missing, owning the descriptors it
    /// brings before anything else; or the frame, once whole.
    ///
    /// # Errors
    /// The frame's ([`FrameError`] for a malformed one, an end of stream in it), the system's
    /// ([`failed`](FrameAssembly::failed)), and [`IpcError::OutOfDescriptors`] once the frame
    /// was read to its end.
    pub(crate) fn step(&mut self, stream: &UnixStream) -> Result<Step> {
        if self.header.is_some() && self.consumed == self.frame_len() {
            return self.finish().map(Step::Done);
        }
        let control_len = rustix::cmsg_space!(ScmRights(self.fd_room));
        let mut space = [MaybeUninit::<u8>::uninit(); CONTROL_SPACE];
        let mut control = RecvAncillaryBuffer::new(&mut space[..control_len]);
        let received = {
            let missing: &mut [u8] = if self.consumed < FRAME_HEADER_LEN {
                &mut self.raw[self.consumed..]
            } else {
                &mut self.payload[self.consumed - FRAME_HEADER_LEN..]
            };
            let wanted = missing.len();
            let mut iov = [IoSliceMut::new(missing)];
            // A stream socket never returns more than asked; `min` keeps that an assumption
            // that cannot turn into an out-of-bounds index.
            recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
                .map(|msg| (msg.bytes.min(wanted), msg.flags))
        };
        // Take ownership of whatever descriptors arrived before looking at anything else.
        let delivered = self.take_fds(&mut control);
        self.check_fd_count()?;
        match received {
            Ok((n, flags)) => {
                self.consumed += n;
                if flags.contains(ReturnFlags::CTRUNC) {
                    self.truncated(delivered)?;
                }
                if n == 0 {
                    return Err(self.end_of_stream());
                }
                if self.header.is_none() && self.consumed == FRAME_HEADER_LEN {
                    let header = FrameHeader::decode(&self.raw)?;
                    self.header = Some(header);
                    // The descriptors that came with the header bytes, now that their number is
                    // known.
                    self.check_fd_count()?;
                    self.payload = vec![0; header.payload_len];
                }
                if self.header.is_some() && self.consumed == self.frame_len() {
                    return self.finish().map(Step::Done);
                }
                Ok(Step::More)
            }
            Err(Errno::INTR) => Ok(Step::More),
            Err(Errno::AGAIN) => Ok(Step::WouldBlock),
            Err(Errno::CONNRESET) => Err(self.end_of_stream()),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// The whole frame as a message, its descriptors checked against the header.
    fn finish(&mut self) -> Result<RawMessage> {
        let Some(header) = self.header else { return Err(self.end_of_stream()) };
        if self.out_of_descriptors {
            return Err(IpcError::OutOfDescriptors { kind: header.kind, fds: header.fds });
        }
        if self.arrived != header.fds {
            return Err(self.fd_count_mismatch(&header));
        }
        Ok(RawMessage {
            kind: header.kind,
            payload: std::mem::take(&mut self.payload),
            fds: std::mem::take(&mut self.fds),
        })
    }

    fn fd_count_mismatch(&self, header: &FrameHeader) -> IpcError {
        FrameError::FdCount { announced: header.fds, arrived: self.arrived }.into()
    }

    /// Refuses more descriptors than the header announced or, before the header is read, than
    /// a frame may carry: checked after every `recvmsg`, so a peer cannot make this process
    /// hold more than that plus one `recvmsg`'s worth.
    fn check_fd_count(&self) -> Result<()> {
        match self.header {
            Some(header) if self.arrived > header.fds => Err(self.fd_count_mismatch(&header)),
            None if self.arrived > MAX_FDS => {
                Err(FrameError::FdsBeforeHeader { arrived: self.arrived, max: MAX_FDS }.into())
            }
            _ => Ok(()),
        }
    }

    /// Keeps the descriptors one `recvmsg` delivered, or closes them once the frame cannot be
    /// delivered; returns how many there were.
    fn take_fds(&mut self, control: &mut RecvAncillaryBuffer<'_>) -> usize {
        let mut delivered = 0;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                for fd in fds {
                    delivered += 1;
                    if !self.out_of_descriptors {
                        self.fds.push(fd);
                    }
                }
            }
        }
        self.arrived += delivered;
        delivered
    }

    /// Control data was truncated after `delivered` descriptors. With room left for more, the
    /// system dropped the rest because it could not install them here (out of descriptor
    /// numbers, `EMFILE`): the frame is read on and dropped, its descriptors closed to free
    /// their numbers. With the room used up, the peer sent more than a frame may carry.
    /// (`cmsg_space!` sizes the buffer, alignment included, for at least `fd_room` descriptors,
    /// so the kernel sees that much room.)
    fn truncated(&mut self, delivered: usize) -> Result<()> {
        if delivered < self.fd_room {
            self.out_of_descriptors = true;
            self.fds.clear();
            Ok(())
        } else {
            Err(FrameError::ControlDataTruncated { max: MAX_FDS }.into())
        }
    }

    /// A failed system call (or a deadline, as `EAGAIN`) while reading the frame: a time-out,
    /// or a system error, either of which breaks the channel once part of the frame was read.
    pub(crate) fn failed(&self, errno: Errno) -> IpcError {
        let nothing_read = self.consumed == 0;
        if errno == Errno::AGAIN {
            IpcError::Timeout {
                operation: ChannelOperation::Receive,
                channel_usable: nothing_read,
                source: errno.into(),
            }
        } else if nothing_read {
            IpcError::io(RECV_BEFORE_ANY_BYTE_CONTEXT, errno)
        } else {
            IpcError::ChannelBroken { context: RECV_CONTEXT, source: errno.into() }
        }
    }

    /// The end of the stream, here: between frames the peer closed; inside one, the frame is
    /// cut short.
    fn end_of_stream(&self) -> IpcError {
        if self.consumed == 0 {
            IpcError::PeerClosed
        } else if self.consumed < FRAME_HEADER_LEN {
            FrameError::TruncatedHeader { received: self.consumed, len: FRAME_HEADER_LEN }.into()
        } else {
            FrameError::Truncated { received: self.consumed, len: self.frame_len() }.into()
        }
    }
}
