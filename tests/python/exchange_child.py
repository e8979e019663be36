"""The Python child of `tests/tests/python_exchange.rs`: started by a Rust parent with
`cuda_mem_ipc::spawn_with_channel`, it imports the parent's pools and buffers with cuda.core
through `cuda_mem_exchange`, checks and rewrites them. Usage: `exchange_child.py
roundtrip|mismatch|events`.

Protocol with the parent: the parent sends the seeds of its buffers (u32 LE each), then the
buffers (each pool first); buffer i holds `pattern(seed_i)`; the child writes `pattern(seed_i +
100)` into it and answers b"rewritten". In `mismatch`, a message of an unknown kind, a
resource message of an unknown memory kind, the device pool described as pinned memory and a
descriptor that is no pool (`/dev/null`) come first, each answered with the child's error text
(each says the channel is still usable, which the round trip then shows); then the round trip; then a buffer descriptor of the device pool claiming far more than its
allocation, and the device pool again after this side closed its import of it; then a frame of
another version, each answered likewise. In `events`, one buffer arrives behind the parent's IPC
event (its fill is held pending there until this side says b"enqueued"): a copy enqueued on the
receiving stream sees the fill; then this side fills the buffer with 9s and sends its own IPC
event instead of synchronizing, kept until the parent's b"bye".
"""

import ctypes

import sys

from cuda.core import DeviceMemoryResource, EventOptions, LegacyPinnedMemoryResource
from cuda.core._utils.cuda_utils import CUDAError
from exchange_common import RECV_TIMEOUT, cx, expect, pattern, read_bytes, refusal, refused, setup, u32s, write_bytes


def events(channel, stream) -> None:
    expect(channel.recv(stream), cx.Resource)
    (buffer,) = expect(channel.recv(stream), cx.Buffers).buffers
    stage = LegacyPinnedMemoryResource().allocate(buffer.size, stream=stream)
    stage.copy_from(buffer, stream=stream)
    channel.send_data(b"enqueued")
    stream.sync()
    assert ctypes.string_at(int(stage.handle), buffer.size) == bytes([7]) * buffer.size, "the copy ran first"
    buffer.fill(9, stream=stream)
    written = stream.record(options=EventOptions(ipc_enabled=True))
    channel.send_event(written)
    assert expect(channel.recv(stream), cx.Data).data == b"bye"
    for b in (stage, buffer):
        b.close(stream)
    stream.sync()


def round_trip(channel, stream) -> list:
    """The round trip; returns the pools (`cx.Resource`) that came with it."""
    seeds = u32s(expect(channel.recv(stream), cx.Data).data)
    pools = []
    while True:
        message = channel.recv(stream)
        if isinstance(message, cx.Buffers):
            break
        pools.append(expect(message, cx.Resource))
    kinds = [type(pool.resource).__name__ for pool in pools]
    buffers = message.buffers
    print(f"pools {kinds}, buffers {[b.size for b in buffers]}", flush=True)
    assert len(buffers) == len(seeds), (len(buffers), seeds)
    for seed, buffer in zip(seeds, buffers):
        assert buffer.is_mapped
        assert read_bytes(buffer, stream) == pattern(seed, buffer.size), f"buffer of seed {seed}: the parent's bytes"
        write_bytes(buffer, pattern(seed + 100, buffer.size), stream)
    channel.send_data(b"rewritten")
    for buffer in buffers:
        buffer.close(stream)
    stream.sync()
    return pools


def main(mode: str) -> None:
    _, stream = setup()
    raw = cx.Channel.from_env()
    raw.settimeout(RECV_TIMEOUT)
    channel = cx.IpcChannel(raw)
    if mode == "mismatch":
        text = refused(channel, stream, cx.ProtocolError, "message kind", "received 77")
        channel.send_data(text.encode())
        text = refused(channel, stream, cx.ProtocolError, "memory kind", "0 (device) or 1 (pinned)", "received 7")
        channel.send_data(text.encode())
        # The peer's word against the imported pool's: the driver reports device memory.
        text = refused(channel, stream, cx.MisdescribedResource, "as a pinned host memory pool", cx.CHANNEL_USABLE)
        channel.send_data(text.encode())
        # A GPU's code for a descriptor that is no pool's is the probe's open question 25: a code
        # other than INVALID_VALUE or INVALID_HANDLE stays cuda.core's error (the parent checks
        # the simulator's answer).
        error = refusal(channel, stream, (cx.PoolNotImported, CUDAError))
        if isinstance(error, cx.PoolNotImported):
            assert cx.CHANNEL_USABLE in str(error), str(error)
            assert str(error.__cause__).startswith("CUDA_ERROR_INVALID_"), f"the driver's refusal is the cause: {error!r}"
        channel.send_data(str(error).encode())
    if mode == "events":
        events(channel, stream)
        print(f"python-child: ok {mode}", flush=True)
        return
    pools = round_trip(channel, stream)
    if mode == "mismatch":
        text = refused(
            channel, stream, cx.ProtocolError, "exceeds mapped allocation extent", "the peer sent a bad size"
        )
        channel.send_data(text.encode())
        (device_pool,) = [pool for pool in pools if isinstance(pool.resource, DeviceMemoryResource)]
        channel.release_resource(device_pool.uuid).close()
        text = refused(channel, stream, cx.ExchangeError, "imported in this process before", "has been closed")
        channel.send_data(text.encode())
        text = refused(channel, stream, cx.ProtocolError, "frame version", "expected 1, received 2")
        channel.send_data(text.encode())
    print(f"python-child: ok {mode}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
