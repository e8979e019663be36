//! Devices, streams and events.

mod common;

use cuda_mem_core::{
    Device, DeviceMemoryResource, Error, Event, EventOptions, FillPattern, HandleType, NumaNode, PinnedMemoryResource,
    PinnedMemoryResourceOptions, Stream, StreamOptions,
};

#[test]
fn device_properties() {
    let device = common::device();
    assert!(Device::count().unwrap() >= 1);
    assert_eq!(Device::all().unwrap()[0], device);
    let p = device.properties().unwrap();
    assert!(!p.name.is_empty());
    assert!(p.total_memory > 0);
    assert!(p.compute_capability.0 >= 3);
    assert!(p.memory_pools_supported);
    if cuda_sim::testing::on_simulator() {
        assert_eq!(p.compute_capability, (9, 0));
        assert!(p.mempool_supported_handle_types.contains(HandleType::PosixFd));
        assert_eq!(p.host_numa_node, Some(NumaNode(0)));
        assert!(p.virtual_memory_management_supported);
    }
    assert_eq!(device.uuid().unwrap().len(), 16);
    assert_eq!(device.to_string(), "device 0");
}

#[test]
fn a_device_can_access_its_own_memory_without_asking_the_driver() {
    let device = common::device();
    assert!(device.can_access_peer(device).unwrap(), "cuda.core: a device can access itself");
    if !cuda_sim::testing::simulator_only("counting driver calls") {
        return;
    }
    let (can, calls) =
        cuda_sim::testing::count_calls(cuda_sim::testing::driver().unwrap(), || device.can_access_peer(device))
            .unwrap();
    assert!(can.unwrap());
    // `cuDeviceCanAccessPeer` refuses a device with itself (CUDA_ERROR_INVALID_DEVICE).
    assert_eq!(calls.of("cuDeviceCanAccessPeer"), 0, "{calls:?}");
}

#[test]
fn a_missing_device_is_a_clear_error() {
    common::device();
    let count = Device::count().unwrap();
    let err = Device::new(count).unwrap_err();
    assert!(matches!(err, Error::NoSuchDevice { .. }));
    assert_eq!(err.to_string(), format!("device {count} does not exist: the driver reports {count} device(s)"));
}

#[test]
fn streams_order_work_and_report_idleness() {
    let device = common::device();
    let stream = Stream::new(device, StreamOptions::default().priority(-1)).unwrap();
    assert!(stream.is_owned());
    let mut buffer = DeviceMemoryResource::current(device).unwrap().allocate(1 << 20, &stream).unwrap();
    buffer.fill(FillPattern::U8(1), &stream).unwrap();
    stream.synchronize().unwrap();
    assert!(stream.is_idle().unwrap());
    assert!(!stream.is_capturing().unwrap());
    assert_eq!(stream.clone(), stream);
    assert_ne!(stream, Stream::new(device, StreamOptions::default()).unwrap());
}

#[test]
fn events_order_streams_and_time_work() {
    let device = common::device();
    let (a, b) = (common::stream(device), common::stream(device));
    let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let mut buffer = host.allocate(4096, &a).unwrap();
    let start = Event::new(device, EventOptions::default().timing()).unwrap();
    start.record(&a).unwrap();
    buffer.fill(FillPattern::U8(5), &a).unwrap();
    let done = Event::new(device, EventOptions::default().timing()).unwrap();
    done.record(&a).unwrap();
    b.wait(&done).unwrap();
    buffer.fill(FillPattern::U8(6), &b).unwrap();
    buffer.set_deallocation_stream(&b);
    done.synchronize().unwrap();
    assert!(done.is_complete().unwrap());
    assert!(done.elapsed_since(&start).is_ok());
    assert!(buffer.host_slice().unwrap().iter().all(|&x| x == 6));
    // An event without timing cannot time.
    let untimed = a.record_event().unwrap();
    untimed.synchronize().unwrap();
    assert!(untimed.elapsed_since(&start).is_err());
}

#[test]
fn default_streams_work_from_any_thread() {
    let device = common::device();
    std::thread::spawn(move || {
        let stream = Stream::per_thread_default(device);
        let mut b = DeviceMemoryResource::current(device).unwrap().allocate(64, &stream).unwrap();
        b.fill(FillPattern::U8(1), &stream).unwrap();
        stream.synchronize().unwrap();
        device.default_stream().synchronize().unwrap();
        device.synchronize().unwrap();
    })
    .join()
    .unwrap();
}
