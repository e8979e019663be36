"""A worker of an example server that lends buffers (Rust's ``IpcChannel::lend``): it fills each
buffer lent to it and hands it back (``cuda_mem_exchange.IpcChannel.give_back``, a returned-buffers
message, kind 9).

Usage: ``python serve_worker.py NAME BYTE``. Connects to the server's listener at ``NAME`` in the
abstract namespace (Rust's ``ChannelListener::bind_abstract``), imports what the server sends
with cuda.core on device 0. It first sends its byte (one byte of data), then, until the server
sends the data ``b"stop"``:

- a pool (a resource message): kept by the channel, for the buffers that follow;
- buffers: fills every byte of each with ``BYTE`` (0 to 255) on its stream, then gives them back
  (freed on the stream, the stream waited for, then the returned-buffers message);
- anything else: exits with an error message (status 1).

At the end it prints one line, ``python worker BYTE: N buffers`` (N: how many it filled and gave
back), and exits 0. On the simulator, ``LD_LIBRARY_PATH`` must lead to the server's simulator as
``libcuda.so.1`` (see ``tests/tests/common/python.rs``, ``use_this_simulator``), so that both
processes simulate one machine.
"""

from __future__ import annotations

import os
import sys

# The module, from the repository (not installed).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import cuda_mem_exchange as cx  # noqa: E402

# How long one receive waits for the server before the worker gives up (seconds).
RECV_TIMEOUT = 60.0

USAGE = "usage: serve_worker.py NAME BYTE (NAME: the server's abstract socket name, BYTE: 0 to 255)"


def parse(argv: list[str]) -> tuple[str, int]:
    """The socket name and the byte from the command line, or a usage error (``SystemExit``)."""
    if len(argv) != 3:
        sys.exit(USAGE)
    name, text = argv[1], argv[2]
    try:
        byte = int(text, 0)
    except ValueError:
        sys.exit(f"BYTE must be a number, not {text!r}; {USAGE}")
    if not 0 <= byte <= 255:
        sys.exit(f"BYTE must be 0 to 255, not {byte}; {USAGE}")
    return name, byte


def serve(ipc: cx.IpcChannel, stream, byte: int) -> int:
    """Says which byte it writes (one byte of data, the server's first message from a worker),
    then fills and gives back what the server lends until it says ``b"stop"``; returns how many
    buffers came."""
    ipc.send_data(bytes([byte]))
    served = 0
    while True:
        message = ipc.recv(stream)
        if isinstance(message, cx.Resource):
            continue  # the pool of buffers to come: the channel keeps it
        if isinstance(message, cx.Buffers):
            for buffer in message.buffers:
                buffer.fill(byte, stream=stream)
            # give_back closes each buffer on `stream` after the fills and waits for it.
            ipc.give_back(message.buffers, stream)
            served += len(message.buffers)
            continue
        if isinstance(message, cx.Data) and message.data == b"stop":
            return served
        raise cx.ExchangeError(f"the server sent {message!r}; expected a pool, buffers or the data b'stop'")


def main(argv: list[str]) -> int:
    name, byte = parse(argv)
    from cuda.core import Device

    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    try:
        channel = cx.Channel.connect_abstract(name)
    except OSError as error:
        sys.exit(f"python worker {byte}: cannot connect to the abstract socket {name!r}: {error}")
    channel.settimeout(RECV_TIMEOUT)
    with channel:
        try:
            served = serve(cx.IpcChannel(channel), stream, byte)
        except cx.ExchangeError as error:
            sys.exit(f"python worker {byte}: {error}")
    print(f"python worker {byte}: {served} buffers", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
