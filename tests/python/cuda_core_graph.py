"""cuda.core's graph builder and GraphMemoryResource on the driver this process loads.

Captures a graph with cuda.core's GraphBuilder (graph memory from GraphMemoryResource, a memset
into it, a copy out to device memory, the graph allocation freed in the graph), completes and
launches it twice, and checks the bytes and GraphMemoryResource's attributes and trim. Prints
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

    attributes = gmr.attributes
    assert attributes.used_mem_current == 0, attributes
    assert attributes.used_mem_high == 2 * MIB, attributes
    assert attributes.reserved_mem_current == 2 * MIB, attributes
    gmr.trim()
    assert gmr.attributes.reserved_mem_current == 0, gmr.attributes
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
    print("cuda-core-graph: ok")


if __name__ == "__main__":
    main()
