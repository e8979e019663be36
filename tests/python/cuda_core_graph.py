"""cuda.core's graph builder and GraphMemoryResource on the driver this process loads.

Captures a graph with cuda.core's GraphBuilder (graph memory from GraphMemoryResource, a memset
into it, a copy out to device memory, the graph allocation freed in the graph), completes and
launches it twice, and checks the bytes and GraphMemoryResource's attributes and trim; then, as
cuda.core's own tests do on GPUs, that graph memory freed after a launch is still counted as used
until trimmed, and that zero bytes can be allocated while building a graph. Prints
"cuda-core-graph: ok" at the end; any failure raises.
"""

from cuda.bindings import driver
from cuda.core import Device, DeviceMemoryResource, GraphMemoryResource

SIZE = 1 << 20
MIB = 1 << 20


def main() -> None:
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    gmr = GraphMemoryResource(device)
    dmr = DeviceMemoryResource(device)
    assert gmr.is_device_accessible and not gmr.is_host_accessible

    # Outside a capture, GraphMemoryResource refuses to allocate.
    try:
        gmr.allocate(SIZE, stream=stream)
    except RuntimeError:
        pass
    else:
        raise AssertionError("GraphMemoryResource allocated outside a capture")

    target = dmr.allocate(SIZE, stream=stream)
    target.fill(0, stream=stream)
    stream.sync()

    builder = device.create_graph_builder().begin_building()
    scratch = gmr.allocate(SIZE, stream=builder)
    scratch.fill(7, stream=builder)
    target.copy_from(scratch, stream=builder)
    scratch.close(stream=builder)
    builder.end_building()
    graph = builder.complete()

    for _ in range(2):
        graph.launch(stream)
        stream.sync()
        view = bytearray(SIZE)
        (err,) = driver.cuMemcpyDtoH(view, int(target.handle), SIZE)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        assert view == bytes([7]) * SIZE, "the graph's copy did not arrive"

    # Freed in the graph, the memory stays the graph's for its next launch.
    attributes = gmr.attributes
    assert attributes.used_mem_current == 2 * MIB, attributes
    assert attributes.used_mem_high == 2 * MIB, attributes
    assert attributes.reserved_mem_current == 2 * MIB, attributes
    gmr.trim()
    assert gmr.attributes.reserved_mem_current == 0, gmr.attributes
    assert gmr.attributes.used_mem_current == 0, gmr.attributes
    attributes.used_mem_high = 0
    assert gmr.attributes.used_mem_high == 0, gmr.attributes
    try:
        attributes.reserved_mem_high = 5
    except AttributeError:
        pass
    else:
        raise AssertionError("a non-zero high-water mark was accepted")

    graph.close()
    builder.close()
    target.close(stream)
    stream.sync()

    freed_but_still_used(device, stream, gmr)
    zero_bytes(device, stream, gmr)
    print("cuda-core-graph: ok")


def freed_but_still_used(device, stream, gmr) -> None:
    """cuda.core's test_graph_mem_set_attributes: an output freed after the launch (and the
    stream synchronized) is still counted as used, until trimmed."""
    builder = device.create_graph_builder().begin_building("relaxed")
    output = gmr.allocate(1024, stream=builder)
    graph = builder.end_building().complete()
    graph.upload(stream)
    graph.launch(stream)
    stream.sync()
    assert gmr.attributes.used_mem_current > 0, gmr.attributes
    output.close(stream=stream)
    stream.sync()
    assert gmr.attributes.used_mem_current > 0, gmr.attributes
    assert gmr.attributes.reserved_mem_current > 0, gmr.attributes
    gmr.trim()
    assert gmr.attributes.used_mem_high > 0 and gmr.attributes.reserved_mem_high > 0, gmr.attributes
    graph.close()
    builder.close()


def zero_bytes(device, stream, gmr) -> None:
    """cuda.core's test_graph_mem_alloc_zero: zero bytes allocated while building a graph."""
    builder = device.create_graph_builder().begin_building("global")
    buffer = gmr.allocate(0, stream=builder)
    graph = builder.end_building().complete()
    graph.upload(stream)
    graph.launch(stream)
    stream.sync()
    assert int(buffer.handle) >= 0 and buffer.size == 0, buffer
    buffer.close(stream=stream)
    stream.sync()
    graph.close()
    builder.close()


if __name__ == "__main__":
    main()
