//! Sending the same buffers again: the sender's export data is kept in each buffer (no
//! `cuMemPoolExportPointer` the second time), the receiver finds the mappings it still holds
//! (no driver call at all), and neither cache outlives what it describes: a buffer allocated
//! after a freed one is exported afresh, and the receiver maps the new one.
//!
//! Each test counts the process's driver calls, so each runs in a process of its own
//! (`in_simulated_machine`). On a real driver, which counts nothing, the contents and the
//! descriptors are checked and the counts are not.

use std::sync::Arc;

use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, Stream, StreamOptions,
};
use cuda_mem_ipc::{Channel, IpcChannel, buffer_descriptor};
use cuda_sim::testing::{count_calls_if_simulated, in_simulated_machine};

const BUFFERS: usize = 16;

fn driver() -> &'static cuda_mem_core::sys::Driver {
    cuda_sim::testing::driver().expect("the test driver loads")
}

fn setup() -> (Device, Stream, Arc<DeviceMemoryResource>, IpcChannel, IpcChannel) {
    driver();
    let device = Device::new(0).unwrap();
    device.set_current().unwrap();
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let (a, b) = Channel::pair().unwrap();
    (device, stream, pool, IpcChannel::new(a), IpcChannel::new(b))
}

fn contents(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let bytes = buffer.to_vec::<u8>(stream).unwrap();
    stream.synchronize().unwrap();
    bytes
}

#[test]
fn sending_the_same_buffers_again_makes_no_export_and_no_import_call() {
    in_simulated_machine("sending_the_same_buffers_again_makes_no_export_and_no_import_call", &[], || {
        let (_, stream, pool, tx, rx) = setup();
        let mut buffers = (0..BUFFERS).map(|_| pool.allocate(4096, &stream).unwrap()).collect::<Vec<_>>();
        for (n, buffer) in buffers.iter_mut().enumerate() {
            buffer.fill(FillPattern::U8(n as u8 + 1), &stream).unwrap();
        }
        stream.synchronize().unwrap();
        let refs: Vec<&Buffer> = buffers.iter().collect();

        let ((), first_send) = count_calls_if_simulated(|| tx.send_buffers(&refs).unwrap());
        first_send.assert_calls("cuMemPoolExportPointer", BUFFERS as u32, "");
        first_send.assert_calls("cuCtxGetCurrent", BUFFERS as u32, "one context check per export");
        let (held, first_receive) = count_calls_if_simulated(|| rx.recv_buffers(&stream).unwrap());
        first_receive.assert_calls("cuMemPoolImportPointer", BUFFERS as u32, "");
        // Per buffer, beside the import: one context check (the import's) and its mapped size;
        // the pool, received first in the same call, makes one context check of its own.
        first_receive.assert_calls("cuCtxGetCurrent", BUFFERS as u32 + 1, "one context check per import");
        first_receive.assert_calls("cuPointerGetAttribute", BUFFERS as u32, "the mapped size, once per import");

        // Again, while the receiver holds the first batch: nothing is asked of the driver on
        // either side.
        let ((), resend) = count_calls_if_simulated(|| tx.send_buffers(&refs).unwrap());
        resend.assert_calls("cuMemPoolExportPointer", 0, "");
        resend.assert_total(0, "the sender makes no driver call");
        let (again, receive) = count_calls_if_simulated(|| rx.recv_buffers(&stream).unwrap());
        receive.assert_calls("cuMemPoolImportPointer", 0, "");
        receive.assert_total(0, "the receiver makes no driver call");

        // The same mappings, the same memory.
        for (n, (first, second)) in held.iter().zip(&again).enumerate() {
            assert_eq!((first.ptr(), first.size()), (second.ptr(), second.size()));
            assert!(contents(second, &stream).iter().all(|&b| b == n as u8 + 1), "buffer {n}");
            assert_eq!(cuda_mem_core::import_holders(second.ptr()), 2);
        }
        // The descriptor is the one the driver gives.
        for buffer in &buffers {
            let fresh = pool.pool().export_pointer(buffer.ptr()).unwrap();
            assert_eq!(buffer_descriptor(buffer).unwrap().export_data, fresh);
        }
        drop((held, again));
        stream.synchronize().unwrap();
        assert_eq!(cuda_mem_core::import_holders(buffers[0].ptr()), 0);
    });
}

/// A buffer freed and new ones allocated after it: each new buffer is exported afresh (the
/// export went with the old buffer, so nothing keyed by address or pool can answer for it), and
/// the receiver, which let the old one go, maps each new one's memory and size.
///
/// A real pool hands a freed address out again; the simulator does not (its addresses are
/// next-fit over a 1 TiB arena), so here the new buffers lie elsewhere, while the simulator's
/// export data (the pool's file offset and size, first fit) for the buffer of the old size is the
/// old one's: the receiver must have dropped its mapping with the old buffer, not kept it.
#[test]
fn a_buffer_allocated_after_a_freed_one_is_exported_and_imported_afresh() {
    in_simulated_machine("a_buffer_allocated_after_a_freed_one_is_exported_and_imported_afresh", &[], || {
        let (_, stream, pool, tx, rx) = setup();
        let mut old = pool.allocate(4096, &stream).unwrap();
        old.fill(FillPattern::U8(0x11), &stream).unwrap();
        tx.send_buffers(&[&old]).unwrap();
        let received = rx.recv_buffers(&stream).unwrap();
        assert!(contents(&received[0], &stream).iter().all(|&b| b == 0x11));
        drop(received);
        drop(old);
        stream.synchronize().unwrap();

        for (size, fill) in [(4096, 0x22), (8192, 0x33)] {
            let mut new = pool.allocate(size, &stream).unwrap();
            new.fill(FillPattern::U8(fill), &stream).unwrap();
            let ((), sent) = count_calls_if_simulated(|| tx.send_buffers(&[&new]).unwrap());
            sent.assert_calls("cuMemPoolExportPointer", 1, "a new buffer is exported");
            let descriptor = buffer_descriptor(&new).unwrap();
            assert_eq!(descriptor.export_data, pool.pool().export_pointer(new.ptr()).unwrap());
            let (received, imported) = count_calls_if_simulated(|| rx.recv_buffers(&stream).unwrap());
            imported.assert_calls("cuMemPoolImportPointer", 1, "the old mapping was let go");
            assert_eq!(received[0].size(), size);
            assert!(contents(&received[0], &stream).iter().all(|&b| b == fill));
            drop(received);
            drop(new);
            stream.synchronize().unwrap();
        }
    });
}
