"""Reads a memory snapshot pickle written by `MemorySnapshot::write_torch_pickle` as PyTorch's
memory viewer (torch/utils/viz/MemoryViz.js) reads it, and checks it.

usage: torch_snapshot.py SNAPSHOT.pickle EXPECTED_JSON

1. Every opcode is one the viewer's own unpickler reads, and the protocol is 2 to 4.
2. The structure is PyTorch's: each segment's blocks are contiguous from its address and add up
   to its size; states, actions and frames are PyTorch's. Then the viewer's "Allocator State
   History" walk: from the final segments and active blocks, each trace event is undone, newest
   first, as MemoryViz.js does; no undo may miss the block or segment it changes, and after each
   one every active block lies in a segment (the viewer looks each up to draw it).
3. The figures are those the Rust side gives in EXPECTED_JSON.

With `torch` importable, `torch.cuda._memory_viz`'s `segsum` and `trace` read it too.
"""

import json
import pickle
import pickletools
import sys

# The opcodes MemoryViz.js's `unpickle` handles; anything else throws there.
ACCEPTED = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BININT", "BININT1", "BININT2", "LONG1",
    "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE", "NEWTRUE", "NEWFALSE",
}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}


def check_opcodes(data):
    ops = list(pickletools.genops(data))
    first, protocol, _ = ops[0]
    assert first.name == "PROTO" and 2 <= protocol <= 4, f"protocol {first.name} {protocol}"
    for op, arg, pos in ops:
        assert op.name in ACCEPTED, f"{op.name} at byte {pos} is not an opcode the viewer reads"
        if op.name == "LONG1":
            # More than 8 bytes becomes a BigInt in the viewer, which its arithmetic refuses.
            assert data[pos + 1] <= 8, f"a LONG1 of {data[pos + 1]} bytes at {pos}"
    print(f"opcodes: protocol {protocol}, {len(ops)} opcodes, all the viewer's")


def check_frames(frames, where):
    assert isinstance(frames, list), where
    for frame in frames:
        assert set(frame) == {"filename", "line", "name"}, (where, frame)
        assert isinstance(frame["line"], int) and isinstance(frame["name"], str), (where, frame)


def check_structure(snapshot):
    assert set(snapshot) >= {"segments", "device_traces", "allocator_settings"}, snapshot.keys()
    for segment in snapshot["segments"]:
        assert set(segment) == SEGMENT_KEYS, segment.keys()
        address = segment["address"]
        for block in segment["blocks"]:
            assert block["address"] == address, f"blocks not contiguous at {address:#x}: {segment}"
            assert block["state"] in STATES, block
            assert 0 <= block["requested_size"] <= block["size"], block
            check_frames(block["frames"], block)
            address += block["size"]
        assert address == segment["address"] + segment["total_size"], f"blocks do not add up: {segment}"
        assert len(segment["segment_pool_id"]) == 2 and segment["segment_type"] in {"small", "large"}
        check_frames(segment["frames"], segment)
    devices = {segment["device"] for segment in snapshot["segments"]}
    assert all(0 <= d < len(snapshot["device_traces"]) for d in devices), "a device without a trace"
    for trace in snapshot["device_traces"]:
        for entry in trace:
            assert entry["action"] in ACTIONS, entry
            placed = "device_free" if entry["action"] == "oom" else "addr"
            assert placed in entry and set(entry) == {placed, "action", "size", "stream", "time_us", "frames"}, entry
            check_frames(entry["frames"], entry)
    print(f"structure: {len(snapshot['segments'])} segments, {len(snapshot['device_traces'])} device traces")


def folded(trace):
    """The trace as the viewer's annotate_snapshot leaves it: a free_requested followed at once
    by the free_completed of its address is one `free`."""
    out = []
    for entry in trace:
        entry = dict(entry)
        if entry["action"] == "free_completed" and out and out[-1]["action"] == "free_requested" \
                and out[-1]["addr"] == entry["addr"]:
            out[-1]["action"] = "free"
            continue
        out.append(entry)
    return out


class ViewerState:
    """MemoryViz.js's `simulate_memory`: its segment list (in its order) and its active blocks."""

    def __init__(self, snapshot, device):
        self.segments = sorted(
            ({"addr": s["address"], "size": s["total_size"], "stream": s["stream"]}
             for s in snapshot["segments"] if s["device"] == device), key=lambda s: s["addr"])
        self.blocks = {}
        for segment in (s for s in snapshot["segments"] if s["device"] == device):
            for block in segment["blocks"]:
                if block["state"] != "inactive":
                    # The viewer's block address is the segment's plus the sizes before it: the
                    # block's own, as check_structure found.
                    self.blocks[block["address"]] = block["state"] == "active_pending_free"

    def map_segment(self, merge, seg):
        idx = next((i for i, s in enumerate(self.segments) if s["addr"] > seg["addr"]), -1)
        if not merge:
            self.segments.insert(idx, seg)  # like JavaScript's splice(-1, 0, seg): before the last
            return
        idx = len(self.segments) if idx == -1 else idx
        self.segments.insert(idx, seg)
        if idx + 1 < len(self.segments):
            nxt = self.segments[idx + 1]
            if seg["addr"] + seg["size"] == nxt["addr"] and seg["stream"] == nxt["stream"]:
                seg["size"] += nxt["size"]
                del self.segments[idx + 1]
        if idx > 0:
            prev = self.segments[idx - 1]
            if prev["addr"] + prev["size"] == seg["addr"] and prev["stream"] == seg["stream"]:
                prev["size"] += seg["size"]
                del self.segments[idx]

    def unmap_segment(self, merge, seg, where):
        if not merge:
            found = [i for i, s in enumerate(self.segments) if s["addr"] == seg["addr"]]
            assert found, f"{where}: no segment at {seg['addr']:#x} to take away"
            del self.segments[found[0]]
            return
        end = seg["addr"] + seg["size"]
        found = [i for i, s in enumerate(self.segments) if s["addr"] <= seg["addr"] and end <= s["addr"] + s["size"]]
        assert found, f"{where}: no segment holds {seg['addr']:#x}..{end:#x}"
        idx = found[0]
        existing = self.segments[idx]
        existing_end = existing["addr"] + existing["size"]
        if existing["addr"] == seg["addr"]:
            existing["addr"] += seg["size"]
            existing["size"] -= seg["size"]
            if existing["size"] == 0:
                del self.segments[idx]
        elif existing_end == end:
            existing["size"] -= seg["size"]
        else:
            existing["size"] = seg["addr"] - existing["addr"]
            self.segments.insert(idx + 1, {"addr": end, "size": existing_end - end, "stream": seg["stream"]})

    def undo(self, event, where):
        action, seg = event["action"], None
        if action.startswith("segment"):
            seg = {"addr": event["addr"], "size": event["size"], "stream": event["stream"]}
        if action == "free":
            self.blocks[event["addr"]] = False
        elif action == "free_requested":
            assert event["addr"] in self.blocks, f"{where}: free_requested of a block that is not there"
            self.blocks[event["addr"]] = False
        elif action == "free_completed":
            self.blocks[event["addr"]] = True
        elif action == "alloc":
            self.blocks.pop(event["addr"], None)
        elif action in ("segment_free", "segment_unmap"):
            self.map_segment(action == "segment_unmap", seg)
        elif action in ("segment_alloc", "segment_map"):
            self.unmap_segment(action == "segment_map", seg, where)

    def check_drawable(self, where):
        for addr in self.blocks:
            assert any(s["addr"] <= addr < s["addr"] + s["size"] for s in self.segments), \
                f"{where}: block {addr:#x} lies in no segment"


def walk_back(snapshot):
    steps = 0
    for device, trace in enumerate(snapshot["device_traces"]):
        state = ViewerState(snapshot, device)
        state.check_drawable(f"device {device}, final state")
        events = folded(trace)
        for index in range(len(events) - 1, -1, -1):
            where = f"device {device}, event {index} {events[index]['action']}"
            state.undo(events[index], where)
            state.check_drawable(where)
            steps += 1
    print(f"walked back through {steps} events without a missing block or segment")


def check_figures(snapshot, expected):
    segments = snapshot["segments"]
    blocks = [b for s in segments for b in s["blocks"]]
    trace = [e for t in snapshot["device_traces"] for e in t]
    count = lambda action: sum(1 for e in trace if e["action"] == action)
    found = {
        "segments": len(segments),
        "reserved": sum(s["total_size"] for s in segments),
        "used": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "allocated_blocks": sum(1 for b in blocks if b["state"] == "active_allocated"),
        "pending_blocks": sum(1 for b in blocks if b["state"] == "active_pending_free"),
        "alloc": count("alloc"),
        "free_requested": count("free_requested"),
        "segment_alloc": count("segment_alloc"),
        "segment_free": count("segment_free"),
        "oom": count("oom"),
        "first_time_us": trace[0]["time_us"] if trace else 0,
    }
    assert found == expected, f"the pickle's figures {found} are not the Rust side's {expected}"
    # Every free the trace keeps is completed by then, or its block is still pending.
    pending = {b["address"] for b in blocks if b["state"] == "active_pending_free"}
    assert count("free_completed") + len(pending) >= count("free_requested"), "a free without completion"
    print(f"figures agree: {json.dumps(found)}")


def with_torch(snapshot):
    try:
        from torch.cuda import _memory_viz
    except ImportError:
        print("SKIP torch.cuda._memory_viz: torch is not importable")
        return
    print(_memory_viz.segsum(snapshot))
    print(_memory_viz.trace(snapshot))
    print("torch.cuda._memory_viz read it")


def main():
    path, expected = sys.argv[1], json.loads(sys.argv[2])
    with open(path, "rb") as f:
        data = f.read()
    check_opcodes(data)
    snapshot = pickle.loads(data)
    check_structure(snapshot)
    walk_back(snapshot)
    check_figures(snapshot, expected)
    with_torch(snapshot)


if __name__ == "__main__":
    main()
