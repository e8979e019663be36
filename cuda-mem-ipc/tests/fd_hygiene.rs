//! No descriptor leaks, in success and error paths. One test only: it counts the descriptors
//! of the whole process, which tests running beside it would disturb.

use std::io::{IoSlice, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::process::Command;

use cuda_mem_ipc::{Channel, IpcError, spawn_with_channel};
use cuda_sim::testing::open_fds;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};

fn memfd(n: usize) -> std::fs::File {
    let fd = rustix::fs::memfd_create("cuda-mem-ipc-hygiene", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let file = std::fs::File::from(fd);
    (&file).write_all(&n.to_le_bytes()).unwrap();
    file
}

fn raw_send(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    sendmsg(stream, &[IoSlice::new(bytes)], &mut control, SendFlags::empty()).unwrap();
}

fn header(len: u32, fds: u32) -> Vec<u8> {
    let mut h = b"CUMEMMSG\x01\x00\x07\x00".to_vec();
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&fds.to_le_bytes());
    h.extend_from_slice(&[0; 4]);
    h
}

#[test]
fn no_descriptor_leaks() {
    let (a, b) = Channel::pair().unwrap();
    let files: Vec<_> = (0..3).map(memfd).collect();
    let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();

    // Warm up anything lazily opened, then count.
    a.send(1, b"warm-up", &fds).unwrap();
    drop(b.recv().unwrap());
    let before = open_fds();

    // Good messages, both directions.
    for i in 0..1000u32 {
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        from.send(2, &i.to_le_bytes(), &fds[..(i as usize % 4)]).unwrap();
        let m = to.recv().unwrap();
        assert_eq!(m.payload, i.to_le_bytes());
        assert_eq!(m.fds.len(), i as usize % 4);
    }
    assert_eq!(open_fds(), before, "after 1000 good messages");

    // Malformed frames with descriptors attached, on fresh channels.
    for i in 0..100 {
        let (ch, raw) = UnixStream::pair().unwrap();
        let ch = Channel::from_stream(ch).unwrap();
        let bytes = match i % 4 {
            0 => b"not a frame at all, just bytes".to_vec(),
            1 => header(4, 1), // three descriptors where one is announced
            2 => {
                let mut h = header(100, 3);
                h.extend_from_slice(b"short"); // then the peer closes
                h
            }
            _ => header(0, 300), // too many announced
        };
        raw_send(&raw, &bytes, &fds);
        drop(raw);
        match ch.recv() {
            Err(IpcError::Protocol(_)) => {}
            other => panic!("case {i}: expected a protocol error, got {other:?}"),
        }
    }
    assert_eq!(open_fds(), before, "after 100 rejected frames");

    // Spawning children, and failing to.
    for _ in 0..20 {
        let (mut child, channel) = spawn_with_channel(&mut Command::new("true")).unwrap();
        assert!(child.wait().unwrap().success());
        assert!(matches!(channel.recv(), Err(IpcError::PeerClosed)));
    }
    for _ in 0..20 {
        assert!(spawn_with_channel(&mut Command::new("/nonexistent/child")).is_err());
    }
    assert_eq!(open_fds(), before, "after spawning");
}
