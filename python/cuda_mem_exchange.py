"""Share memory pools and buffers between a Python process that uses cuda.core and a Rust
process that uses cuda-mem-ipc, in either direction, with no change to cuda.core.

The two meet on cuda-mem-ipc's channel: a connected Unix domain stream socket that carries framed
messages and file descriptors (``SCM_RIGHTS``). This module speaks that channel in pure Python
(the standard library's ``socket.sendmsg``/``socket.recvmsg`` and ``struct``; cuda.core is
imported only where a message is turned into its objects, so the channel layer works without it)
and turns its messages into cuda.core objects and back:

============  =======================================================  ==========================
kind          payload                                                  cuda.core side
============  =======================================================  ==========================
1 resource    pool UUID (16 bytes), memory kind (u8: 0 device,         ``DeviceMemoryResource.
              1 pinned), sender's device ordinal (i32 LE, -1 for       from_allocation_handle`` /
              pinned), 3 zero bytes, device UUID (16 bytes, zero for   ``PinnedMemoryResource.
              pinned); one file descriptor: the pool's                 from_allocation_handle``
2 buffers     count (u32 LE), then ``count`` 108-byte buffer           ``Buffer.from_ipc_descriptor``
              descriptors (see :func:`encode_buffer_descriptor`)       / ``Buffer.ipc_descriptor``
3 data        the application's bytes                                  ``bytes``
5 event       a 92-byte event descriptor (see                          ``Event.from_ipc_descriptor``
              :func:`encode_event_descriptor`)                         / ``Event.ipc_descriptor``
6 buffers-    a 92-byte event descriptor, then what a buffers          both of the above
  after-event message carries
9 returned    what a buffers message carries: buffers lent to the      ``Buffer.close`` (see
  buffers     sender, handed back, each descriptor the one it came     :meth:`IpcChannel.
              with                                                     give_back`)
============  =======================================================  ==========================

Each message is one frame: a 24-byte header (``b"CUMEMMSG"``, frame version ``1`` (u16), kind
(u16), payload length (u32), descriptor count (u32), reserved ``0`` (u32), little-endian), then
the payload; the descriptors ride on the frame's first bytes. Kind 4 (a cuda-mem-vmm virtual
buffer) has no cuda.core counterpart and is refused, saying so.

The byte layouts mirror one Rust module, cuda-mem-ipc's ``wire`` (``cuda-mem-ipc/src/wire/``),
whose docs are the reference: the constants here have its names, and each block of them says
which of its files it mirrors. The channel and the messages' handling mirror its ``Channel``
(``channel.rs``) and ``IpcChannel`` (``protocol.rs``).

A pool is named on the wire by a UUID: a cuda.core pool by its own ``mr.uuid`` (the one its
``allocation_handle`` carries), a Rust pool by its resource's UUID. A pool received here is
registered in cuda.core's registry under the UUID the peer named it with, so
``DeviceMemoryResource.from_registry(uuid)`` finds it, and a pool that arrives again (on this
channel or another) is the one imported first. A device is named by its UUID, not its ordinal,
because processes that see different devices (``CUDA_VISIBLE_DEVICES``) number them differently.

An event (kind 5, or 6 with buffers) hands work over without host synchronization: the sender
records an IPC-enabled cuda.core ``Event`` (``EventOptions(ipc_enabled=True)``) after its work and
sends it (:meth:`IpcChannel.send_event`, :meth:`IpcChannel.send_buffers_after`); the receiver
opens it (once per channel, by the sender's id of it) and makes the stream given to
:meth:`IpcChannel.recv` wait for it (``Stream.wait``) before it hands over what came with it.
The sending channel keeps each event it sent alive (the receiver can open an event only while its
exporter holds it) until :meth:`IpcChannel.release_sent_events`.

Returned buffers (kind 9) are the borrower's half of Rust's lending (``IpcChannel::lend``): a
Rust server lends buffers (they arrive here as ordinary buffers), and this side hands them back
with :meth:`IpcChannel.give_back`, which frees the imports on a stream, waits for it (so the frees
have run before the exporter may free its own), and then tells the peer, with each buffer's
descriptor as it arrived. Only buffers received on the same channel can be given back
(:class:`NotReceivedHere` otherwise, with nothing freed or sent). This module lends nothing
itself: a kind 9 message that arrives is handed over as :class:`Returned`, its descriptors
decoded, for the application to match against what it sent.

Errors are exceptions; this module's own are all :class:`ExchangeError`: :class:`ProtocolError`
(a frame, message or descriptor that is not what this protocol expects; its ``expected`` and
``received`` say what each was), :class:`PeerClosed` (also when the peer closed with data of ours
unread, ``ECONNRESET``), :class:`OutOfDescriptors` (this process had no descriptor numbers left
for a message's descriptors), :class:`ChannelTimeout` (also a ``TimeoutError``),
:class:`UnknownResource` (a buffer whose pool did not arrive on this channel),
:class:`UuidTakenOnChannel` (a pool sent where another went under its UUID) and
:class:`DeviceNotVisible`, :class:`MisdescribedResource` (a pool that is not the kind of memory the
message says), :class:`PoolNotImported` (the driver refused the peer's pool descriptor),
:class:`EventNotOpened` (the driver refused the peer's event: it destroyed it too early, or the
handle is bad), :class:`NotReceivedHere` (a buffer given back that did not arrive on the channel).
Each says whether the channel it came from is still usable, as Rust's
``IpcError::channel_usable`` does: its ``channel_usable``, and its message, which ends with Rust's
words (:data:`CHANNEL_USABLE` or :data:`CHANNEL_BROKEN`). An error about one message leaves the
channel usable when the whole frame was read (an unknown kind, a malformed payload,
:class:`OutOfDescriptors`), as does a time-out before the first byte of a message; a malformed
frame header, or an end of stream or a time-out inside a frame, breaks it for receiving (message
boundaries are lost), and a peer that closed its end leaves nothing to use, as in Rust.
Descriptors that came with a refused message are closed.

Trust: import only from trusted peers (the same user, cooperating code), as with cuda-mem-ipc:
the export data is opaque and a peer that shares memory can write it at any time. Lengths,
versions, checksums and reserved fields are checked before anything is imported, and the memory
kind and device a pool message states are checked against the driver once the pool is imported
(where its memory is accessible read-write: the host for a pinned pool, its one device for a
device pool), as cuda-mem-ipc does on the Rust side: a pool described otherwise is closed and
refused (:class:`MisdescribedResource`).

Memory snapshots: :func:`read_snapshot` reads the JSON a Rust process wrote with
``MemorySnapshot::write_json`` (``cuda_mem_core::snapshot``, feature ``snapshot``): its pools,
caching resources (segments and blocks), virtual memory resources, imported pools and recorded
history; :func:`snapshot_summary` prints it as the Rust side's table does.

A Rust parent, a Python child
-----------------------------

The Rust parent starts the child with ``cuda_mem_ipc::spawn_with_channel`` and sends::

    let (mut child, channel) = spawn_with_channel(Command::new("python3").arg("worker.py"))?;
    let channel = IpcChannel::new(channel);
    channel.send_buffers(&[&buffer])?; // the pool first, then the buffer
    let Received::Data(reply) = channel.recv(&stream)? else { panic!() };

and ``worker.py`` takes the channel from its environment::

    from cuda.core import Device
    import cuda_mem_exchange as cx

    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    channel = cx.IpcChannel(cx.Channel.from_env())
    pool = channel.recv(stream).resource        # a cuda.core DeviceMemoryResource
    (buffer,) = channel.recv(stream).buffers    # cuda.core Buffers, mapped from the parent's
    buffer.fill(7, stream=stream)
    stream.sync()
    channel.send_data(b"written")

A Python parent, a Rust child
-----------------------------

::

    from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions
    import cuda_mem_exchange as cx

    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    pool = DeviceMemoryResource(device, DeviceMemoryResourceOptions(ipc_enabled=True))
    buffer = pool.allocate(1 << 20, stream=stream)
    process, channel = cx.spawn_with_channel(["./rust-worker"])
    channel = cx.IpcChannel(channel)
    channel.send_buffers([buffer])              # the pool first, then the buffer
    assert channel.recv(stream).data == b"written"
    process.wait()

and the Rust child takes its end with ``unsafe { Channel::from_env() }`` and receives the pool
and the buffer with one ``IpcChannel::recv_buffers`` (or ``Received::Resource`` then
``Received::Buffers`` from ``IpcChannel::recv``). Processes that are not parent and child meet at
a socket path: ``Channel.connect(path)`` here, ``ChannelListener::bind``/``accept`` there (or
``Channel.listen(path)``/``accept()`` here and ``Channel::connect`` there).
"""

from __future__ import annotations

import array
import fcntl
import math
import os
import select
import socket
import stat
import struct
import subprocess
import threading
import time
import uuid as uuidlib
import weakref
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    # The wire formats, in the order of cuda-mem-ipc's `wire` module.
    "FRAME_MAGIC",
    "FRAME_VERSION",
    "FRAME_HEADER_LEN",
    "MAX_PAYLOAD_LEN",
    "MAX_FDS",
    "RESOURCE",
    "BUFFERS",
    "DATA",
    "VIRTUAL_BUFFER",
    "EVENT",
    "BUFFERS_AFTER_EVENT",
    "SNAPSHOT_REQUEST",
    "SNAPSHOT",
    "RETURNED",
    "RESOURCE_MESSAGE_LEN",
    "MAX_BUFFERS_PER_MESSAGE",
    "BUFFER_DESCRIPTOR_MAGIC",
    "BUFFER_DESCRIPTOR_VERSION",
    "BUFFER_DESCRIPTOR_LEN",
    "EXPORT_DATA_LEN",
    "MAX_BUFFER_SIZE",
    "EVENT_DESCRIPTOR_MAGIC",
    "EVENT_DESCRIPTOR_VERSION",
    "EVENT_DESCRIPTOR_LEN",
    "IPC_EVENT_HANDLE_LEN",
    "CHANNEL_FD_ENV",
    "CHANNEL_INODE_ENV",
    "Buffers",
    "Channel",
    "CHANNEL_BROKEN",
    "CHANNEL_USABLE",
    "ChannelTimeout",
    "Data",
    "DeviceNotVisible",
    "Event",
    "EventNotOpened",
    "ExchangeError",
    "IpcChannel",
    "MisdescribedResource",
    "NotReceivedHere",
    "OutOfDescriptors",
    "PeerClosed",
    "PeerCredentials",
    "PeerRefused",
    "PoolNotImported",
    "ProtocolError",
    "RawMessage",
    "Resource",
    "Returned",
    "UnknownResource",
    "UuidTakenOnChannel",
    "SNAPSHOT_REQUEST_LEN",
    "Snapshot",
    "SnapshotRequest",
    "decode_snapshot_request",
    "encode_snapshot_request",
    "decode_buffer_descriptor",
    "decode_event_descriptor",
    "encode_buffer_descriptor",
    "encode_event_descriptor",
    "spawn_with_channel",
    # Memory snapshots a Rust process wrote (cuda_mem_core::snapshot).
    "SNAPSHOT_SCHEMA_VERSION",
    "SnapshotError",
    "read_snapshot",
    "snapshot_summary",
]

# The wire formats: each block mirrors one file of cuda-mem-ipc's `wire` module
# (cuda-mem-ipc/src/wire/), with the same names; the Rust docs have the layout tables.

# The frame header: wire/frame.rs (`wire::FrameHeader`, `FrameError`).
FRAME_MAGIC = b"CUMEMMSG"
FRAME_VERSION = 1
_FRAME_HEADER = struct.Struct("<8sHHIII")
FRAME_HEADER_LEN = _FRAME_HEADER.size
MAX_PAYLOAD_LEN = 16 << 20
MAX_FDS = 253

# The message kinds: wire/message.rs (`wire::MessageKind`, `MessageError`).
RESOURCE = 1
BUFFERS = 2
DATA = 3
VIRTUAL_BUFFER = 4
EVENT = 5
BUFFERS_AFTER_EVENT = 6
SNAPSHOT_REQUEST = 7
SNAPSHOT = 8
RETURNED = 9
_KIND_NAMES = {
    RESOURCE: "resource",
    BUFFERS: "buffers",
    DATA: "data",
    VIRTUAL_BUFFER: "virtual buffer",
    EVENT: "event",
    BUFFERS_AFTER_EVENT: "buffers-after-event",
    SNAPSHOT_REQUEST: "snapshot request",
    SNAPSHOT: "snapshot",
    RETURNED: "returned buffers",
}
_RECEIVED_KINDS = (
    "1 (resource), 2 (buffers), 3 (data), 5 (event), 6 (buffers-after-event), 7 (snapshot request), "
    "8 (snapshot) or 9 (returned buffers)"
)

# The resource message: wire/resource.rs (`RESOURCE_MESSAGE_LEN`, `ResourceMessageError`).
RESOURCE_MESSAGE_LEN = 40
DEVICE_MEMORY = 0
PINNED_MEMORY = 1

# The buffers message: wire/buffers.rs (`MAX_BUFFERS_PER_MESSAGE`, `BuffersMessageError`).
MAX_BUFFERS_PER_MESSAGE = 65_536

# The buffer descriptor: wire/buffer_descriptor.rs (`wire::BufferDescriptor`), in the envelope of
# wire/envelope.rs.
BUFFER_DESCRIPTOR_MAGIC = b"CUMEMBUF"
BUFFER_DESCRIPTOR_VERSION = 1
BUFFER_DESCRIPTOR_LEN = 108
EXPORT_DATA_LEN = 64
MAX_BUFFER_SIZE = 1 << 48
_BUFFER_DESCRIPTOR_HEAD = struct.Struct("<8sHHIQ16s")

# The event descriptor: wire/event_descriptor.rs (`wire::EventDescriptor`), in the same envelope.
EVENT_DESCRIPTOR_MAGIC = b"CUMEMEVT"
EVENT_DESCRIPTOR_VERSION = 1
EVENT_DESCRIPTOR_LEN = 92
IPC_EVENT_HANDLE_LEN = 64
_EVENT_DESCRIPTOR_HEAD = struct.Struct("<8sHHIQ")

# wire/virtual_buffer.rs (`SharedVirtualBuffer`, kind 4) has no cuda.core counterpart: refused.

# What a child started by `spawn_with_channel` (here or in Rust) finds its channel by.
CHANNEL_FD_ENV = "CUDA_MEM_IPC_CHANNEL_FD"
CHANNEL_INODE_ENV = "CUDA_MEM_IPC_CHANNEL_INODE"


# How every error's message ends, in cuda-mem-ipc's words: the channel goes on, or it does not.
CHANNEL_USABLE = "the channel is still usable"
CHANNEL_BROKEN = "the channel is no longer usable: drop it and open a new one"


class ExchangeError(Exception):
    """Any error of this module. ``channel_usable`` says whether the channel it came from can
    still be used (Rust's ``IpcError::channel_usable``): ``False`` after the peer closed it, or
    once message boundaries are lost in a direction; ``True`` otherwise (the failed message was
    read whole, or nothing of it was sent), also for errors that involve no channel. An error of
    a channel ends its message with the same, in Rust's words: :data:`CHANNEL_USABLE` or
    :data:`CHANNEL_BROKEN` (one raised with ``channel_usable`` given, as every subclass is)."""

    channel_usable = True

    def __init__(self, message: str, channel_usable: bool | None = None):
        if channel_usable is not None:
            self.channel_usable = channel_usable
            message = f"{message}; {CHANNEL_USABLE if channel_usable else CHANNEL_BROKEN}"
        super().__init__(message)


class ProtocolError(ExchangeError):
    """What arrived is not what the protocol expects: ``what`` was expected to be ``expected``
    and was ``received``. A malformed frame (or one cut short) breaks the channel
    (``channel_usable`` is ``False``); a whole frame whose message is wrong does not."""

    def __init__(self, what: str, expected: object, received: object, hint: str = "", channel_usable: bool = True):
        self.what = what
        self.expected = expected
        self.received = received
        message = f"{what}: expected {expected}, received {received}"
        if hint:
            message = f"{message} ({hint})"
        advice = "the message was dropped" if channel_usable else "message boundaries are lost"
        super().__init__(f"{message}; {advice}", channel_usable)


class PeerClosed(ExchangeError):
    """The peer closed its end of the channel (between messages): nothing more will come."""

    channel_usable = False

    def __init__(self):
        super().__init__(
            "the peer closed the channel (it exited or closed its end); no more messages will arrive", False
        )


class PeerRefused(ExchangeError):
    """A listener refused a peer (Rust's ``IpcError::PeerRefused``): its connection was closed;
    the listener goes on."""

    def __init__(self, credentials: "PeerCredentials"):
        self.credentials = credentials
        super().__init__(
            f"the listener's peer policy refused process {credentials.pid} (uid {credentials.uid}, gid "
            f"{credentials.gid}): its connection was closed; the listener is still usable",
            channel_usable=True,
        )


class OutOfDescriptors(ExchangeError):
    """This process had no free descriptor numbers (``RLIMIT_NOFILE``) for a message's file
    descriptors, so the system dropped them. Not the peer's fault: the message (of kind ``kind``,
    with ``fds`` descriptors) was read to its end and dropped, the descriptors of it that did
    arrive were closed, and the channel is still usable (Rust's ``IpcError::OutOfDescriptors``)."""

    def __init__(self, kind: int, fds: int):
        self.kind = kind
        self.fds = fds
        super().__init__(
            f"the {fds} descriptor(s) of a message of kind {kind} could not be received; the message was dropped: "
            "close descriptors or raise RLIMIT_NOFILE",
            True,
        )


class ChannelTimeout(ExchangeError, TimeoutError):
    """A receive or send ran past the channel's time-out (:meth:`Channel.settimeout`). Also a
    ``TimeoutError`` (so ``socket.timeout``, which is that). One before the first byte of a
    message leaves the channel usable; one in the middle of a message breaks it for receiving
    (or sending), as in Rust (``IpcError::Timeout``)."""

    def __init__(self, operation: str, channel_usable: bool, detail: str = ""):
        self.operation = operation
        detail = f", {detail}" if detail else ""
        if channel_usable:
            message = f"{operation} timed out before any byte of the message (the channel's time-out ran out{detail})"
        else:
            message = (
                f"{operation} timed out partway through a message (the channel's time-out ran out{detail}), so "
                "message boundaries are lost"
            )
        super().__init__(message, channel_usable)


class UnknownResource(ExchangeError):
    """A buffer names a pool that did not arrive on this channel (or was released)."""

    def __init__(self, uuid: uuidlib.UUID):
        self.uuid = uuid
        super().__init__(f"a buffer of pool {uuid}, which was not received on this channel", True)


class MisdescribedResource(ExchangeError):
    """The peer described a pool as another kind of memory than the driver reports for the
    imported pool (device memory as pinned, pinned as device memory, or another device): the
    import was closed, nothing was kept (Rust's ``IpcError::MisdescribedResource``)."""

    def __init__(self, uuid: uuidlib.UUID, claimed: str, actual: str):
        self.uuid = uuid
        self.claimed = claimed
        self.actual = actual
        super().__init__(
            f"the peer described memory pool {uuid} as a {claimed}, but the driver reports a {actual}: the peer is "
            "broken or hostile, so the pool was not imported",
            True,
        )


class PoolNotImported(ExchangeError):
    """The driver refused to import the pool a peer sent (``CUDA_ERROR_INVALID_VALUE`` or
    ``CUDA_ERROR_INVALID_HANDLE``): the descriptor is not an exported pool this process can
    import. The peer's error; cuda.core's is the ``__cause__`` (Rust's ``IpcError::PoolImport``)."""

    def __init__(self, uuid: uuidlib.UUID):
        self.uuid = uuid
        super().__init__(
            f"the peer's pool {uuid} could not be imported: the descriptor the peer sent is not an exported memory "
            "pool this process can import (the peer is broken or hostile), so nothing was imported",
            True,
        )


class UuidTakenOnChannel(ExchangeError):
    """A pool that cannot go on this channel: another pool was sent on it under the same UUID
    (a relay that imported two pools so named, from two peers), and the receiver would map this
    one's buffers through that one. Nothing of the refused message was sent."""

    def __init__(self, uuid: uuidlib.UUID):
        self.uuid = uuid
        super().__init__(
            f"another pool was sent on this channel under UUID {uuid} (two peers named their pools so), and the "
            "receiver would map this pool's buffers through that one: nothing of it was sent; send it on another "
            "channel, to another process",
            True,
        )


class DeviceNotVisible(ExchangeError):
    """A pool's device is not one this process sees."""

    def __init__(self, uuid: uuidlib.UUID, sender_ordinal: int):
        self.uuid = uuid
        self.sender_ordinal = sender_ordinal
        super().__init__(
            f"the peer's device {sender_ordinal} (UUID {uuid}) is not visible to this process "
            "(check CUDA_VISIBLE_DEVICES)",
            True,
        )


class EventNotOpened(ExchangeError):
    """The driver refused to open the peer's event (it destroyed the event before this side
    opened it, or sent a bad handle); no stream waits for it and nothing that came with it was
    imported. The driver's error is the ``__cause__``."""

    def __init__(self, event_id: int):
        self.event_id = event_id
        super().__init__(
            f"the peer's event (its id {event_id}) could not be opened: the peer must hold the event until this "
            "side has received it, and the handle must be the driver's; nothing was imported",
            True,
        )


class NotReceivedHere(ExchangeError):
    """A buffer given back (:meth:`IpcChannel.give_back`) that was not received on this channel:
    not one that :meth:`IpcChannel.recv` mapped on it, one already given back or closed, or one
    whose pool the channel released since. Nothing was freed or sent (Rust's
    ``IpcError::NotReceivedHere``). ``ptr`` is its address here (0 once closed), ``index`` its
    place in the list given."""

    def __init__(self, ptr: int, index: int, reason: str = ""):
        self.ptr = ptr
        self.index = index
        reason = f" ({reason})" if reason else ""
        super().__init__(
            f"buffer {index} ({ptr:#x}) was not received on this channel{reason}, so it cannot be given back on it; "
            "nothing was freed or sent",
            True,
        )


@dataclass
class RawMessage:
    """A frame as received: its kind, payload and file descriptors (owned, close-on-exec:
    close them)."""

    kind: int
    payload: bytes
    fds: list[int] = field(default_factory=list)

    def close_fds(self) -> None:
        """Closes the message's descriptors."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _kind_name(kind: int) -> str:
    return f"{kind} ({_KIND_NAMES[kind]})" if kind in _KIND_NAMES else str(kind)


# Whether this process has taken its channel from the environment (Rust's `TAKEN`).
_channel_taken = False
_channel_taken_lock = threading.Lock()


class PeerCredentials(NamedTuple):
    """The process at a socket's other end, as the kernel recorded it (Rust's
    ``PeerCredentials``): its process id (0 when not visible here), user id and group id."""

    pid: int
    uid: int
    gid: int


def _peer_credentials(sock: socket.socket) -> PeerCredentials:
    """``sock``'s peer credentials (``SO_PEERCRED``: three C ints)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return PeerCredentials(*struct.unpack("3i", raw))


def _abstract_address(name: str | bytes) -> bytes:
    """The socket address of ``name`` in the abstract namespace (a leading NUL byte)."""
    return b"\0" + (name.encode() if isinstance(name, str) else bytes(name))


class Channel:
    """One end of a cuda-mem-ipc channel: framed messages with file descriptors over a connected
    Unix domain stream socket (the framing is in the module's docs).

    Received descriptors are close-on-exec (``MSG_CMSG_CLOEXEC``): children started later do not
    inherit them. Sends use ``MSG_NOSIGNAL``: a peer that closed its end is :class:`PeerClosed`,
    never ``SIGPIPE``, whatever this process does with that signal.

    When this process runs out of descriptor numbers (``RLIMIT_NOFILE``), the system cannot hand
    over a message's descriptors: it drops them and marks the control data truncated. The receiver
    then reads the rest of the frame, closes whatever descriptors of it did arrive and raises
    :class:`OutOfDescriptors`; the channel stays in step, so the next message is received normally
    once descriptors are free again.

    Once a frame has been partly read and then failed (a malformed header, an end of stream or a
    time-out in the middle of a frame), the byte stream is out of step and further receives raise
    :class:`ProtocolError`; likewise a send that failed partway through a frame makes further
    sends fail. Open a new channel then.

    ``send`` and ``recv`` are for one thread at a time each (one thread may send while another
    receives)."""

    def __init__(self, sock: socket.socket):
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise ExchangeError(f"a channel needs a Unix domain stream socket, not {sock!r}")
        self.sock = sock
        self._recv_broken = False
        self._send_broken = False
        # How long one recv() may take, from the call to the message's last byte (None: no
        # limit). A socket handed over with a time-out keeps it.
        self._recv_timeout = sock.gettimeout()

    @classmethod
    def pair(cls) -> tuple["Channel", "Channel"]:
        """Two connected ends."""
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(a), cls(b)

    @classmethod
    def connect(cls, path: str | os.PathLike) -> "Channel":
        """Connects to a listener at ``path`` (Rust's ``ChannelListener``, or :meth:`listen`)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(os.fspath(path))
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    @staticmethod
    def listen(path: str | os.PathLike) -> socket.socket:
        """A listening socket bound at ``path``: ``Channel.accept(listener)`` takes one peer
        (Rust's ``Channel::connect`` connects)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(path))
            sock.listen()
        except BaseException:
            sock.close()
            raise
        return sock

    @classmethod
    def connect_abstract(cls, name: str | bytes) -> "Channel":
        """Connects to a listener at ``name`` in Linux's abstract namespace (Rust's
        ``ChannelListener::bind_abstract``, or :meth:`listen_abstract`)."""
        return cls.connect(_abstract_address(name))

    @staticmethod
    def listen_abstract(name: str | bytes) -> socket.socket:
        """A listening socket at ``name`` in Linux's abstract namespace: no file, reachable by
        every process of this network namespace (:meth:`accept` admits this user's by default),
        gone when closed."""
        return Channel.listen(_abstract_address(name))

    @classmethod
    def accept(cls, listener: socket.socket, admit=None) -> "Channel":
        """The next peer to connect to ``listener``, if ``admit`` (a callable taking its
        :class:`PeerCredentials`) accepts it; by default, processes of this process's user, as
        Rust's ``PeerPolicy::SameUser``. A refused peer's connection is closed and
        :class:`PeerRefused` raised (the listener goes on)."""
        sock, _ = listener.accept()
        credentials = _peer_credentials(sock)
        allowed = credentials.uid == os.geteuid() if admit is None else admit(credentials)
        if not allowed:
            sock.close()
            raise PeerRefused(credentials)
        return cls(sock)

    def peer_credentials(self) -> "PeerCredentials":
        """The peer's process, user and group ids, as the kernel recorded them when the
        connection was made (``SO_PEERCRED``)."""
        return _peer_credentials(self.sock)

    @classmethod
    def from_env(cls) -> "Channel":
        """The channel a parent passed (Rust's ``spawn_with_channel`` or this module's): the
        descriptor ``CUDA_MEM_IPC_CHANNEL_FD`` names, checked to be the very socket whose inode
        ``CUDA_MEM_IPC_CHANNEL_INODE`` names (so a grandchild that inherited the environment but
        not the descriptor does not take some other file). It is made close-on-exec again.

        A process has at most one such channel: a second call raises :class:`ExchangeError`
        (two channels would own one descriptor, and the first to close it would pull it from
        under the other). Nothing is taken when a call fails."""
        global _channel_taken
        with _channel_taken_lock:
            if _channel_taken:
                raise ExchangeError(
                    "the channel was already taken by an earlier Channel.from_env in this process "
                    "(a process has one channel from its parent: keep the first)"
                )
            try:
                fd = int(os.environ[CHANNEL_FD_ENV])
                inode = int(os.environ[CHANNEL_INODE_ENV])
            except KeyError as missing:
                raise ExchangeError(f"{missing.args[0]} is not set, so this process was not given a channel") from None
            except ValueError as bad:
                raise ExchangeError(f"{CHANNEL_FD_ENV}/{CHANNEL_INODE_ENV} are not numbers: {bad}") from None
            if fd < 0:
                raise ExchangeError(f"{CHANNEL_FD_ENV} is {fd}, not a descriptor number")
            try:
                info = os.fstat(fd)
            except OSError as e:
                raise ExchangeError(f"{CHANNEL_FD_ENV} names descriptor {fd}, which is not open here") from e
            if not stat.S_ISSOCK(info.st_mode) or info.st_ino != inode:
                raise ExchangeError(
                    f"descriptor {fd} from {CHANNEL_FD_ENV} is not the channel the parent passed "
                    f"(inode {info.st_ino}, expected a socket with inode {inode})"
                )
            sock = socket.socket(fileno=fd)
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
                sock.detach()  # not taken: the descriptor stays open, as it was
                raise ExchangeError(f"descriptor {fd} from {CHANNEL_FD_ENV} is not a Unix domain stream socket")
            _channel_taken = True
        os.set_inheritable(fd, False)
        return cls(sock)

    def settimeout(self, seconds: float | None) -> None:
        """How long a receive or send waits (``None``, the default: indefinitely).

        A receive's time counts from the call of :meth:`recv` to the message's last byte, however
        the peer spreads the bytes out; a send's, for each write to the socket. Running out raises
        :class:`ChannelTimeout` (a ``TimeoutError``): before the first byte of a message the
        channel stays usable, in the middle of one it is broken (for receiving, or sending)."""
        self.sock.settimeout(seconds)
        self._recv_timeout = seconds

    def fileno(self) -> int:
        """The socket's descriptor."""
        return self.sock.fileno()

    def close(self) -> None:
        """Closes this end."""
        self.sock.close()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, kind: int, payload: bytes = b"", fds: list[int] | tuple[int, ...] = ()) -> None:
        """Sends one frame: ``kind``, ``payload`` and duplicates of ``fds`` for the peer (the
        caller keeps its own)."""
        if len(payload) > MAX_PAYLOAD_LEN:
            raise ExchangeError(
                f"a payload of {len(payload)} bytes, more than the limit of {MAX_PAYLOAD_LEN}; nothing was sent", True
            )
        if len(fds) > MAX_FDS:
            raise ExchangeError(f"{len(fds)} file descriptors, more than the limit of {MAX_FDS}; nothing was sent", True)
        if self._send_broken:
            raise ExchangeError(
                "sending on the IPC channel: an earlier send failed partway through a message, so the peer cannot "
                "find where the next one starts",
                channel_usable=False,
            )
        frame = _FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, kind, len(payload), len(fds), 0) + bytes(payload)
        self.send_frame(frame, fds)

    def send_frame(self, frame: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
        """Sends bytes as they are, ``fds`` on the first of them: for tests of a peer's checks."""
        view = memoryview(frame)
        sent = 0
        try:
            if fds:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sent = self.sock.sendmsg([view], rights, socket.MSG_NOSIGNAL)
            while sent < len(view):
                sent += self.sock.send(view[sent:], socket.MSG_NOSIGNAL)
        except (BrokenPipeError, ConnectionResetError):
            self._send_broken = sent > 0
            raise PeerClosed() from None
        except TimeoutError:
            self._send_broken = sent > 0
            raise ChannelTimeout(
                "sending a message on the IPC channel", sent == 0, f"{sent} of its {len(view)} bytes went out"
            ) from None
        except BaseException:
            self._send_broken = sent > 0
            raise

    def recv(self) -> RawMessage:
        """Receives the next frame whole. Raises :class:`PeerClosed` at an end of stream between
        frames, :class:`ProtocolError` for a malformed frame (whose descriptors are closed),
        :class:`OutOfDescriptors` when this process had no descriptor numbers left for the
        frame's descriptors (the frame was read and dropped; the channel goes on), and
        :class:`ChannelTimeout` when the message has not arrived whole within the time-out
        (:meth:`settimeout`)."""
        if self._recv_broken:
            raise ProtocolError(
                "the channel",
                "message boundaries intact",
                "an earlier message cut short or malformed",
                channel_usable=False,
            )
        timeout = self._recv_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        reader = _FrameReader(self.sock, deadline)
        try:
            return reader.read_frame()
        except BaseException as error:
            reader.close_fds()
            # Running out of descriptors is reported once the frame has been read to its end: the
            # stream is still in step. Any other failure after the frame's first byte is not.
            if reader.consumed > 0 and not isinstance(error, OutOfDescriptors):
                self._recv_broken = True
            raise


# Room for one SCM_RIGHTS control message of MAX_FDS descriptors (C ints).
_FD_SIZE = array.array("i").itemsize
_CONTROL_SPACE = socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)


class _FrameReader:
    """Reads one frame, keeping every descriptor that arrives (Rust's ``FrameReader``)."""

    def __init__(self, sock: socket.socket, deadline: float | None):
        self.sock = sock
        # When the message must have arrived whole (time.monotonic()), if ever.
        self.deadline = deadline
        # Bytes of the frame read so far.
        self.consumed = 0
        # The number of descriptors the frame's header announced, once read.
        self.announced: int | None = None
        # Descriptors received with the frame's bytes so far, including any already closed.
        self.arrived = 0
        # Descriptors received with the frame's bytes so far, while the frame can still be
        # delivered (owned: closed on failure).
        self.fds: list[int] = []
        # The system could not install some of the frame's descriptors here (out of descriptor
        # numbers): the frame is read to its end and dropped.
        self.out_of_descriptors = False

    def close_fds(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)

    def read_frame(self) -> RawMessage:
        header = self.read_exact(FRAME_HEADER_LEN, FRAME_HEADER_LEN)
        magic, version, kind, length, fd_count, reserved = _FRAME_HEADER.unpack(header)
        if magic != FRAME_MAGIC:
            raise ProtocolError(
                "a frame's magic",
                FRAME_MAGIC,
                magic,
                "the peer does not speak the cuda-mem-ipc channel protocol",
                channel_usable=False,
            )
        if version != FRAME_VERSION:
            raise ProtocolError(
                "the frame version",
                FRAME_VERSION,
                version,
                "the peer uses a different cuda-mem-ipc version",
                channel_usable=False,
            )
        if reserved != 0:
            raise ProtocolError("the frame header's reserved field", 0, reserved, channel_usable=False)
        if length > MAX_PAYLOAD_LEN:
            raise ProtocolError("a frame's payload length", f"at most {MAX_PAYLOAD_LEN}", length, channel_usable=False)
        if fd_count > MAX_FDS:
            raise ProtocolError("a frame's descriptor count", f"at most {MAX_FDS}", fd_count, channel_usable=False)
        self.announced = fd_count
        # The descriptors that came with the header's bytes, now that their number is known.
        self.check_fd_count()
        payload = self.read_exact(length, FRAME_HEADER_LEN + length)
        if self.out_of_descriptors:
            raise OutOfDescriptors(kind, fd_count)
        if self.arrived != fd_count:
            raise ProtocolError("file descriptors with a frame", fd_count, self.arrived, channel_usable=False)
        fds, self.fds = self.fds, []
        return RawMessage(kind, payload, fds)

    def check_fd_count(self) -> None:
        """Refuses more descriptors than the header announced or, before the header is read, than
        a frame may carry: checked after every read, so a peer cannot make this process hold more
        than that plus one read's worth."""
        if self.announced is None:
            if self.arrived > MAX_FDS:
                raise ProtocolError(
                    "file descriptors with a frame", f"at most {MAX_FDS}", self.arrived, channel_usable=False
                )
        elif self.arrived > self.announced:
            raise ProtocolError("file descriptors with a frame", self.announced, self.arrived, channel_usable=False)

    def read_exact(self, n: int, frame_len: int) -> bytes:
        """Exactly ``n`` bytes of the current frame (of ``frame_len`` bytes), keeping the
        descriptors that come along."""
        chunks = []
        left = n
        # With a deadline, the socket is polled first and never left to block past it.
        flags = socket.MSG_CMSG_CLOEXEC | (socket.MSG_DONTWAIT if self.deadline is not None else 0)
        while left > 0:
            self.wait_readable(frame_len)
            try:
                data, ancdata, msg_flags, _ = self.sock.recvmsg(left, _CONTROL_SPACE, flags)
            except ConnectionResetError:
                # The peer closed with data of ours unread: after its queued bytes, an end of
                # stream like any other (Rust does the same).
                raise self.end_of_stream(frame_len) from None
            except BlockingIOError:
                continue  # nothing after all (the deadline is checked before the next read)
            except TimeoutError:
                # The socket's own time-out, if set on `sock` directly.
                raise self.timed_out(frame_len) from None
            # Count what was consumed, and take ownership of the descriptors, before any check.
            self.consumed += len(data)
            left -= len(data)
            chunks.append(data)
            delivered = self.take_fds(ancdata)
            self.check_fd_count()
            if msg_flags & socket.MSG_CTRUNC:
                self.truncated(delivered)
            if not data:
                raise self.end_of_stream(frame_len)
        return b"".join(chunks)

    def take_fds(self, ancdata) -> int:
        """Keeps the descriptors one read delivered, or closes them once the frame cannot be
        delivered; returns how many there were. A partial trailing int is ignored, as CPython's
        ``socket.recv_fds`` does."""
        received = array.array("i")
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received.frombytes(data[: len(data) - len(data) % _FD_SIZE])
        for fd in received:
            if self.out_of_descriptors:
                os.close(fd)
            else:
                self.fds.append(fd)
        self.arrived += len(received)
        return len(received)

    def truncated(self, delivered: int) -> None:
        """Control data was truncated after ``delivered`` descriptors. With room left for more,
        the system dropped the rest because it could not install them here (out of descriptor
        numbers, ``EMFILE``): the frame is read on and dropped, its descriptors closed to free
        their numbers. With the room used up, the peer sent more than a frame may carry."""
        if delivered < MAX_FDS:
            self.out_of_descriptors = True
            self.close_fds()
        else:
            raise ProtocolError(
                "a frame's control data",
                f"at most {MAX_FDS} file descriptors",
                "more, which the system discarded",
                channel_usable=False,
            )

    def wait_readable(self, frame_len: int) -> None:
        """Waits until the socket has something to read, or raises :class:`ChannelTimeout` once
        the deadline has passed; without a deadline, returns at once."""
        if self.deadline is None:
            return
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while True:
            left = self.deadline - time.monotonic()
            # Readable, closed or failed: the read that follows says which.
            if poller.poll(max(0, math.ceil(left * 1000))):
                return
            if time.monotonic() >= self.deadline:
                raise self.timed_out(frame_len)

    def timed_out(self, frame_len: int) -> ChannelTimeout:
        if self.consumed == 0:
            return ChannelTimeout("receiving a message on the IPC channel", True)
        of = f"{frame_len}" if self.announced is not None else f"at least {FRAME_HEADER_LEN}"
        return ChannelTimeout(
            "receiving a message on the IPC channel", False, f"{self.consumed} of its {of} bytes came"
        )

    def end_of_stream(self, frame_len: int) -> ExchangeError:
        if self.consumed == 0:
            return PeerClosed()
        if self.consumed < FRAME_HEADER_LEN:
            return ProtocolError(
                "the rest of a frame's header",
                f"{FRAME_HEADER_LEN - self.consumed} more bytes",
                "the end of the stream",
                channel_usable=False,
            )
        return ProtocolError(
            "the rest of a frame", f"{frame_len - self.consumed} more bytes", "the end of the stream", channel_usable=False
        )


def spawn_with_channel(args, **popen_kwargs) -> tuple[subprocess.Popen, Channel]:
    """Starts ``args`` (as ``subprocess.Popen``) with one end of a new channel and returns the
    process and the other end. The child finds its end through ``CUDA_MEM_IPC_CHANNEL_FD`` and
    ``CUDA_MEM_IPC_CHANNEL_INODE``, as a child of Rust's ``spawn_with_channel`` does: a Rust
    child takes it with ``Channel::from_env``, a Python one with :meth:`Channel.from_env`.

    ``env``, if given, is the child's whole environment (``env={}``: only the channel's two
    variables), as with ``Popen``; without it, this process's. The child's descriptor is above 2,
    clear of the standard streams the child is given."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # The child's standard streams are set up on descriptors 0 to 2 between fork and exec;
        # keep the channel clear of them (they can be free here if this process closed its own).
        if theirs.fileno() < 3:
            low = theirs
            moved = fcntl.fcntl(low.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
            try:
                theirs = socket.socket(fileno=moved)
            except BaseException:
                os.close(moved)
                raise
            low.close()
        env = popen_kwargs.pop("env", None)
        env = dict(os.environ if env is None else env)
        env[CHANNEL_FD_ENV] = str(theirs.fileno())
        env[CHANNEL_INODE_ENV] = str(os.fstat(theirs.fileno()).st_ino)
        pass_fds = tuple(popen_kwargs.pop("pass_fds", ())) + (theirs.fileno(),)
        process = subprocess.Popen(args, env=env, pass_fds=pass_fds, **popen_kwargs)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, Channel(ours)


def encode_buffer_descriptor(export_data: bytes, size: int, resource: uuidlib.UUID) -> bytes:
    """A buffer descriptor's 108 bytes: ``b"CUMEMBUF"``, version 1 (u16), flags 0 (u16),
    reserved 0 (u32), size (u64), the pool's UUID (16 bytes), the driver's 64 bytes of export
    data, and the CRC-32 (zlib's) of all that (u32), little-endian."""
    if len(export_data) != EXPORT_DATA_LEN:
        raise ExchangeError(f"export data of {len(export_data)} bytes, expected {EXPORT_DATA_LEN}")
    if not 1 <= size <= MAX_BUFFER_SIZE:
        raise ExchangeError(f"a buffer of {size} bytes, expected 1 to {MAX_BUFFER_SIZE}")
    body = _BUFFER_DESCRIPTOR_HEAD.pack(BUFFER_DESCRIPTOR_MAGIC, BUFFER_DESCRIPTOR_VERSION, 0, 0, size, resource.bytes) + export_data
    return body + struct.pack("<I", zlib.crc32(body))


def decode_buffer_descriptor(encoded: bytes) -> tuple[bytes, int, uuidlib.UUID]:
    """``(export_data, size, resource UUID)`` of an encoded buffer descriptor, checked as Rust's
    ``BufferDescriptor::decode`` checks it (length, magic, version, checksum, flags, reserved,
    size, UUID), each failure a :class:`ProtocolError`."""
    if len(encoded) != BUFFER_DESCRIPTOR_LEN:
        raise ProtocolError("a buffer descriptor's length", BUFFER_DESCRIPTOR_LEN, len(encoded))
    magic, version, flags, reserved, size, resource = _BUFFER_DESCRIPTOR_HEAD.unpack_from(encoded)
    if magic != BUFFER_DESCRIPTOR_MAGIC:
        raise ProtocolError("a buffer descriptor's magic", BUFFER_DESCRIPTOR_MAGIC, magic)
    if version != BUFFER_DESCRIPTOR_VERSION:
        raise ProtocolError(
            "the buffer descriptor version",
            BUFFER_DESCRIPTOR_VERSION,
            version,
            "the peer uses a different cuda-mem-ipc version",
        )
    (stored,) = struct.unpack_from("<I", encoded, BUFFER_DESCRIPTOR_LEN - 4)
    computed = zlib.crc32(encoded[: BUFFER_DESCRIPTOR_LEN - 4])
    if stored != computed:
        raise ProtocolError("a buffer descriptor's checksum", f"{computed:#010x}", f"{stored:#010x}", "damaged")
    if flags != 0 or reserved != 0:
        raise ProtocolError("a buffer descriptor's flags and reserved field", "0 and 0", f"{flags} and {reserved}")
    if not 1 <= size <= MAX_BUFFER_SIZE:
        raise ProtocolError("a buffer descriptor's size", f"1 to {MAX_BUFFER_SIZE}", size)
    if resource == bytes(16):
        raise ProtocolError("a buffer descriptor's pool UUID", "a UUID", "the nil UUID")
    export_data = encoded[_BUFFER_DESCRIPTOR_HEAD.size : BUFFER_DESCRIPTOR_LEN - 4]
    return export_data, size, uuidlib.UUID(bytes=resource)


def encode_event_descriptor(event_id: int, handle: bytes) -> bytes:
    """An event descriptor's 92 bytes: ``b"CUMEMEVT"``, version 1 (u16), flags 0 (u16), reserved
    0 (u32), the sender's id of the event (u64, not 0), the driver's 64-byte ``CUipcEventHandle``,
    and the CRC-32 (zlib's) of all that (u32), little-endian."""
    if len(handle) != IPC_EVENT_HANDLE_LEN:
        raise ExchangeError(f"an event handle of {len(handle)} bytes, expected {IPC_EVENT_HANDLE_LEN}")
    if not 1 <= event_id < 1 << 64:
        raise ExchangeError(f"event id {event_id}, expected 1 to 2**64 - 1")
    body = _EVENT_DESCRIPTOR_HEAD.pack(EVENT_DESCRIPTOR_MAGIC, EVENT_DESCRIPTOR_VERSION, 0, 0, event_id) + handle
    return body + struct.pack("<I", zlib.crc32(body))


def decode_event_descriptor(encoded: bytes) -> tuple[int, bytes]:
    """``(event id, handle)`` of an encoded event descriptor, checked as Rust's
    ``EventDescriptor::decode`` checks it (length, magic, version, checksum, flags, reserved, a
    nonzero id, a handle that is not all zeros), each failure a :class:`ProtocolError`."""
    if len(encoded) != EVENT_DESCRIPTOR_LEN:
        raise ProtocolError("an event descriptor's length", EVENT_DESCRIPTOR_LEN, len(encoded))
    magic, version, flags, reserved, event_id = _EVENT_DESCRIPTOR_HEAD.unpack_from(encoded)
    if magic != EVENT_DESCRIPTOR_MAGIC:
        raise ProtocolError("an event descriptor's magic", EVENT_DESCRIPTOR_MAGIC, magic)
    if version != EVENT_DESCRIPTOR_VERSION:
        raise ProtocolError(
            "the event descriptor version", EVENT_DESCRIPTOR_VERSION, version, "the peer uses a different cuda-mem-ipc version"
        )
    (stored,) = struct.unpack_from("<I", encoded, EVENT_DESCRIPTOR_LEN - 4)
    computed = zlib.crc32(encoded[: EVENT_DESCRIPTOR_LEN - 4])
    if stored != computed:
        raise ProtocolError("an event descriptor's checksum", f"{computed:#010x}", f"{stored:#010x}", "damaged")
    if flags != 0 or reserved != 0:
        raise ProtocolError("an event descriptor's flags and reserved field", "0 and 0", f"{flags} and {reserved}")
    if event_id == 0:
        raise ProtocolError("an event descriptor's id", "not 0", 0)
    handle = encoded[_EVENT_DESCRIPTOR_HEAD.size : EVENT_DESCRIPTOR_LEN - 4]
    if handle == bytes(IPC_EVENT_HANDLE_LEN):
        raise ProtocolError("an event descriptor's handle", "the driver's handle", "all zeros")
    return event_id, handle


# The snapshot request: wire/snapshot_request.rs (`wire::SnapshotRequest`, `SnapshotRequestError`).
SNAPSHOT_REQUEST_LEN = 4
_EVERY_EVENT = 0xFFFF_FFFF


def encode_snapshot_request(max_events: int | None = None) -> bytes:
    """A request for a memory snapshot with at most ``max_events`` events (``None``: all that
    fit one message)."""
    if max_events is not None and not 0 <= max_events <= _EVERY_EVENT:
        raise ValueError(f"max_events must be None or in 0..={_EVERY_EVENT}, not {max_events}")
    return struct.pack("<I", _EVERY_EVENT if max_events is None else max_events)


def decode_snapshot_request(encoded: bytes) -> int | None:
    """The ``max_events`` of an encoded snapshot request. Raises :class:`ProtocolError` for
    other than :data:`SNAPSHOT_REQUEST_LEN` bytes."""
    if len(encoded) != SNAPSHOT_REQUEST_LEN:
        raise ProtocolError("a snapshot request's length", f"{SNAPSHOT_REQUEST_LEN} bytes", len(encoded))
    (max_events,) = struct.unpack("<I", encoded)
    return None if max_events == _EVERY_EVENT else max_events


@dataclass
class Resource:
    """A pool arrived: ``resource`` is the cuda.core memory resource (imported, or the one this
    process imported earlier under ``uuid``)."""

    resource: object
    uuid: uuidlib.UUID


@dataclass
class Buffers:
    """Buffers arrived: cuda.core ``Buffer`` objects mapped through their pools."""

    buffers: list


@dataclass
class Returned:
    """The peer handed back buffers lent to it (a kind 9 message): ``descriptors`` are the
    buffers' descriptors as this side sent them, each ``(export_data, size, pool UUID)`` as
    :func:`decode_buffer_descriptor` gives it. The peer freed its imports of them, and those
    frees have run. This module keeps no record of loans: match them against what was sent."""

    descriptors: list


@dataclass
class Data:
    """The peer's own bytes."""

    data: bytes


@dataclass
class SnapshotRequest:
    """The peer asks for a memory snapshot of this process, with at most ``max_events`` of the
    latest events (``None``: all that fit). This module takes none of its own: answer with data,
    or not at all."""

    max_events: int | None


@dataclass
class Snapshot:
    """A memory snapshot of the peer's process (a Rust ``cuda_mem_core::snapshot``), as
    :func:`read_snapshot` reads it: pass it to :func:`snapshot_summary` for its table."""

    snapshot: dict


@dataclass
class Event:
    """An event of the peer arrived: ``event`` is a cuda.core ``Event`` opened from it (or the
    one opened when it came before), which the stream given to :meth:`IpcChannel.recv` already
    waits for."""

    event: object


def _refuses_the_peers_data(error: BaseException) -> bool:
    """Whether cuda.core's error is the driver refusing what the peer sent
    (``CUDA_ERROR_INVALID_VALUE``, ``CUDA_ERROR_INVALID_HANDLE``), rather than this process's
    state: cuda.core's ``CUDAError`` names the driver's code first (``"CUDA_ERROR_…: …"``), the
    only place it keeps it."""
    from cuda.core._utils.cuda_utils import CUDAError

    return isinstance(error, CUDAError) and str(error).startswith(
        ("CUDA_ERROR_INVALID_VALUE:", "CUDA_ERROR_INVALID_HANDLE:")
    )


def _pool_memory(mr) -> tuple[int, int | None]:
    """What an imported pool holds, as the driver reports it, whatever class cuda.core imported
    it as: ``(PINNED_MEMORY, None)`` for a pool whose memory the host reads and writes (only
    host memory is), else ``(DEVICE_MEMORY, ordinal)`` of the one device that does; as
    cuda-mem-core's reading of an imported pool (``MemoryPool::import``). A pool that is neither
    (no device, or several, reach it read-write) is :class:`ExchangeError`."""
    from cuda.bindings import driver

    def read_write(location_type, location_id) -> bool:
        location = driver.CUmemLocation()
        location.type = location_type
        location.id = location_id
        error, flags = driver.cuMemPoolGetAccess(mr.handle, location)
        return error == driver.CUresult.CUDA_SUCCESS and flags == driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE

    if read_write(driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST, 0):
        return PINNED_MEMORY, None
    error, count = driver.cuDeviceGetCount()
    if error != driver.CUresult.CUDA_SUCCESS:
        raise ExchangeError(f"counting the devices to locate an imported pool: {error!r}", True)
    reachable = [d for d in range(count) if read_write(driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, d)]
    if len(reachable) != 1:
        raise ExchangeError(
            f"an imported pool that {len(reachable)} devices reach read-write, and not the host: neither a device nor "
            "a pinned pool",
            True,
        )
    return DEVICE_MEMORY, reachable[0]


def _memory_name(memory: tuple[int, int | None]) -> str:
    """A pool's memory as Rust's ``PoolKind`` says it."""
    kind, ordinal = memory
    return "pinned host memory pool" if kind == PINNED_MEMORY else f"device memory pool on device {ordinal}"


def _core():
    """cuda.core, imported when first needed (the framing works without it)."""
    import cuda.core as core

    return core


def _device_uuid(device) -> bytes:
    """The 16 bytes of a cuda.core device's UUID (``cuDeviceGetUuid``'s, as Rust's
    ``Device::uuid``), with or without a ``GPU-``/``MIG-`` prefix."""
    text = device.uuid
    if text[:4] in ("GPU-", "MIG-"):
        text = text[4:]
    return uuidlib.UUID(text).bytes


def _export_data(descriptor) -> bytes:
    """The driver's export data of a cuda.core ``IPCBufferDescriptor``, through its pickling
    contract (``(IPCBufferDescriptor._init, (payload, size))``)."""
    _, (payload, _) = descriptor.__reduce__()
    return bytes(payload)


# What the sending side records of a pool of this process: such a pool's UUID is its own (cuda.core
# makes one per pool), so no other pool of this process goes by it.
_LOCAL_POOL = object()


def _sent_token(mr) -> object:
    """What ``IpcChannel`` records of a pool it sent: the pool itself when it was imported (two
    imports may go by one UUID), else :data:`_LOCAL_POOL`."""
    return mr if getattr(mr, "is_mapped", False) else _LOCAL_POOL


class IpcChannel:
    """Pools, buffers and bytes between this process (cuda.core) and a cuda-mem-ipc peer, over a
    :class:`Channel`: Python's counterpart of Rust's ``cuda_mem_ipc::IpcChannel``.

    Sending a buffer whose pool was not sent on this channel sends the pool first. The channel
    keeps every pool it received, by the UUID the peer named it with, for as long as it lives
    (or until :meth:`release_resource`); buffers map only through pools received on this
    channel.

    A UUID names one pool on a channel, for the channel's life, as in Rust: a relay that imported
    two pools under one UUID (from two peers, each naming its own pool so) can send only the
    first on a given channel; the other, and its buffers, are refused with
    :class:`UuidTakenOnChannel` before anything of them is sent. The channel keeps each imported
    pool it sent alive, so that a later import under the same UUID is not taken for it.

    Unlike Rust's, an ``IpcChannel`` is not thread-safe: its pools and events are kept in plain
    dictionaries, which a send and a receive both use. Use it from one thread at a time (or
    guard every call with one lock)."""

    def __init__(self, channel: Channel):
        self.channel = channel
        # The pools sent, by UUID: _LOCAL_POOL for one of this process, the pool itself for an
        # imported one (kept, so that it is not mistaken for a later import under the UUID).
        self._sent: dict[uuidlib.UUID, object] = {}
        self._received: dict[uuidlib.UUID, object] = {}
        # The events sent, by id(): (the event, kept alive so that the peer can open it and its
        # handle is not given to another, and the id it goes by on the wire).
        self._sent_events: dict[int, tuple[object, int]] = {}
        # The peer's events opened here, by the peer's id of each: (handle, cuda.core Event).
        self._events: dict[int, tuple[bytes, object]] = {}
        # The buffers recv() mapped, by id(): (a weak reference to the buffer, its encoded
        # descriptor as it arrived, the UUID of its pool), for give_back. An entry goes when its
        # buffer is given back or collected.
        self._mapped: dict[int, tuple[weakref.ref, bytes, uuidlib.UUID]] = {}

    def release_sent_events(self) -> None:
        """Lets go of the events sent on this channel (send them again only after the peer
        received them)."""
        self._sent_events.clear()

    def release_events(self) -> None:
        """Lets go of the peer's events opened on this channel (one sent again is opened again)."""
        self._events.clear()

    def resource(self, uuid: uuidlib.UUID):
        """The pool received under ``uuid``, if the channel still keeps it."""
        return self._received.get(uuid)

    def release_resource(self, uuid: uuidlib.UUID):
        """Lets go of the pool received under ``uuid`` (buffers already mapped keep it alive)."""
        return self._received.pop(uuid, None)

    def uuid_of(self, mr) -> uuidlib.UUID:
        """The UUID a pool goes by on the wire: the one it was received under, else its own."""
        for uuid, received in self._received.items():
            if received is mr:
                return uuid
        if not getattr(mr, "is_ipc_enabled", False) or mr.uuid is None:
            raise ExchangeError(f"{type(mr).__name__} is not IPC-enabled: create it with ipc_enabled=True")
        return mr.uuid

    def send_resource(self, mr) -> None:
        """Sends an IPC-enabled ``DeviceMemoryResource`` or ``PinnedMemoryResource`` (its
        allocation handle's descriptor, and its UUID)."""
        uuid, head, fd = self._resource_message(mr)
        self._check_not_taken(uuid, mr)
        self.channel.send(RESOURCE, head, [fd])
        self._sent[uuid] = _sent_token(mr)

    def _check_not_taken(self, uuid: uuidlib.UUID, mr) -> None:
        """Refuses ``mr`` under ``uuid`` when another pool was sent under it on this channel."""
        sent = self._sent.get(uuid)
        if sent is not None and sent is not _sent_token(mr):
            raise UuidTakenOnChannel(uuid)

    def _resource_message(self, mr) -> tuple[uuidlib.UUID, bytes, int]:
        """The UUID, payload and descriptor of a resource message for ``mr``, checked (nothing
        is sent)."""
        core = _core()
        uuid = self.uuid_of(mr)
        if isinstance(mr, core.DeviceMemoryResource):
            device = core.Device(mr.device_id)
            head = struct.pack("<16sBi3x", uuid.bytes, DEVICE_MEMORY, device.device_id) + _device_uuid(device)
        elif isinstance(mr, core.PinnedMemoryResource):
            head = struct.pack("<16sBi3x", uuid.bytes, PINNED_MEMORY, -1) + bytes(16)
        else:
            raise ExchangeError(f"a {type(mr).__name__} cannot be shared: only device and pinned pools can")
        return uuid, head, mr.allocation_handle.handle

    def send_buffers(self, buffers) -> None:
        """Sends cuda.core buffers of IPC-enabled pools in one message, each pool first if it
        was not sent on this channel yet."""
        self.channel.send(BUFFERS, self._buffers_payload(buffers))

    def send_buffers_after(self, event, buffers) -> None:
        """Sends cuda.core buffers with an IPC-enabled cuda.core ``Event`` in one message: the
        receiver's stream waits for the event (recorded after the work it must see) before the
        buffers are handed over."""
        descriptor = self._event_descriptor(event)
        self.channel.send(BUFFERS_AFTER_EVENT, descriptor + self._buffers_payload(buffers))

    def send_event(self, event) -> None:
        """Sends an IPC-enabled cuda.core ``Event``: the receiver's stream waits for it."""
        self.channel.send(EVENT, self._event_descriptor(event))

    def _event_descriptor(self, event) -> bytes:
        if not event.is_ipc_enabled:
            raise ExchangeError("the event is not IPC-enabled: create it with EventOptions(ipc_enabled=True)")
        kept = self._sent_events.get(id(event))
        if kept is None or kept[0] is not event:
            kept = (event, _next_event_id())
            self._sent_events[id(event)] = kept
        descriptor = event.ipc_descriptor if hasattr(event, "ipc_descriptor") else event.get_ipc_descriptor()
        # cuda.core's pickling contract: (IPCEventDescriptor._init, (handle bytes, blocking sync)).
        _, (handle, _) = descriptor.__reduce__()
        return encode_event_descriptor(kept[1], bytes(handle))

    def _buffers_payload(self, buffers) -> bytes:
        """A buffers message's payload for ``buffers``, after sending each pool not yet sent on
        this channel. Every buffer (and every pool to send) is checked before anything is sent,
        as in Rust: a buffer that cannot be shared sends nothing."""
        if len(buffers) > MAX_BUFFERS_PER_MESSAGE:
            raise ExchangeError(f"{len(buffers)} buffers, more than one message carries ({MAX_BUFFERS_PER_MESSAGE})")
        encoded = []
        unsent: dict[uuidlib.UUID, object] = {}
        for buffer in buffers:
            mr = buffer.memory_resource
            uuid = self.uuid_of(mr)
            descriptor = buffer.ipc_descriptor
            encoded.append(encode_buffer_descriptor(_export_data(descriptor), descriptor.size, uuid))
            # A UUID that would stand for two pools (one sent before, or two in this message)
            # is refused before anything is sent.
            self._check_not_taken(uuid, mr)
            if uuid in unsent and _sent_token(unsent[uuid]) is not _sent_token(mr):
                raise UuidTakenOnChannel(uuid)
            if uuid not in self._sent and uuid not in unsent:
                unsent[uuid] = mr
        messages = [(self._resource_message(mr), mr) for mr in unsent.values()]
        for (uuid, head, fd), mr in messages:
            self.channel.send(RESOURCE, head, [fd])
            self._sent[uuid] = _sent_token(mr)
        return struct.pack("<I", len(encoded)) + b"".join(encoded)

    def send_data(self, data: bytes) -> None:
        """Sends the application's bytes."""
        self.channel.send(DATA, data)

    def give_back(self, buffers, stream) -> None:
        """Hands buffers that the peer lent (Rust's ``IpcChannel::lend``) back to it, the
        borrower's side of lending as Rust's ``IpcChannel::give_back``: closes each buffer on
        ``stream`` (its import freed there), waits for ``stream`` (so the frees have run before
        the exporter frees its own, as the driver requires), then sends a returned-buffers
        message (kind 9) with each buffer's descriptor as it arrived; the peer receives its
        buffers again. Work on the buffers must be on ``stream``, or done, before this.

        Every buffer is checked before anything is freed: one that was not received on this
        channel by :meth:`recv` (or was given back or closed since, or whose pool was released
        with :meth:`release_resource`) raises :class:`NotReceivedHere`, the same buffer twice
        or more than one message carries :class:`ExchangeError`; nothing is freed or sent then.
        A failed close or wait (cuda.core's error) sends nothing. Send errors are as
        :meth:`Channel.send`'s."""
        buffers = list(buffers)
        if len(buffers) > MAX_BUFFERS_PER_MESSAGE:
            raise ExchangeError(
                f"{len(buffers)} buffers, more than one message carries ({MAX_BUFFERS_PER_MESSAGE}); nothing was freed "
                "or sent",
                True,
            )
        encoded = [self._returnable(i, buffer) for i, buffer in enumerate(buffers)]
        if len({id(buffer) for buffer in buffers}) != len(buffers):
            raise ExchangeError("the same buffer given back twice in one call; nothing was freed or sent", True)
        for buffer in buffers:
            buffer.close(stream)
            # Freed (on `stream`): no longer this channel's to give back.
            self._mapped.pop(id(buffer), None)
        stream.sync()
        self.channel.send(RETURNED, struct.pack("<I", len(encoded)) + b"".join(encoded))

    def _returnable(self, index: int, buffer) -> bytes:
        """The encoded descriptor ``buffer`` (``index``-th of those given back) arrived with on
        this channel, or :class:`NotReceivedHere`."""
        ptr = _buffer_address(buffer)
        kept = self._mapped.get(id(buffer))
        if kept is None or kept[0]() is not buffer:
            raise NotReceivedHere(ptr, index)
        _, encoded, uuid = kept
        if ptr == 0:
            raise NotReceivedHere(ptr, index, "it was closed")
        if self._received.get(uuid) is not getattr(buffer, "memory_resource", None):
            raise NotReceivedHere(ptr, index, f"its pool {uuid} was released from the channel")
        return encoded

    def _remember_mapped(self, buffer, encoded: bytes, uuid: uuidlib.UUID) -> None:
        """Records that ``buffer`` arrived on this channel with the descriptor ``encoded``, until
        it is given back or collected."""
        key = id(buffer)
        # The dictionary, not the channel: the callback keeps no channel alive.
        mapped = self._mapped

        def forget(ref: weakref.ref) -> None:
            # Only this buffer's entry: the id may have been taken by a newer one since.
            if mapped.get(key, (None,))[0] is ref:
                del mapped[key]

        self._mapped[key] = (weakref.ref(buffer, forget), encoded, uuid)

    def request_snapshot(self, max_events: int | None = None) -> None:
        """Asks the peer (a Rust process whose ``cuda_mem_ipc::IpcChannel`` answers with
        ``answer_snapshot_request``) for a memory snapshot of its process, with at most
        ``max_events`` of its latest recorded events (``None``: every event that fits one
        message). The answer arrives as a :class:`Snapshot` from :meth:`recv` (no cuda.core is
        needed to ask or to receive it: ``stream`` may be ``None``)."""
        self.channel.send(SNAPSHOT_REQUEST, encode_snapshot_request(max_events))

    def recv(self, stream) -> Resource | Buffers | Data | Event | Snapshot | SnapshotRequest | Returned:
        """Receives one message: imports a pool, maps buffers (freed on ``stream`` when
        closed), opens an event (which ``stream`` then waits for), returns bytes, a peer's memory
        snapshot (read as :func:`read_snapshot` reads one: a snapshot it cannot read raises
        :class:`SnapshotError`, and the channel goes on), a peer's request for one, or buffers
        the peer hands back (:class:`Returned`, their descriptors decoded; no cuda.core is
        needed for it). Buffers received here can be given back with :meth:`give_back`.

        A refused message's descriptors are closed, and it leaves this process's pools and
        mappings as they were (the buffers of it mapped before the refusal are closed on
        ``stream``). One thing stays, which changes no memory, as in Rust: when a
        buffers-after-event message is refused after its event was opened and ``stream`` made to
        wait for it (a buffer cuda.core refuses, or larger than its pool's allocation; malformed
        descriptors and unknown pools are refused before), the channel keeps the event open, as
        if it had come alone, and ``stream`` still waits for it."""
        message = self.channel.recv()
        try:
            if message.kind == RESOURCE:
                return self._receive_resource(message)
            if message.kind != VIRTUAL_BUFFER:
                _expect_no_fds(message)
            if message.kind == BUFFERS:
                return self._receive_buffers(message.payload, stream)
            if message.kind == EVENT:
                return Event(self._wait_for_event(decode_event_descriptor(message.payload), stream))
            if message.kind == BUFFERS_AFTER_EVENT:
                if len(message.payload) < EVENT_DESCRIPTOR_LEN:
                    raise ProtocolError(
                        "a buffers-after-event message's length",
                        f"at least {EVENT_DESCRIPTOR_LEN} bytes",
                        len(message.payload),
                    )
                event = decode_event_descriptor(message.payload[:EVENT_DESCRIPTOR_LEN])
                return self._receive_buffers(message.payload[EVENT_DESCRIPTOR_LEN:], stream, event)
            if message.kind == DATA:
                return Data(message.payload)
            if message.kind == SNAPSHOT:
                return Snapshot(read_snapshot(message.payload))
            if message.kind == SNAPSHOT_REQUEST:
                return SnapshotRequest(decode_snapshot_request(message.payload))
            if message.kind == RETURNED:
                parts = _buffers_payload_parts(message.payload)
                return Returned([decode_buffer_descriptor(encoded) for encoded in parts])
            if message.kind == VIRTUAL_BUFFER:
                raise ProtocolError(
                    "the message kind",
                    _RECEIVED_KINDS,
                    _kind_name(message.kind),
                    "cuda.core cannot import a cuda-mem-vmm virtual buffer",
                )
            raise ProtocolError("the message kind", _RECEIVED_KINDS, _kind_name(message.kind))
        finally:
            message.close_fds()

    def _receive_resource(self, message: RawMessage) -> Resource:
        core = _core()
        payload = message.payload
        if len(payload) != RESOURCE_MESSAGE_LEN or len(message.fds) != 1:
            raise ProtocolError(
                "a resource message",
                f"{RESOURCE_MESSAGE_LEN} bytes and 1 file descriptor",
                f"{len(payload)} bytes and {len(message.fds)}",
            )
        uuid_bytes, kind, ordinal, reserved, device_uuid = struct.unpack("<16sBi3s16s", payload)
        if reserved != bytes(3):
            raise ProtocolError("a resource message's reserved bytes", "zero", reserved)
        if uuid_bytes == bytes(16):
            raise ProtocolError("a resource message's pool UUID", "a UUID", "the nil UUID")
        uuid = uuidlib.UUID(bytes=uuid_bytes)
        if kind == DEVICE_MEMORY:
            if ordinal < 0 or device_uuid == bytes(16):
                raise ProtocolError(
                    "a device pool's ordinal and device UUID", "an ordinal >= 0 and a UUID", (ordinal, device_uuid)
                )
            device = next((d for d in core.Device.get_all_devices() if _device_uuid(d) == device_uuid), None)
            if device is None:
                raise DeviceNotVisible(uuidlib.UUID(bytes=device_uuid), ordinal)
            cls, args = core.DeviceMemoryResource, (device,)
        elif kind == PINNED_MEMORY:
            if ordinal != -1 or device_uuid != bytes(16):
                raise ProtocolError("a pinned pool's ordinal and device UUID", "-1 and zero", (ordinal, device_uuid))
            cls, args = core.PinnedMemoryResource, ()
        else:
            raise ProtocolError("a resource message's memory kind", "0 (device) or 1 (pinned)", kind)
        # What the message claims, as the driver would report it: (kind, device ordinal or None).
        claimed = (kind, args[0].device_id if kind == DEVICE_MEMORY else None)
        mr = self._received.get(uuid)
        if mr is None:
            try:
                mr = cls.from_registry(uuid)
            except RuntimeError:
                mr = self._import_pool(cls, args, message.fds[0], uuid, claimed)
        # The pool's own word, whichever import it is (one kept from before too).
        actual = _pool_memory(mr)
        if actual != claimed:
            raise MisdescribedResource(uuid, _memory_name(claimed), _memory_name(actual))
        self._received[uuid] = mr
        return Resource(mr, uuid)

    @staticmethod
    def _import_pool(cls, args, fd: int, uuid: uuidlib.UUID, claimed: tuple[int, int | None]):
        """The pool ``fd`` shares, imported as a ``cls`` and registered in cuda.core's registry
        under ``uuid``, once the driver confirms it holds the ``claimed`` memory (else closed and
        refused with :class:`MisdescribedResource`). A descriptor the driver refuses is the peer's
        error (:class:`PoolNotImported`)."""
        try:
            mr = cls.from_allocation_handle(*args, fd)
        except Exception as error:
            if _refuses_the_peers_data(error):
                raise PoolNotImported(uuid) from error
            raise
        try:
            actual = _pool_memory(mr)
        except BaseException:
            mr.close()
            raise
        if actual != claimed:
            # Not registered: cuda.core's registry would keep it under the UUID as the wrong kind.
            mr.close()
            raise MisdescribedResource(uuid, _memory_name(claimed), _memory_name(actual))
        try:
            mr.register(uuid)
        except RuntimeError as error:
            # cuda.core's registry still holds an earlier import of this pool, closed since:
            # it neither hands it out nor takes another under its UUID.
            mr.close()
            raise ExchangeError(
                f"pool {uuid} was imported in this process before and that import has been closed, so cuda.core's "
                f"registry refuses to register it again ({error}); keep the first import open while its pool may "
                "arrive again",
                True,
            ) from error
        return mr

    def _wait_for_event(self, descriptor: tuple[int, bytes], stream):
        """The peer's event ``descriptor`` names, opened the first time it arrives (then kept
        by the peer's id), and ``stream`` made to wait for it."""
        core = _core()
        from cuda.core._event import IPCEventDescriptor

        event_id, handle = descriptor
        kept = self._events.get(event_id)
        if kept is not None and kept[0] != handle:
            raise ProtocolError(f"the handle of the peer's event {event_id}", "the one it came with before", "another")
        if kept is None:
            # Another id with the same handle names an event the peer destroyed since.
            self._events = {i: k for i, k in self._events.items() if k[0] != handle}
            try:
                opened = core.Event.from_ipc_descriptor(IPCEventDescriptor._init(handle, False))
            except Exception as error:
                raise EventNotOpened(event_id) from error
            kept = self._events[event_id] = (handle, opened)
        stream.wait(kept[1])
        return kept[1]

    def _receive_buffers(self, payload: bytes, stream, event: tuple[int, bytes] | None = None) -> Buffers:
        core = _core()
        # Where cuda.core keeps the class its pickled descriptors name.
        from cuda.core._memory._ipc import IPCBufferDescriptor

        # Decode everything, and find every pool, before importing anything.
        encoded = _buffers_payload_parts(payload)
        descriptors = [decode_buffer_descriptor(part) for part in encoded]
        pools = []
        for _, _, uuid in descriptors:
            if uuid not in self._received:
                raise UnknownResource(uuid)
            pools.append(self._received[uuid])
        if event is not None:
            self._wait_for_event(event, stream)
        buffers = []
        try:
            for i, ((export_data, size, uuid), mr) in enumerate(zip(descriptors, pools)):
                # The constructor cuda.core's own unpickling uses.
                descriptor = IPCBufferDescriptor._init(export_data, size)
                try:
                    buffers.append(core.Buffer.from_ipc_descriptor(mr, descriptor, stream=stream))
                except ValueError as error:
                    # cuda.core's "exceeds mapped allocation extent": the peer's size is wrong
                    # (Rust's MisdescribedBuffer).
                    raise ProtocolError(
                        f"the size of buffer {i} (pool {uuid})",
                        "at most the allocation its pool maps for it",
                        f"{size} bytes",
                        f"the peer sent a bad size; cuda.core: {error}",
                    ) from error
        except BaseException:
            for buffer in buffers:
                buffer.close(stream)
            raise
        for buffer, part, (_, _, uuid) in zip(buffers, encoded, descriptors):
            self._remember_mapped(buffer, part, uuid)
        return Buffers(buffers)


def _buffers_payload_parts(payload: bytes) -> list[bytes]:
    """The encoded buffer descriptors of what a buffers message carries (kinds 2, 6 after the
    event, 9): a count (u32 LE), then that many descriptors; the count and length checked (a
    :class:`ProtocolError`), the descriptors not yet decoded."""
    if len(payload) < 4:
        raise ProtocolError("a buffers message's length", "at least 4 bytes", len(payload))
    (count,) = struct.unpack_from("<I", payload)
    if count > MAX_BUFFERS_PER_MESSAGE:
        raise ProtocolError("a buffers message's count", f"at most {MAX_BUFFERS_PER_MESSAGE}", count)
    if len(payload) != 4 + count * BUFFER_DESCRIPTOR_LEN:
        raise ProtocolError(f"a buffers message for {count} buffers", 4 + count * BUFFER_DESCRIPTOR_LEN, len(payload))
    return [payload[at : at + BUFFER_DESCRIPTOR_LEN] for at in range(4, len(payload), BUFFER_DESCRIPTOR_LEN)]


def _buffer_address(buffer) -> int:
    """A cuda.core buffer's address here (0 once it is closed), for messages."""
    try:
        return int(getattr(buffer, "handle", 0) or 0)
    except (TypeError, ValueError):
        return 0


_last_event_id = 0


def _next_event_id() -> int:
    """An id no event sent from this process had before (the wire's name for it)."""
    global _last_event_id
    _last_event_id += 1
    return _last_event_id


def _expect_no_fds(message: RawMessage) -> None:
    if message.fds:
        raise ProtocolError(f"file descriptors with a {_kind_name(message.kind)} message", 0, len(message.fds))


# Memory snapshots: what `MemorySnapshot::write_json` (cuda_mem_core::snapshot, feature
# `snapshot`) writes, read here without cuda.core: every live resource of the Rust process (pools,
# caching resources with their segments and blocks, virtual memory resources, imported pools) and
# its recorded history. The schema is that module's types, field for field; its `version` is
# checked.

SNAPSHOT_SCHEMA_VERSION = 1


class SnapshotError(ValueError):
    """A memory snapshot that this module cannot read: not a snapshot, or of a newer schema."""


def read_snapshot(source) -> dict:
    """The memory snapshot in ``source`` (a path, or the JSON text itself, or its bytes), as the
    dictionary the JSON holds: ``version``, ``taken_at_ns``, ``resources`` (each with ``id``,
    ``kind``, ``name``, ``device``, ``reserved_bytes``, ``used_bytes``, their peaks,
    ``live_allocations``, ``upstream``, ``pool`` and ``segments``, each segment with its
    ``blocks``), ``events`` and ``dropped_events``.

    Raises :class:`SnapshotError` for what is no snapshot, or one of a newer schema than
    :data:`SNAPSHOT_SCHEMA_VERSION`."""
    import json

    if isinstance(source, (bytes, bytearray)):
        try:
            text = bytes(source).decode("utf-8")
        except UnicodeDecodeError as error:
            raise SnapshotError(f"not a memory snapshot: {error}") from error
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        text = source
    else:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    try:
        snapshot = json.loads(text)
    except json.JSONDecodeError as error:
        raise SnapshotError(f"not a memory snapshot: {error}") from error
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("version"), int):
        raise SnapshotError("not a memory snapshot: no schema version")
    if snapshot["version"] > SNAPSHOT_SCHEMA_VERSION:
        raise SnapshotError(
            f"memory snapshot schema {snapshot['version']} is newer than {SNAPSHOT_SCHEMA_VERSION}, "
            "the newest this module reads"
        )
    for key in ("resources", "events"):
        if not isinstance(snapshot.get(key), list):
            raise SnapshotError(f"not a memory snapshot: no list of {key}")
    return snapshot


def _human(n: int) -> str:
    """``n`` bytes in the largest binary unit that leaves at least 1, as the Rust table prints."""
    value, unit = float(n), 0
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    while value >= 1024 and unit + 1 < len(units):
        value /= 1024
        unit += 1
    return f"{n} B" if unit == 0 else f"{value:.2f} {units[unit]}"


def snapshot_summary(snapshot: dict) -> str:
    """A snapshot (from :func:`read_snapshot`) as a table, a row per resource (addresses in hex,
    sizes in B/KiB/MiB/GiB) and a line per segment, then what the history recorded."""
    lines = [f"memory snapshot (schema {snapshot['version']}), {len(snapshot['resources'])} resource(s)"]
    header = ("resource", "kind", "device", "reserved", "used", "peak res.", "peak used", "live", "name")
    row = "{:<16} {:<15} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8}  {}"
    lines.append(row.format(*header))
    for r in snapshot["resources"]:
        device = "-" if r.get("device") is None else str(r["device"])
        lines.append(row.format(
            hex(r["id"]), r["kind"].replace("_", " "), device, _human(r["reserved_bytes"]), _human(r["used_bytes"]),
            _human(r["reserved_peak"]), _human(r["used_peak"]), r["live_allocations"], r["name"],
        ))
        for s in r.get("segments", []):
            states = {"allocated": 0, "free": 0, "pending": 0}
            for b in s["blocks"]:
                state = b["state"] if isinstance(b["state"], str) else "allocated"
                states[state] += b["size"]
            lines.append(
                f"    segment {hex(s['address'])} {_human(s['size'])}, stream {hex(s['stream'])}: "
                f"{len(s['blocks'])} block(s), {_human(states['allocated'])} allocated, "
                f"{_human(states['free'])} free, {_human(states['pending'])} pending"
            )
    kinds: dict[str, int] = {}
    for event in snapshot["events"]:
        kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
    counted = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    lines.append(f"history: {len(snapshot['events'])} event(s) kept ({counted}), {snapshot['dropped_events']} dropped")
    return "\n".join(lines)
