"""Helpers of the Python sides of `tests/tests/python_exchange.rs` (cuda.core on the simulator,
sharing pools and buffers with Rust through `python/cuda_mem_exchange.py`)."""

import ctypes
import os
import struct
import sys

# The module under test, from the repository (not installed).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import cuda_mem_exchange as cx  # noqa: E402
from cuda.core import Device, LegacyPinnedMemoryResource, PinnedMemoryResource  # noqa: E402

# How long one receive waits before the test fails (the Rust side's RECV_TIMEOUT).
RECV_TIMEOUT = 60.0


def pattern(seed: int, length: int) -> bytes:
    """The Rust tests' `common::pattern`: bytes that differ for each seed."""
    out = bytearray(length)
    for i in range(length):
        x = (((i + seed * 0x9E3779B9) & 0xFFFFFFFF) * 0x85EBCA6B) & 0xFFFFFFFF
        out[i] = ((x >> 24) ^ (i >> 8)) & 0xFF
    return bytes(out)


def setup():
    """Device 0, current, and a stream on it."""
    device = Device(0)
    device.set_current()
    return device, device.create_stream()


def _is_pinned_pool(buffer) -> bool:
    # A pinned pool's memory is host memory that no device may reach until the pool grants it
    # (cuMemPoolSetAccess, which cuda.core's PinnedMemoryResource does not offer), so the host
    # reads and writes it directly.
    return isinstance(buffer.memory_resource, PinnedMemoryResource)


def write_bytes(buffer, data: bytes, stream) -> None:
    """Writes `data` into a cuda.core buffer (through a pinned staging buffer for device
    memory), and waits."""
    assert buffer.size == len(data), (buffer.size, len(data))
    if _is_pinned_pool(buffer):
        stream.sync()
        ctypes.memmove(int(buffer.handle), data, len(data))
        return
    stage = LegacyPinnedMemoryResource().allocate(len(data), stream=stream)
    ctypes.memmove(int(stage.handle), data, len(data))
    buffer.copy_from(stage, stream=stream)
    stream.sync()
    stage.close(stream)


def read_bytes(buffer, stream) -> bytes:
    """The bytes of a cuda.core buffer (copied out through a pinned staging buffer for device
    memory)."""
    if _is_pinned_pool(buffer):
        stream.sync()
        return ctypes.string_at(int(buffer.handle), buffer.size)
    stage = LegacyPinnedMemoryResource().allocate(buffer.size, stream=stream)
    stage.copy_from(buffer, stream=stream)
    stream.sync()
    data = ctypes.string_at(int(stage.handle), buffer.size)
    stage.close(stream)
    return data


def u32s(data: bytes) -> list:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def expect(message, cls):
    """`message`, which must be a `cls` (a Resource, Buffers or Data)."""
    assert isinstance(message, cls), f"expected {cls.__name__}, received {message!r}"
    return message


def refused(channel, stream, expected_error, *needles) -> str:
    """Receives a message that must be refused with `expected_error` whose text holds each of
    `needles`; returns the text."""
    return str(refusal(channel, stream, expected_error, *needles))


def refusal(channel, stream, expected_error, *needles) -> BaseException:
    """As `refused`, returning the error itself."""
    try:
        message = channel.recv(stream)
    except expected_error as error:
        text = str(error)
        for needle in needles:
            assert needle in text, f"{needle!r} not in {text!r}"
        print(f"refused as expected: {text}", flush=True)
        return error
    raise AssertionError(f"expected {expected_error!r}, received {message!r}")
