//! Parent and child processes connected by `spawn_with_channel`.
//!
//! The child is this test binary again, run as `<exe> --exact child_entry` with the role it
//! plays in `CUDA_MEM_IPC_TEST_ROLE`; without that variable, `child_entry` does nothing.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Output, Stdio};

use cuda_mem_ipc::{CHANNEL_FD_ENV, CHANNEL_INODE_ENV, Channel, ChannelEnvError, IpcError, spawn_with_channel};

const ROLE: &str = "CUDA_MEM_IPC_TEST_ROLE";

/// The channel this child's parent passed.
fn take_channel() -> cuda_mem_ipc::Result<Channel> {
    // SAFETY: in the roles that get a channel this process was started by `spawn_with_channel`,
    // and nothing in this test binary adopts inherited descriptors but this call. In the roles
    // that expect an error, the environment names no socket with the inode it gives, so nothing
    // is taken.
    unsafe { Channel::from_env() }
}

fn child_command(role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env_remove(CHANNEL_FD_ENV)
        .env_remove(CHANNEL_INODE_ENV);
    command
}

/// Starts a child with a channel; its standard output (the test harness's chatter) is
/// discarded, its standard error (where a failing assertion's message goes) is kept.
fn spawn_child(role: &str) -> (Child, Channel) {
    spawn_with_channel(child_command(role).stdout(Stdio::null())).unwrap()
}

fn memfd(contents: &[u8]) -> File {
    let fd = rustix::fs::memfd_create("cuda-mem-ipc-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let file = File::from(fd);
    file.write_all_at(contents, 0).unwrap();
    file
}

fn read_all(fd: &OwnedFd) -> Vec<u8> {
    let file = File::from(fd.try_clone().unwrap());
    let mut buf = vec![0u8; file.metadata().unwrap().len() as usize];
    file.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn inode(fd: impl AsFd) -> u64 {
    rustix::fs::fstat(fd).unwrap().st_ino
}

fn is_cloexec(fd: impl AsFd) -> bool {
    rustix::io::fcntl_getfd(fd).unwrap().contains(rustix::io::FdFlags::CLOEXEC)
}

/// The open descriptors of this process that are sockets.
fn open_sockets() -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let name = entry.unwrap().file_name();
        let Ok(n) = name.to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(meta) = std::fs::metadata(format!("/proc/self/fd/{n}")) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_socket() {
                out.push(n);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The child side.

#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "echo" => child_echo(),
        "exit3" => {
            let _channel = take_channel().unwrap();
            std::process::exit(3);
        }
        "grandparent" => child_grandparent(),
        "grandchild" | "expect-env-error" => match take_channel() {
            // The variant's name, then its message.
            Err(IpcError::ChannelEnv(cause)) => {
                let debug = format!("{cause:?}");
                let variant = debug.split([' ', '{', '(']).next().unwrap_or_default();
                println!("FROM_ENV_ERROR: {variant}: {cause}")
            }
            other => panic!("expected a ChannelEnv error, got {other:?}"),
        },
        "stdin-socket" => child_stdin_socket(),
        "twice" => {
            let channel = take_channel().unwrap();
            let second = take_channel();
            let text = match second {
                Err(e) => e.to_string(),
                Ok(_) => "a second channel".into(),
            };
            channel.send(1, text.as_bytes(), &[]).unwrap();
        }
        other => panic!("unknown role {other}"),
    }
}

fn child_echo() {
    // Before anything else: the channel is the only socket this process inherited.
    let fd: i32 = std::env::var(CHANNEL_FD_ENV).unwrap().parse().unwrap();
    assert_eq!(open_sockets(), vec![fd], "inherited sockets");

    let channel = take_channel().unwrap();
    assert_eq!(channel.as_fd().as_raw_fd(), fd);
    assert!(is_cloexec(&channel), "close-on-exec set again");

    let m = channel.recv().unwrap();
    assert_eq!((m.kind, m.payload.as_slice()), (1, &b"ping"[..]));
    assert_eq!(m.fds.len(), 1);
    assert!(is_cloexec(&m.fds[0]));
    assert_eq!(read_all(&m.fds[0]), b"from parent");
    File::from(m.fds[0].try_clone().unwrap()).write_all_at(b"FROM", 0).unwrap();

    let mine = memfd(b"from child");
    channel.send(2, b"pong", &[mine.as_fd(), m.fds[0].as_fd()]).unwrap();

    let bye = channel.recv().unwrap();
    assert_eq!((bye.kind, bye.fds.len()), (3, 0));
    assert!(matches!(channel.recv(), Err(IpcError::PeerClosed)));
}

fn child_grandparent() {
    let channel = take_channel().unwrap();
    // The grandchild inherits the environment variables but not the descriptor.
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"]).env(ROLE, "grandchild");
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let verdict = if out.status.success() && stdout.contains("FROM_ENV_ERROR") {
        format!("refused: {stdout}")
    } else {
        format!("grandchild failed ({}): {stdout}", out.status)
    };
    channel.send(9, verdict.as_bytes(), &[]).unwrap();
}

/// Standard input is a socket, and the environment names it without its inode: refused, and the
/// descriptor is left as it was, still open and readable.
fn child_stdin_socket() {
    match take_channel() {
        Err(IpcError::ChannelEnv(ChannelEnvError::NoInode { fd: 0 })) => {}
        other => panic!("expected a ChannelEnv error, got {other:?}"),
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line, "still mine\n");
    println!("STDIN_STILL_OPEN");
}

// ---------------------------------------------------------------------------------------------
// The parent side.

#[test]
fn messages_and_fds_travel_both_ways() {
    let (mut child, channel) = spawn_child("echo");
    let mine = memfd(b"from parent");
    channel.send(1, b"ping", &[mine.as_fd()]).unwrap();

    let reply = channel.recv().unwrap();
    assert_eq!((reply.kind, reply.payload.as_slice()), (2, &b"pong"[..]));
    assert_eq!(reply.fds.len(), 2);
    assert_eq!(read_all(&reply.fds[0]), b"from child");
    // Our own memfd came back: the same file, with the child's write.
    assert_eq!(inode(&reply.fds[1]), inode(&mine));
    assert_eq!(read_all(&reply.fds[1]), b"FROM parent");

    channel.send(3, b"bye", &[]).unwrap();
    drop(channel);
    let status = child.wait().unwrap();
    assert!(status.success(), "child: {status}");
}

#[test]
fn several_children_at_once_each_inherit_only_their_own_end() {
    // Spawned at the same moment from several threads: were a child's end inheritable in the
    // parent, even briefly, the children spawned beside it would inherit it too (and fail
    // their check of inherited sockets).
    const CHILDREN: usize = 6;
    let barrier = std::sync::Barrier::new(CHILDREN);
    std::thread::scope(|s| {
        for _ in 0..CHILDREN {
            s.spawn(|| {
                barrier.wait();
                let (mut child, channel) = spawn_child("echo");
                let file = memfd(b"from parent");
                channel.send(1, b"ping", &[file.as_fd()]).unwrap();
                assert_eq!(channel.recv().unwrap().kind, 2);
                channel.send(3, b"bye", &[]).unwrap();
                drop(channel);
                let status = child.wait().unwrap();
                assert!(status.success(), "child: {status}");
            });
        }
    });
}

#[test]
fn a_child_exiting_is_peer_closed_and_its_status_is_seen() {
    let (mut child, channel) = spawn_child("exit3");
    assert!(matches!(channel.recv(), Err(IpcError::PeerClosed)));
    assert_eq!(child.wait().unwrap().code(), Some(3));
    assert!(matches!(channel.send(1, b"late", &[]), Err(IpcError::PeerClosed)));
}

#[test]
fn grandchildren_do_not_inherit_the_channel() {
    let (mut child, channel) = spawn_child("grandparent");
    let m = channel.recv().unwrap();
    let verdict = String::from_utf8_lossy(&m.payload).into_owned();
    assert_eq!(m.kind, 9);
    assert!(verdict.starts_with("refused: "), "{verdict}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_channel_is_taken_once() {
    let (mut child, channel) = spawn_child("twice");
    let m = channel.recv().unwrap();
    let text = String::from_utf8_lossy(&m.payload).into_owned();
    assert!(text.contains("already taken"), "{text}");
    assert!(child.wait().unwrap().success());
}

fn env_error(configure: impl FnOnce(&mut Command)) -> String {
    let mut command = child_command("expect-env-error");
    configure(&mut command);
    let Output { status, stdout, .. } = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(status.success(), "{status}: {stdout}");
    stdout
        .lines()
        .find_map(|l| l.split_once("FROM_ENV_ERROR: ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no error line in {stdout:?}"))
        .to_owned()
}

#[test]
fn from_env_explains_what_is_wrong() {
    let cases: [(Option<&str>, Option<&str>, &str); 8] = [
        (None, None, "NoDescriptor: CUDA_MEM_IPC_CHANNEL_FD is not set"),
        (Some("abc"), Some("1"), "NotANumber: CUDA_MEM_IPC_CHANNEL_FD is \"abc\", not a non-negative integer"),
        (Some("-1"), Some("1"), "NegativeDescriptor: CUDA_MEM_IPC_CHANNEL_FD is -1, not a descriptor number"),
        (Some("0"), None, "NoInode: CUDA_MEM_IPC_CHANNEL_INODE is not set, so descriptor 0 cannot be told"),
        (Some("0"), Some("x"), "NotANumber: CUDA_MEM_IPC_CHANNEL_INODE is \"x\""),
        // Standard output is a pipe here.
        (Some("1"), Some("1"), "NotASocket: descriptor 1 from CUDA_MEM_IPC_CHANNEL_FD is a Fifo, not a socket"),
        (Some("999999"), Some("1"), "NotOpen: CUDA_MEM_IPC_CHANNEL_FD names descriptor 999999, which is not open here"),
        (None, Some("1"), "NoDescriptor: CUDA_MEM_IPC_CHANNEL_FD is not set"),
    ];
    for (fd, inode, needle) in cases {
        let text = env_error(|c| {
            if let Some(v) = fd {
                c.env(CHANNEL_FD_ENV, v);
            }
            if let Some(v) = inode {
                c.env(CHANNEL_INODE_ENV, v);
            }
        });
        assert!(text.contains(needle), "{fd:?}, {inode:?}: {text:?} should contain {needle:?}");
    }
}

#[test]
fn without_the_inode_nothing_is_taken() {
    // The environment names a socket that is this process's standard input, with no inode: the
    // descriptor cannot be told from the channel, so it stays where it is.
    let (mine, theirs) = UnixStream::pair().unwrap();
    let mut command = child_command("stdin-socket");
    command.env(CHANNEL_FD_ENV, "0").stdin(OwnedFd::from(theirs)).stdout(Stdio::piped());
    let child = command.spawn().unwrap();
    (&mine).write_all(b"still mine\n").unwrap();
    let Output { status, stdout, stderr } = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&stdout), String::from_utf8_lossy(&stderr));
    assert!(status.success(), "{status}: {stdout}\n{stderr}");
    assert!(stdout.contains("STDIN_STILL_OPEN"), "{stdout}");
}
