"""The Python parent of `tests/tests/python_exchange.rs`: creates IPC-enabled cuda.core pools
(device and pinned) and buffers, and sends them through `cuda_mem_exchange` to a Rust child (the
test binary, re-run for one test: `CUDA_MEM_EXCHANGE_CHILD` is its path, `CUDA_MEM_EXCHANGE_TEST`
the test's name), which imports them with cuda-mem-ipc, checks and rewrites them.
Usage: `exchange_parent.py roundtrip|mismatch`.

The protocol is `exchange_child.py`'s, the roles swapped. In `mismatch`, the child is sent a
message of an unknown kind, the device pool described as pinned memory, a descriptor that is no
pool (`/dev/null`) and a buffer descriptor of another version first, then the round trip, then a
frame of another version; it answers each refusal with its error's text.
"""

import os
import struct
import subprocess
import sys
import zlib

from cuda.core import DeviceMemoryResource, DeviceMemoryResourceOptions, PinnedMemoryResource, PinnedMemoryResourceOptions

from exchange_common import RECV_TIMEOUT, cx, expect, pattern, read_bytes, setup, write_bytes

# The Rust tests' role variable (tests/tests/common: ROLE_ENV).
ROLE_ENV = "CUDA_MEM_TESTS_ROLE"
DEVICE_SIZES = [1 << 16, 1000, 1]
PINNED_SIZES = [4096]


def answer(channel, stream, *needles) -> None:
    text = expect(channel.recv(stream), cx.Data).data.decode()
    for needle in needles:
        assert needle in text, f"{needle!r} not in the child's answer {text!r}"
    print(f"the Rust child refused as expected: {text}", flush=True)


def main(mode: str) -> None:
    device, stream = setup()
    device_pool = DeviceMemoryResource(device, DeviceMemoryResourceOptions(ipc_enabled=True))
    pinned_pool = PinnedMemoryResource(PinnedMemoryResourceOptions(ipc_enabled=True))
    buffers = [device_pool.allocate(n, stream=stream) for n in DEVICE_SIZES]
    buffers += [pinned_pool.allocate(n, stream=stream) for n in PINNED_SIZES]
    seeds = [11 + i for i in range(len(buffers))]
    for seed, buffer in zip(seeds, buffers):
        write_bytes(buffer, pattern(seed, buffer.size), stream)

    test = os.environ["CUDA_MEM_EXCHANGE_TEST"]
    env = dict(os.environ, **{ROLE_ENV: f"python-parent-{mode}"})
    args = [os.environ["CUDA_MEM_EXCHANGE_CHILD"], "--exact", test, "--nocapture", "--test-threads=1"]
    process, raw = cx.spawn_with_channel(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        raw.settimeout(RECV_TIMEOUT)
        channel = cx.IpcChannel(raw)
        if mode == "mismatch":
            raw.send(77, b"an unknown kind")
            answer(channel, stream, "unknown message kind 77", cx.CHANNEL_USABLE)
            # The device pool described as pinned memory: the Rust side asks the driver too.
            uuid = device_pool.uuid
            pinned = struct.pack("<16sBi3x", uuid.bytes, cx.PINNED_MEMORY, -1) + bytes(16)
            raw.send(cx.RESOURCE, pinned, [device_pool.allocation_handle.handle])
            answer(
                channel,
                stream,
                f"the peer described memory pool {uuid} as a pinned host memory pool, but the driver reports a device "
                "memory pool on device 0",
                cx.CHANNEL_USABLE,
            )
            with open(os.devnull, "rb") as null:
                claim = struct.pack("<16sBi3x", uuid.bytes, cx.DEVICE_MEMORY, 0) + cx._device_uuid(device)
                raw.send(cx.RESOURCE, claim, [null.fileno()])
            # The Rust child checks what it is (the peer's error where the code says so).
            answer(channel, stream)
            # A well-formed descriptor (checksum included) of version 2, after its pool.
            channel.send_resource(device_pool)
            descriptor = buffers[0].ipc_descriptor
            encoded = bytearray(cx.encode_buffer_descriptor(cx._export_data(descriptor), descriptor.size, device_pool.uuid))
            encoded[8:10] = struct.pack("<H", 2)
            encoded[104:] = struct.pack("<I", zlib.crc32(bytes(encoded[:104])))
            raw.send(cx.BUFFERS, struct.pack("<I", 1) + bytes(encoded))
            answer(channel, stream, "unsupported descriptor version 2, expected 1")
        channel.send_data(struct.pack(f"<{len(seeds)}I", *seeds))
        channel.send_buffers(buffers)
        assert expect(channel.recv(stream), cx.Data).data == b"rewritten"
        for seed, buffer in zip(seeds, buffers):
            assert read_bytes(buffer, stream) == pattern(seed + 100, buffer.size), f"buffer of seed {seed}: the child's bytes"
        if mode == "mismatch":
            raw.send_frame(struct.pack("<8sHHIII", b"CUMEMMSG", 2, cx.DATA, 0, 0, 0))
            answer(channel, stream, "unsupported frame version 2, expected 1")
        output, _ = process.communicate(timeout=RECV_TIMEOUT)
    except BaseException:
        # Show what the Rust child said: its failure is usually the cause.
        if process.poll() is None:
            process.kill()
        output, _ = process.communicate()
        print(f"--- the Rust child ({process.returncode}):\n{output.decode(errors='replace')}", file=sys.stderr)
        raise
    text = output.decode(errors="replace")
    assert process.returncode == 0 and "1 passed" in text, f"the Rust child failed ({process.returncode}):\n{text}"
    for buffer in buffers:
        buffer.close(stream)
    stream.sync()
    print(f"python-parent: ok {mode}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
