//! A receiver that runs out of file descriptors: the message is skipped with an error that says
//! so, and the channel stays usable once descriptors are free again.
//!
//! The receiver lowers its own `RLIMIT_NOFILE`, so it runs in a child process: this test binary
//! again, run as `<exe> --exact child_entry` with `CUDA_MEM_IPC_TEST_ROLE` set; without that
//! variable, `child_entry` does nothing.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use cuda_mem_ipc::{Channel, IpcError};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

const ROLE: &str = "CUDA_MEM_IPC_TEST_ROLE";
const DONE: &str = "OUT_OF_DESCRIPTORS_CHILD_DONE";

fn memfd(contents: &[u8]) -> File {
    let fd = rustix::fs::memfd_create("cuda-mem-ipc-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let file = File::from(fd);
    file.write_all_at(contents, 0).unwrap();
    file
}

fn contents(fd: &OwnedFd) -> Vec<u8> {
    let file = File::from(fd.try_clone().unwrap());
    let mut buf = vec![0u8; file.metadata().unwrap().len() as usize];
    file.read_exact_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn child_entry() {
    match std::env::var(ROLE).as_deref() {
        Ok("receive-while-out-of-descriptors") => receive_while_out_of_descriptors(),
        Ok(other) => panic!("unknown role {other}"),
        Err(_) => {}
    }
}

fn receive_while_out_of_descriptors() {
    let (a, b) = Channel::pair().unwrap();
    for end in [&a, &b] {
        end.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        end.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    let files: Vec<File> = (0..8).map(|i| memfd(format!("file {i}").as_bytes())).collect();
    let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
    // A payload larger than one read, so the receiver has more of the frame to read after the
    // descriptors are lost.
    let first: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    a.send(7, &first, &fds).unwrap();
    a.send(8, b"second", &[files[0].as_fd()]).unwrap();

    // The lowest free descriptor number becomes the limit: no descriptor can be created now.
    let original = getrlimit(Resource::Nofile);
    let lowest_free = rustix::io::fcntl_dupfd_cloexec(&a, 0).unwrap().as_raw_fd();
    let lowered = Rlimit { current: Some(lowest_free as u64), maximum: original.maximum };
    setrlimit(Resource::Nofile, lowered).unwrap();
    assert!(UnixStream::pair().is_err(), "out of descriptors");

    match b.recv() {
        Err(IpcError::OutOfDescriptors { kind: 7, fds: 8 }) => {}
        other => panic!("expected OutOfDescriptors for kind 7 with 8 descriptors, got {other:?}"),
    }
    // Still out of descriptors: the next message's one descriptor cannot be taken either; it
    // was read from its first byte (the first frame was read to its end, not just to the
    // descriptors).
    match b.recv() {
        Err(e @ IpcError::OutOfDescriptors { kind: 8, fds: 1 }) => {
            let text = e.to_string();
            assert!(text.contains("RLIMIT_NOFILE") && text.contains("close descriptors"), "{text}");
        }
        other => panic!("expected OutOfDescriptors for kind 8 with 1 descriptor, got {other:?}"),
    }
    a.send(8, b"third", &[files[1].as_fd()]).unwrap();

    // Closing descriptors makes room: the channel works again.
    drop(fds);
    drop(files.into_iter().skip(2).collect::<Vec<_>>());
    let m = b.recv().unwrap();
    assert_eq!((m.kind, m.payload.as_slice()), (8, &b"third"[..]));
    assert_eq!(contents(&m.fds[0]), b"file 1");

    // And with the limit raised, so does sending and receiving many.
    setrlimit(Resource::Nofile, original).unwrap();
    let many: Vec<File> = (0..20).map(|i| memfd(format!("many {i}").as_bytes())).collect();
    a.send(9, b"many", &many.iter().map(|f| f.as_fd()).collect::<Vec<_>>()).unwrap();
    let m = b.recv().unwrap();
    assert_eq!((m.kind, m.fds.len()), (9, 20));
    assert_eq!(contents(&m.fds[19]), b"many 19");
    println!("{DONE}");
}

#[test]
fn running_out_of_descriptors_skips_the_message_and_keeps_the_channel() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE, "receive-while-out-of-descriptors")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains(DONE), "the child ran its part:\n{stdout}");
}
