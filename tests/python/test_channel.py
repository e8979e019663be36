"""The channel layer of `python/cuda_mem_exchange.py` (framing, descriptors, time-outs, the
parent's and the child's ends), with no GPU and no cuda.core: plain `unittest` over socket pairs
and small Python subprocesses. Run by `tests/tests/python_channel.rs` with the system's `python3`
(`python3 tests/python/test_channel.py`, which prints `test_channel: ok` when every test passed),
or by hand with `python3 -m unittest tests/python/test_channel.py`."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import unittest
import uuid as uuidlib
from unittest import mock

# The module under test, from the repository (not installed).
MODULE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
sys.path.insert(0, MODULE_DIR)

import cuda_mem_exchange as cx  # noqa: E402

# How long a subprocess of a test may run.
SUBPROCESS_TIMEOUT = 60


def run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs `code` in a new Python that imports the module from the repository."""
    env = dict(os.environ, PYTHONPATH=MODULE_DIR)
    env.pop(cx.CHANNEL_FD_ENV, None)
    env.pop(cx.CHANNEL_INODE_ENV, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        **kwargs,
    )


def frame(kind: int, payload: bytes = b"", fds: int = 0) -> bytes:
    """A frame's bytes, as `Channel.send` writes them."""
    return struct.pack("<8sHHIII", cx.FRAME_MAGIC, cx.FRAME_VERSION, kind, len(payload), fds, 0) + payload


class ChannelTestCase(unittest.TestCase):
    def pair(self):
        """Two connected channels, closed after the test, with a time-out so that a failing test
        fails instead of hanging."""
        a, b = cx.Channel.pair()
        for channel in (a, b):
            self.addCleanup(channel.close)
            channel.settimeout(20)
        return a, b

    def raw_pair(self, timeout=20):
        """A channel with a receive time-out of ``timeout`` seconds, and the raw socket of its
        peer, both closed after the test."""
        raw, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(raw.close)
        channel = cx.Channel(ours)
        self.addCleanup(channel.close)
        channel.settimeout(timeout)
        return channel, raw

    def pipe(self):
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        return r, w


class ReceivedDescriptors(ChannelTestCase):
    def test_received_descriptors_are_close_on_exec(self):
        # CPython's socket.recv_fds ignores its flags, MSG_CMSG_CLOEXEC included.
        a, b = self.pair()
        r, w = self.pipe()
        a.send(cx.DATA, b"pipe", [r, w])
        message = b.recv()
        self.addCleanup(message.close_fds)
        self.assertEqual(message.payload, b"pipe")
        self.assertEqual(len(message.fds), 2)
        for fd in message.fds:
            self.assertFalse(os.get_inheritable(fd), f"received descriptor {fd} is inheritable")
        # They are the pipe's ends.
        os.write(message.fds[1], b"through")
        self.assertEqual(os.read(r, 7), b"through")

    def test_out_of_descriptors_drops_the_frame_and_the_channel_goes_on(self):
        # In a subprocess whose RLIMIT_NOFILE leaves no descriptor number free (then one): the
        # system drops the frame's descriptors (all, then the second) and truncates its control
        # data; the frame is read to its end, the descriptor that did arrive is closed, and the
        # next frame is received normally.
        for spare in (0, 1):
            with self.subTest(free_numbers=spare):
                result = run_python(
                    f"""
                    import json, os, resource
                    import cuda_mem_exchange as cx

                    def open_fds():
                        return sorted(os.listdir("/proc/self/fd"))

                    a, b = cx.Channel.pair()
                    r, w = os.pipe()
                    a.send(cx.DATA, b"with two descriptors", [r, w])
                    a.send(cx.DATA, b"the next message")
                    before = open_fds()
                    lowest_free = os.open(os.devnull, os.O_RDONLY)
                    os.close(lowest_free)
                    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free + {spare}, hard))
                    try:
                        try:
                            b.recv()
                            first = "received"
                        except getattr(cx, "OutOfDescriptors", ()) as error:
                            first = ["OutOfDescriptors", error.kind, error.fds, isinstance(error, cx.ExchangeError)]
                        except BaseException as error:
                            first = repr(error)
                    finally:
                        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                    leaked = open_fds() != before
                    try:
                        second = b.recv().payload.decode()
                    except BaseException as error:
                        second = repr(error)
                    print(json.dumps([first, leaked, second]))
                    """
                )
                self.assertEqual(result.returncode, 0, result.stderr.decode())
                first, leaked, second = json.loads(result.stdout.decode().splitlines()[-1])
                self.assertEqual(first, ["OutOfDescriptors", cx.DATA, 2, True])
                self.assertFalse(leaked, "a descriptor of the dropped frame stayed open")
                self.assertEqual(second, "the next message")


class PeerEnds(ChannelTestCase):
    def test_a_reset_after_the_last_frame_is_peer_closed(self):
        # The peer closes with bytes of ours unread: its queued frames arrive, then ECONNRESET,
        # which is an end of stream like any other.
        channel, raw = self.raw_pair()
        raw.sendall(frame(cx.DATA, b"last words"))
        channel.send(cx.DATA, b"never read by the peer")
        raw.close()
        self.assertEqual(channel.recv().payload, b"last words")
        with self.assertRaises(cx.PeerClosed):
            channel.recv()
        # An end of stream between frames leaves the channel as it was: closed, not broken.
        with self.assertRaises(cx.PeerClosed):
            channel.recv()

    def test_a_reset_inside_a_frame_breaks_the_channel(self):
        channel, raw = self.raw_pair()
        raw.sendall(frame(cx.DATA, b"cut short")[:30])
        channel.send(cx.DATA, b"never read by the peer")
        raw.close()
        with self.assertRaises(cx.ProtocolError) as caught:
            channel.recv()
        self.assertIn("the end of the stream", str(caught.exception))
        with self.assertRaises(cx.ProtocolError) as caught:
            channel.recv()
        self.assertIn("message boundaries", str(caught.exception))

    def test_a_send_to_a_closed_peer_is_peer_closed_without_sigpipe(self):
        # With SIGPIPE's default action restored (Python ignores it), a send without
        # MSG_NOSIGNAL would kill the process.
        result = run_python(
            """
            import os, signal
            import cuda_mem_exchange as cx

            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            r, w = os.pipe()
            for fds in ([], [r]):
                a, b = cx.Channel.pair()
                b.close()
                try:
                    a.send(cx.DATA, b"to nobody", fds)
                    print("sent")
                except cx.PeerClosed:
                    print("peer closed", len(fds))
            """
        )
        self.assertEqual(result.returncode, 0, f"exit {result.returncode} (-{signal.SIGPIPE}: SIGPIPE)")
        self.assertEqual(result.stdout.decode().split("\n"), ["peer closed 0", "peer closed 1", ""])


class Deadline(ChannelTestCase):
    def test_a_slow_drip_does_not_outlast_the_time_out(self):
        # A byte every 0.1 s renews a per-read time-out of 0.5 s for ever; the time-out bounds
        # the whole message.
        channel, raw = self.raw_pair(timeout=0.5)
        stop = threading.Event()

        def drip():
            for byte in frame(cx.DATA, bytes(40)):
                if stop.wait(0.1):
                    return
                raw.send(bytes([byte]))

        dripper = threading.Thread(target=drip)
        dripper.start()
        self.addCleanup(dripper.join)
        self.addCleanup(stop.set)
        started = time.monotonic()
        try:
            message = channel.recv()
        except TimeoutError as error:
            elapsed = time.monotonic() - started
            self.assertIsInstance(error, cx.ExchangeError)
            self.assertIsInstance(error, socket.timeout)
        else:
            self.fail(f"received {message!r} after {time.monotonic() - started:.1f} s, past the 0.5 s time-out")
        self.assertLess(elapsed, 2.5)
        self.assertGreaterEqual(elapsed, 0.45)
        # Part of the frame was read: message boundaries are lost.
        stop.set()
        with self.assertRaises(cx.ProtocolError):
            channel.recv()
        # The socket's own time-out is the one set (sends wait that long for each write).
        self.assertEqual(channel.sock.gettimeout(), 0.5)

    def test_a_time_out_before_the_first_byte_leaves_the_channel_usable(self):
        a, b = self.pair()
        b.settimeout(0.2)
        started = time.monotonic()
        with self.assertRaises(TimeoutError) as caught:
            b.recv()
        self.assertGreaterEqual(time.monotonic() - started, 0.19)
        self.assertIsInstance(caught.exception, cx.ExchangeError)
        self.assertEqual(type(caught.exception).__name__, "ChannelTimeout")
        a.send(cx.DATA, b"late")
        self.assertEqual(b.recv().payload, b"late")
        b.settimeout(None)
        a.send(cx.DATA, b"no time-out")
        self.assertEqual(b.recv().payload, b"no time-out")
        self.assertIsNone(b.sock.gettimeout())

    def test_a_message_that_arrives_in_pieces_within_the_time_out(self):
        channel, raw = self.raw_pair(timeout=5)
        whole = frame(cx.DATA, b"in three pieces")
        sender = threading.Thread(
            target=lambda: [(raw.send(whole[at : at + 13]), time.sleep(0.05)) for at in range(0, len(whole), 13)]
        )
        sender.start()
        self.addCleanup(sender.join)
        self.assertEqual(channel.recv().payload, b"in three pieces")


class Environment(ChannelTestCase):
    def child(self, code: str, **kwargs):
        """Starts `code` in a Python child with a channel; returns the process and our end."""
        env = kwargs.pop("env", dict(os.environ))
        env["PYTHONPATH"] = MODULE_DIR
        process, channel = cx.spawn_with_channel([sys.executable, "-c", textwrap.dedent(code)], env=env, **kwargs)
        self.addCleanup(channel.close)
        channel.settimeout(SUBPROCESS_TIMEOUT)
        return process, channel

    def test_the_channel_is_taken_from_the_environment_once(self):
        process, channel = self.child(
            """
            import os
            import cuda_mem_exchange as cx

            # A failed call takes nothing.
            inode = os.environ.pop(cx.CHANNEL_INODE_ENV)
            try:
                cx.Channel.from_env()
                raise SystemExit("taken without its inode")
            except cx.ExchangeError:
                pass
            os.environ[cx.CHANNEL_INODE_ENV] = inode
            first = cx.Channel.from_env()
            try:
                second = cx.Channel.from_env()
            except cx.ExchangeError as error:
                first.send(cx.DATA, f"refused: {error}".encode())
            else:
                first.send(cx.DATA, f"taken twice: {first.fileno()} and {second.fileno()}".encode())
            """
        )
        answer = channel.recv().payload.decode()
        self.assertEqual(process.wait(SUBPROCESS_TIMEOUT), 0)
        self.assertTrue(answer.startswith("refused: "), answer)
        self.assertIn("already taken", answer)

    def test_the_childs_descriptor_is_above_2(self):
        # A parent whose standard input and error are closed: the socket pair gets 0 and 2, and the
        # child's end must not stay 2, where the child's standard error goes.
        result = run_python(
            f"""
            import os, sys, traceback
            os.close(0)
            os.close(2)
            try:
                import cuda_mem_exchange as cx
                process, channel = cx.spawn_with_channel(
                    [sys.executable, "-c", {CHILD_REPORTING_ITS_FD!r}],
                    env=dict(os.environ, PYTHONPATH={MODULE_DIR!r}),
                )
                channel.settimeout({SUBPROCESS_TIMEOUT})
                print("parent's end", channel.fileno())
                print("child's end", channel.recv().payload.decode())
                print("child exited", process.wait({SUBPROCESS_TIMEOUT}))
            except BaseException:
                traceback.print_exc(file=sys.stdout)
            """
        )
        lines = dict(line.rsplit(" ", 1) for line in result.stdout.decode().splitlines() if " " in line)
        self.assertIn("child's end", lines, result.stdout.decode())
        self.assertEqual(lines["parent's end"], "0", "the test's premise: descriptor 0 was free")
        self.assertGreaterEqual(int(lines["child's end"]), 3)
        self.assertEqual(lines["child exited"], "0")

    def test_an_empty_environment_is_respected(self):
        with mock.patch.dict(os.environ, {"CUDA_MEM_TEST_PARENT_ONLY": "1"}):
            process, channel = cx.spawn_with_channel(
                [sys.executable, "-c", "import json, os; print(json.dumps(sorted(os.environ)))"],
                env={},
                stdout=subprocess.PIPE,
            )
        self.addCleanup(channel.close)
        output, _ = process.communicate(timeout=SUBPROCESS_TIMEOUT)
        names = set(json.loads(output.decode()))
        # Python may set LC_CTYPE itself (PEP 538, on the C locale).
        self.assertEqual(names - {"LC_CTYPE"}, {cx.CHANNEL_FD_ENV, cx.CHANNEL_INODE_ENV})

    def test_a_given_environment_is_the_childs(self):
        process, channel = cx.spawn_with_channel(
            [sys.executable, "-c", "import os; print(os.environ.get('CUDA_MEM_TEST_GIVEN'))"],
            env={"CUDA_MEM_TEST_GIVEN": "given"},
            stdout=subprocess.PIPE,
        )
        self.addCleanup(channel.close)
        output, _ = process.communicate(timeout=SUBPROCESS_TIMEOUT)
        self.assertEqual(output.decode().strip(), "given")


# The child of `test_the_childs_descriptor_is_above_2`: takes its channel and sends its number.
CHILD_REPORTING_ITS_FD = """
import cuda_mem_exchange as cx
channel = cx.Channel.from_env()
channel.send(cx.DATA, str(channel.fileno()).encode())
"""


class FakePool:
    """Enough of an IPC-enabled cuda.core pool for `IpcChannel.uuid_of`."""

    def __init__(self, ipc_enabled: bool = True, uuid=None, mapped: bool = False):
        self.is_ipc_enabled = ipc_enabled
        self.uuid = uuid or (uuidlib.uuid4() if ipc_enabled else None)
        self.is_mapped = mapped


class FakeDescriptor:
    """Enough of a cuda.core `IPCBufferDescriptor` (its pickling contract, and its size)."""

    def __init__(self, size: int):
        self.size = size

    def __reduce__(self):
        return (None, (bytes(range(cx.EXPORT_DATA_LEN)), self.size))


class FakeBuffer:
    def __init__(self, pool, size: int = 64, exportable: bool = True):
        self.memory_resource = pool
        self.size = size
        self.exportable = exportable

    @property
    def ipc_descriptor(self):
        if not self.exportable:
            raise RuntimeError("this buffer cannot be exported")
        return FakeDescriptor(self.size)


class RecordingChannel:
    """A `Channel` that records what is sent."""

    def __init__(self):
        self.sent = []

    def send(self, kind, payload=b"", fds=()):
        self.sent.append((kind, bytes(payload), list(fds)))


class SendingBuffers(unittest.TestCase):
    def channel(self):
        channel = cx.IpcChannel(RecordingChannel())
        # Pools "sent" by the old path, which sent each before looking at the next buffer.
        channel.send_resource = lambda mr: channel.channel.sent.append(("send_resource", mr))
        return channel

    def test_a_buffer_that_cannot_be_shared_sends_nothing(self):
        for bad in (FakeBuffer(FakePool(ipc_enabled=False)), FakeBuffer(FakePool(), exportable=False)):
            with self.subTest(bad=bad):
                channel = self.channel()
                with self.assertRaises((cx.ExchangeError, RuntimeError)):
                    channel.send_buffers([FakeBuffer(FakePool()), bad])
                self.assertEqual(channel.channel.sent, [], "a pool was sent before every buffer was checked")
                self.assertEqual(channel._sent, {})

    def test_each_unsent_pool_goes_once_before_the_buffers(self):
        channel = cx.IpcChannel(RecordingChannel())
        first, second = FakePool(), FakePool()
        channel._resource_message = lambda mr: (mr.uuid, mr.uuid.bytes, 100)
        channel.send_buffers([FakeBuffer(first), FakeBuffer(second, 8), FakeBuffer(first, 1)])
        kinds = [kind for kind, _, _ in channel.channel.sent]
        self.assertEqual(kinds, [cx.RESOURCE, cx.RESOURCE, cx.BUFFERS])
        self.assertEqual([payload for _, payload, _ in channel.channel.sent[:2]], [first.uuid.bytes, second.uuid.bytes])
        payload = channel.channel.sent[2][1]
        self.assertEqual(struct.unpack_from("<I", payload), (3,))
        step = cx.BUFFER_DESCRIPTOR_LEN
        sizes = [cx.decode_buffer_descriptor(payload[at : at + step])[1] for at in range(4, len(payload), step)]
        self.assertEqual(sizes, [64, 8, 1])
        # Sent pools are not sent again.
        channel.send_buffers([FakeBuffer(second)])
        self.assertEqual([kind for kind, _, _ in channel.channel.sent[3:]], [cx.BUFFERS])


class OnePoolPerUuid(unittest.TestCase):
    """A relay that imported two pools under one UUID sends only the first on a channel."""

    def channel(self):
        channel = cx.IpcChannel(RecordingChannel())
        channel._resource_message = lambda mr: (mr.uuid, mr.uuid.bytes, 100)
        return channel

    def two_imports(self):
        uuid = uuidlib.uuid4()
        return FakePool(uuid=uuid, mapped=True), FakePool(uuid=uuid, mapped=True)

    def test_a_second_import_under_a_sent_uuid_sends_nothing(self):
        channel = self.channel()
        first, second = self.two_imports()
        channel.send_buffers([FakeBuffer(first)])
        sent = list(channel.channel.sent)
        for send in (lambda: channel.send_buffers([FakeBuffer(second)]), lambda: channel.send_resource(second)):
            with self.assertRaises(cx.UuidTakenOnChannel) as caught:
                send()
            self.assertEqual(caught.exception.uuid, first.uuid)
            self.assertEqual(channel.channel.sent, sent, "something of the refused pool was sent")
        # The first goes on as before.
        channel.send_buffers([FakeBuffer(first)])
        self.assertEqual([kind for kind, _, _ in channel.channel.sent[len(sent) :]], [cx.BUFFERS])

    def test_two_imports_under_one_uuid_in_one_message_send_nothing(self):
        channel = self.channel()
        first, second = self.two_imports()
        with self.assertRaises(cx.UuidTakenOnChannel):
            channel.send_buffers([FakeBuffer(first), FakeBuffer(second)])
        self.assertEqual(channel.channel.sent, [])
        self.assertEqual(channel._sent, {})

    def test_a_pool_of_this_process_under_an_imported_pools_uuid_is_refused(self):
        channel = self.channel()
        imported = FakePool(mapped=True)
        channel.send_buffers([FakeBuffer(imported)])
        with self.assertRaises(cx.UuidTakenOnChannel):
            channel.send_buffers([FakeBuffer(FakePool(uuid=imported.uuid))])

    def test_the_same_pool_and_pools_of_this_process_go_again(self):
        channel = self.channel()
        imported, local = FakePool(mapped=True), FakePool()
        for _ in range(2):
            channel.send_buffers([FakeBuffer(imported), FakeBuffer(local)])
        channel.send_resource(imported)
        channel.send_resource(local)
        kinds = [kind for kind, _, _ in channel.channel.sent]
        self.assertEqual(kinds, [cx.RESOURCE, cx.RESOURCE, cx.BUFFERS, cx.BUFFERS, cx.RESOURCE, cx.RESOURCE])


class ErrorsSayWhetherTheChannelGoesOn(ChannelTestCase):
    """Each error says whether its channel is still usable, in its ``channel_usable`` and at the
    end of its message, in cuda-mem-ipc's words (Rust's ``IpcError::channel_usable``)."""

    def expect(self, error: BaseException, cls, usable: bool) -> str:
        self.assertIsInstance(error, cls)
        self.assertEqual(error.channel_usable, usable, str(error))
        text = str(error)
        self.assertTrue(text.endswith(cx.CHANNEL_USABLE if usable else cx.CHANNEL_BROKEN), text)
        return text

    def test_the_words_are_rusts(self):
        self.assertEqual(cx.CHANNEL_USABLE, "the channel is still usable")
        self.assertEqual(cx.CHANNEL_BROKEN, "the channel is no longer usable: drop it and open a new one")

    def test_a_time_out_says_before_or_partway(self):
        channel, raw = self.raw_pair(timeout=0.1)
        with self.assertRaises(cx.ChannelTimeout) as caught:
            channel.recv()
        text = self.expect(caught.exception, cx.ChannelTimeout, True)
        self.assertIn("receiving a message on the IPC channel timed out before any byte of the message", text)
        raw.sendall(frame(cx.DATA, b"on time"))
        self.assertEqual(channel.recv().payload, b"on time")
        raw.sendall(frame(cx.DATA, b"cut short")[:30])
        with self.assertRaises(cx.ChannelTimeout) as caught:
            channel.recv()
        text = self.expect(caught.exception, cx.ChannelTimeout, False)
        self.assertIn("timed out partway through a message", text)
        with self.assertRaises(cx.ProtocolError) as caught:
            channel.recv()
        self.expect(caught.exception, cx.ProtocolError, False)

    def test_a_message_read_whole_leaves_the_channel_usable_a_bad_frame_does_not(self):
        channel, raw = self.raw_pair()
        ipc = cx.IpcChannel(channel)
        raw.sendall(frame(77, b"an unknown kind"))
        with self.assertRaises(cx.ProtocolError) as caught:
            ipc.recv(None)
        self.expect(caught.exception, cx.ProtocolError, True)
        raw.sendall(frame(cx.DATA, b"next"))
        self.assertEqual(ipc.recv(None).data, b"next")
        raw.sendall(b"GARBAGE!" + bytes(40))
        with self.assertRaises(cx.ProtocolError) as caught:
            ipc.recv(None)
        self.expect(caught.exception, cx.ProtocolError, False)
        raw.close()
        with self.assertRaises(cx.ProtocolError) as caught:
            ipc.recv(None)
        self.expect(caught.exception, cx.ProtocolError, False)

    def test_a_closed_peer_leaves_nothing_to_use(self):
        channel, raw = self.raw_pair()
        raw.close()
        with self.assertRaises(cx.PeerClosed) as caught:
            channel.recv()
        self.expect(caught.exception, cx.PeerClosed, False)

    def test_the_other_errors_of_a_channel_leave_it_usable(self):
        uuid = uuidlib.uuid4()
        for error in (
            cx.OutOfDescriptors(cx.DATA, 2),
            cx.UnknownResource(uuid),
            cx.UuidTakenOnChannel(uuid),
            cx.DeviceNotVisible(uuid, 3),
            cx.EventNotOpened(4),
            cx.MisdescribedResource(uuid, "pinned host memory pool", "device memory pool on device 0"),
            cx.PoolNotImported(uuid),
        ):
            with self.subTest(error=type(error).__name__):
                self.expect(error, type(error), True)

    def test_a_send_after_one_that_broke_the_channel(self):
        a, b = self.pair()
        a._send_broken = True
        with self.assertRaises(cx.ExchangeError) as caught:
            a.send(cx.DATA, b"after")
        self.expect(caught.exception, cx.ExchangeError, False)


class Snapshots(ChannelTestCase):
    def test_a_request_and_an_answer_round_trip_and_bad_ones_leave_the_channel_usable(self):
        a, b = self.pair()
        asker, server = cx.IpcChannel(a), cx.IpcChannel(b)
        asker.request_snapshot(max_events=7)
        self.assertEqual(server.recv(None), cx.SnapshotRequest(7))
        asker.request_snapshot()
        self.assertEqual(server.recv(None), cx.SnapshotRequest(None))
        with self.assertRaises(ValueError):
            cx.encode_snapshot_request(-1)
        snapshot = b'{"version": 1, "taken_at_ns": 0, "resources": [], "events": [], "dropped_events": 0}'
        for payload, error in (
            (snapshot, None),
            (b'{"version": 2, "resources": [], "events": []}', cx.SnapshotError),
            (b"\xff not json", cx.SnapshotError),
        ):
            a.send(cx.SNAPSHOT, payload)
            if error is None:
                self.assertEqual(server.recv(None), cx.Snapshot(cx.read_snapshot(snapshot)))
            else:
                with self.assertRaises(error):
                    server.recv(None)
        a.send(cx.SNAPSHOT_REQUEST, b"\x01\x02")
        with self.assertRaises(cx.ProtocolError) as caught:
            server.recv(None)
        self.assertTrue(caught.exception.channel_usable)
        a.send(cx.DATA, b"still in step")
        self.assertEqual(server.recv(None), cx.Data(b"still in step"))


def encoded_descriptor(uuid, size: int = 64, fill: int = 0) -> bytes:
    """A buffer descriptor of pool ``uuid``, as a peer encodes it."""
    return cx.encode_buffer_descriptor(bytes([fill]) * cx.EXPORT_DATA_LEN, size, uuid)


def buffers_payload(*encoded: bytes) -> bytes:
    """What a buffers message (and a returned-buffers message) carries."""
    return struct.pack("<I", len(encoded)) + b"".join(encoded)


class FakeMappedBuffer:
    """Enough of a cuda.core buffer mapped from a peer for `IpcChannel.give_back`: its pool, its
    address, and a `close` that records the stream it was freed on into ``log``."""

    def __init__(self, pool, log: list, address: int = 0x7000_0000):
        self.memory_resource = pool
        self.handle = address
        self.log = log

    def close(self, stream=None):
        self.log.append(("close", self.handle, stream))
        self.handle = 0


class FakeStream:
    """A stream whose `sync` is recorded into ``log``."""

    def __init__(self, log: list):
        self.log = log

    def sync(self):
        self.log.append(("sync",))


class ReturnedBuffers(ChannelTestCase):
    """Kind 9: buffers a peer lent (Rust's ``IpcChannel::lend``), handed back."""

    def test_the_kind_and_its_name_are_rusts(self):
        self.assertEqual(cx.RETURNED, 9)
        self.assertEqual(cx._kind_name(cx.RETURNED), "9 (returned buffers)")
        self.assertIn("9 (returned buffers)", cx._RECEIVED_KINDS)

    def test_a_returned_message_from_a_raw_peer_is_its_decoded_descriptors(self):
        channel, raw = self.raw_pair()
        ipc = cx.IpcChannel(channel)
        first, second = uuidlib.uuid4(), uuidlib.uuid4()
        encoded = [encoded_descriptor(first, 64, 1), encoded_descriptor(second, 1, 2), encoded_descriptor(first, 8, 3)]
        raw.sendall(frame(cx.RETURNED, buffers_payload(*encoded)))
        # No cuda.core is needed to receive it: no stream.
        received = ipc.recv(None)
        self.assertEqual(received, cx.Returned([cx.decode_buffer_descriptor(e) for e in encoded]))
        self.assertEqual([(size, uuid) for _, size, uuid in received.descriptors], [(64, first), (1, second), (8, first)])
        self.assertEqual(received.descriptors[2][0], bytes([3]) * cx.EXPORT_DATA_LEN)
        raw.sendall(frame(cx.RETURNED, buffers_payload()))
        self.assertEqual(ipc.recv(None), cx.Returned([]))

    def test_a_malformed_returned_message_is_refused_and_the_channel_goes_on(self):
        channel, raw = self.raw_pair()
        ipc = cx.IpcChannel(channel)
        good = encoded_descriptor(uuidlib.uuid4())
        damaged = bytearray(good)
        damaged[20] ^= 1
        for payload, needle in (
            (b"\x01\x00", "at least 4 bytes"),
            (struct.pack("<I", 2) + good, "a buffers message for 2 buffers"),
            (struct.pack("<I", cx.MAX_BUFFERS_PER_MESSAGE + 1), "a buffers message's count"),
            (buffers_payload(bytes(damaged)), "checksum"),
        ):
            with self.subTest(needle=needle):
                raw.sendall(frame(cx.RETURNED, payload))
                with self.assertRaises(cx.ProtocolError) as caught:
                    ipc.recv(None)
                self.assertIn(needle, str(caught.exception))
                self.assertTrue(caught.exception.channel_usable)
        # With a descriptor: refused, the descriptor closed.
        r, w = self.pipe()
        peer = cx.Channel(raw.dup())
        self.addCleanup(peer.close)
        peer.send(cx.RETURNED, buffers_payload(good), [r])
        with self.assertRaises(cx.ProtocolError) as caught:
            ipc.recv(None)
        self.assertIn("file descriptors with a 9 (returned buffers) message", str(caught.exception))
        raw.sendall(frame(cx.DATA, b"still in step"))
        self.assertEqual(ipc.recv(None), cx.Data(b"still in step"))

    def borrower(self):
        """A borrower's channel, its peer's end, a pool received on it and the log of frees."""
        a, b = self.pair()
        borrower = cx.IpcChannel(a)
        uuid = uuidlib.uuid4()
        pool = FakePool(uuid=uuid, mapped=True)
        borrower._received[uuid] = pool
        return borrower, cx.IpcChannel(b), pool, []

    def received(self, borrower, pool, log, size: int = 64, address: int = 0x7000_0000):
        """A buffer as `IpcChannel.recv` would have mapped it on ``borrower``, and its descriptor."""
        buffer = FakeMappedBuffer(pool, log, address)
        encoded = encoded_descriptor(pool.uuid, size, address & 0xFF)
        borrower._remember_mapped(buffer, encoded, pool.uuid)
        return buffer, encoded

    def test_give_back_frees_on_the_stream_waits_then_sends_the_descriptors_as_they_came(self):
        borrower, lender, pool, log = self.borrower()
        one, first = self.received(borrower, pool, log, 64, 0x7000_0000)
        two, second = self.received(borrower, pool, log, 8, 0x7000_1000)
        stream = FakeStream(log)
        borrower.give_back([two, one], stream)
        self.assertEqual(log, [("close", 0x7000_1000, stream), ("close", 0x7000_0000, stream), ("sync",)])
        self.assertEqual(lender.recv(None), cx.Returned([cx.decode_buffer_descriptor(e) for e in (second, first)]))
        # Given back: not the channel's any more.
        with self.assertRaises(cx.NotReceivedHere):
            borrower.give_back([one], stream)
        self.assertEqual(borrower._mapped, {})

    def assert_nothing_freed_or_sent(self, lender, log):
        """Nothing was closed or synchronized (``log``), and nothing reached ``lender``."""
        self.assertEqual(log, [], "something was freed")
        lender.channel.settimeout(0.05)
        with self.assertRaises(cx.ChannelTimeout):
            lender.recv(None)
        lender.channel.settimeout(20)

    def test_a_buffer_not_received_here_frees_and_sends_nothing(self):
        borrower, lender, pool, log = self.borrower()
        good, _ = self.received(borrower, pool, log)
        other_pool = FakePool(uuid=uuidlib.uuid4(), mapped=True)
        stranger = FakeMappedBuffer(other_pool, log, 0x9000_0000)
        with self.assertRaises(cx.NotReceivedHere) as caught:
            borrower.give_back([good, stranger], FakeStream(log))
        error = caught.exception
        self.assertEqual((error.index, error.ptr), (1, 0x9000_0000))
        self.assertTrue(error.channel_usable)
        self.assertIn("buffer 1 (0x90000000) was not received on this channel", str(error))
        self.assertIn("nothing was freed or sent", str(error))
        self.assertTrue(str(error).endswith(cx.CHANNEL_USABLE))
        self.assert_nothing_freed_or_sent(lender, log)
        # The good one can still be given back.
        borrower.give_back([good], FakeStream(log))
        self.assertEqual(len(lender.recv(None).descriptors), 1)

    def test_closed_duplicated_and_released_buffers_free_and_send_nothing(self):
        borrower, lender, pool, log = self.borrower()
        good, _ = self.received(borrower, pool, log)
        closed, _ = self.received(borrower, pool, log, address=0x7000_2000)
        closed.handle = 0  # closed by hand (cuda.core zeroes a closed buffer's handle)
        with self.assertRaises(cx.NotReceivedHere) as caught:
            borrower.give_back([good, closed], FakeStream(log))
        self.assertIn("it was closed", str(caught.exception))
        with self.assertRaises(cx.ExchangeError) as caught:
            borrower.give_back([good, good], FakeStream(log))
        self.assertIn("twice", str(caught.exception))
        with self.assertRaises(cx.ExchangeError) as caught:
            borrower.give_back([good] * (cx.MAX_BUFFERS_PER_MESSAGE + 1), FakeStream(log))
        self.assertIn("more than one message carries", str(caught.exception))
        borrower.release_resource(pool.uuid)
        with self.assertRaises(cx.NotReceivedHere) as caught:
            borrower.give_back([good], FakeStream(log))
        self.assertIn("was released", str(caught.exception))
        self.assert_nothing_freed_or_sent(lender, log)

    def test_a_collected_buffer_is_forgotten(self):
        borrower, _, pool, log = self.borrower()
        buffer, _ = self.received(borrower, pool, log)
        self.assertEqual(len(borrower._mapped), 1)
        del buffer
        self.assertEqual(borrower._mapped, {})

    def test_the_new_error_is_an_exchange_error(self):
        self.assertTrue(issubclass(cx.NotReceivedHere, cx.ExchangeError))
        for name in ("RETURNED", "Returned", "NotReceivedHere"):
            self.assertIn(name, cx.__all__)


class Listeners(unittest.TestCase):
    def test_abstract_names_connect_and_the_default_admits_this_user_only(self):
        name = f"cuda-mem-test-{os.getpid()}-{time.monotonic_ns()}"
        listener = cx.Channel.listen_abstract(name)
        self.addCleanup(listener.close)
        client = cx.Channel.connect_abstract(name)
        self.addCleanup(client.close)
        server = cx.Channel.accept(listener)
        self.addCleanup(server.close)
        self.assertEqual(server.peer_credentials(), cx.PeerCredentials(os.getpid(), os.geteuid(), os.getegid()))
        client.send(cx.DATA, b"over an abstract name")
        self.assertEqual(server.recv().payload, b"over an abstract name")
        refused = cx.Channel.connect_abstract(name)
        self.addCleanup(refused.close)
        with self.assertRaises(cx.PeerRefused) as caught:
            cx.Channel.accept(listener, admit=lambda peer: peer.pid != os.getpid())
        self.assertTrue(caught.exception.channel_usable)
        self.assertIn(f"process {os.getpid()}", str(caught.exception))
        refused.settimeout(5)
        with self.assertRaises(cx.PeerClosed):
            refused.recv()


if __name__ == "__main__":
    program = unittest.main(exit=False, verbosity=2)
    if not program.result.wasSuccessful():
        sys.exit(1)
    print("test_channel: ok", flush=True)
