//! Processes that see different devices: `CUDA_VISIBLE_DEVICES` renumbers them, so a pool's
//! device travels by UUID, and a process that cannot see it gets a clear error.

#[macro_use]
mod common;

use common::*;
use cuda_mem_core::{Device, MemoryResource};
use cuda_mem_ipc::IpcError;
use uuid::Uuid;

/// `CUDA_VISIBLE_DEVICES` naming one device by its UUID, as the driver prints it.
fn visible(device: Device) -> String {
    format!("GPU-{}", Uuid::from_bytes(device.uuid().expect("the device's UUID")).hyphenated())
}

const SIZE: usize = 3000;

/// The parent shares a pool of its device 1 with a child that sees only that device (its
/// device 0) and with one that sees only the parent's device 0.
#[test]
fn a_pool_travels_to_the_device_with_its_uuid() {
    match role().as_deref() {
        Some("renumbered") => return renumbered_child(),
        Some("blind") => return blind_child(),
        _ => {}
    }
    cuda_sim::testing::in_simulated_machine(test_name!(), &[("CUDA_SIM_DEVICES", "2")], || {
        let (device0, stream0) = setup();
        if Device::count().unwrap() < 2 {
            return cuda_sim::testing::skip("needs two devices");
        }
        let device1 = Device::new(1).unwrap();
        let stream = cuda_mem_core::Stream::new(device1, Default::default()).unwrap();
        let pool = device_pool(device1);
        let mut buffer = pool.allocate(SIZE, &stream).unwrap();
        write_bytes(&mut buffer, &pattern(41, SIZE), &stream);

        // Seen as its device 0, the child maps the pool on the right device.
        let (child, channel) = spawn_role(test_name!(), "renumbered", &[("CUDA_VISIBLE_DEVICES", &visible(device1))]);
        channel.send_data(&device1.uuid().unwrap()).unwrap();
        channel.send_buffers(&[&buffer]).unwrap();
        expect_text(&channel, &stream, "written");
        assert_eq!(read_bytes(&buffer, &stream), pattern(42, SIZE), "the renumbered child's write");
        channel.send_data(b"done").unwrap();
        child.wait_success();

        // A child that cannot see device 1 refuses the pool, naming the device, and then knows
        // no buffer of it.
        let (child, channel) = spawn_role(test_name!(), "blind", &[("CUDA_VISIBLE_DEVICES", &visible(device0))]);
        channel.send_buffers(&[&buffer]).unwrap();
        let text = String::from_utf8(expect_data(&channel, &stream0)).unwrap();
        let uuid = Uuid::from_bytes(device1.uuid().unwrap()).to_string();
        assert!(text.contains(&uuid) && text.contains("device 1 in the sending process"), "{text}");
        assert!(text.contains("CUDA_VISIBLE_DEVICES"), "{text}");
        assert!(text.contains("no live memory resource"), "{text}");
        child.wait_success();
        assert_eq!(read_bytes(&buffer, &stream), pattern(42, SIZE), "the pool is as it was");
    });
}

fn renumbered_child() {
    let (device, stream) = setup();
    assert_eq!(Device::count().unwrap(), 1, "the child sees one device");
    let channel = parent_channel();
    let uuid = expect_data(&channel, &stream);
    assert_eq!(device.uuid().unwrap().as_slice(), uuid.as_slice(), "its device 0 is the parent's device 1");
    let resource = expect_resource(&channel, &stream);
    assert_eq!(resource.device(), Some(device), "the pool is on the device with the sender's UUID");
    let mut buffers = expect_buffers(&channel, &stream);
    assert_eq!(buffers.len(), 1);
    assert_eq!(buffers[0].device(), Some(device));
    assert_eq!(read_bytes(&buffers[0], &stream), pattern(41, SIZE));
    write_bytes(&mut buffers[0], &pattern(42, SIZE), &stream);
    channel.send_data(b"written").unwrap();
    expect_text(&channel, &stream, "done");
}

fn blind_child() {
    let (_device, stream) = setup();
    let channel = parent_channel();
    let refused = match channel.recv(&stream) {
        Err(error @ IpcError::DeviceNotVisible { .. }) => error.to_string(),
        other => panic!("expected DeviceNotVisible, got {other:?}"),
    };
    let unknown = match channel.recv(&stream) {
        Err(error @ IpcError::UnknownResource(_)) => error.to_string(),
        other => panic!("expected UnknownResource, got {other:?}"),
    };
    channel.send_data(format!("{refused}\n{unknown}").as_bytes()).unwrap();
}
