//! Workers that start on their own connect to an exporter by name: a Python process (the
//! channel layer of `python/cuda_mem_exchange.py`, no cuda.core) connects to a Rust listener in
//! Linux's abstract namespace and the two exchange messages; a process of another user is
//! refused by the default policy (its connection closed, the listener going on) and admitted by
//! `PeerPolicy::AnyUser`.
//!
//! They need only a Python 3; the other user's process needs root (to start it as `nobody`).
//! Without either they say SKIP on stderr and pass without running.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::python::{PythonProcess, workspace};
use cuda_mem_ipc::{ChannelListener, IpcError, PeerPolicy};

/// The user `nobody`.
const NOBODY: u32 = 65534;

fn skip(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let _ = std::io::stderr().write_all(format!("SKIP {test}: {why}\n").as_bytes());
}

/// A name of this test's own in the abstract namespace.
fn name(test: &str) -> String {
    format!("cuda-mem-listener-{test}-{}", std::process::id())
}

/// A Python process running `script` (after importing the module as `cx`), as `uid` if given.
fn python(python: &str, script: &str, uid: Option<u32>) -> Option<PythonProcess> {
    let module = workspace().join("python");
    let mut command = Command::new(python);
    command
        .arg("-c")
        .arg(format!(
            "import sys\nsys.path.insert(0, {:?})\nimport cuda_mem_exchange as cx\n{script}",
            module.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        std::os::unix::process::CommandExt::uid(&mut command, uid);
        std::os::unix::process::CommandExt::gid(&mut command, uid);
    }
    match command.spawn() {
        Ok(child) => Some(PythonProcess::new(child)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("starting {python}: {e}"),
    }
}

#[test]
fn a_python_worker_connects_by_name_and_is_admitted_as_this_user() {
    let name = name("python");
    let listener = ChannelListener::bind_abstract(&name).unwrap();
    let script = format!(
        "ch = cx.Channel.connect_abstract({name:?})\n\
         ch.settimeout(60)\n\
         ch.send(cx.DATA, b'worker ready')\n\
         assert ch.recv().payload == b'welcome'\n\
         print('worker: ok')\n"
    );
    let Some(worker) = python("python3", &script, None) else {
        return skip("no python3 on the PATH");
    };
    let channel = listener.accept().unwrap();
    channel.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    assert_eq!(channel.recv().unwrap().payload, b"worker ready");
    let credentials = channel.peer_credentials().unwrap();
    assert_eq!(credentials.uid, rustix::process::geteuid().as_raw());
    assert_ne!(credentials.pid, std::process::id(), "the worker's own process");
    channel.send(cuda_mem_ipc::wire::MessageKind::Data.code(), b"welcome", &[]).unwrap();
    worker.wait("worker: ok");
}

#[test]
fn another_users_process_is_refused_by_default_and_admitted_by_any_user() {
    if !rustix::process::geteuid().is_root() {
        return skip("starting a process of another user needs root");
    }
    // The system's Python: one that user `nobody` may run.
    let python3 = "/usr/bin/python3";
    if !std::path::Path::new(python3).exists() {
        return skip("no /usr/bin/python3 for user nobody");
    }
    let name = name("nobody");
    let listener = ChannelListener::bind_abstract(&name).unwrap();
    let refused = format!(
        "ch = cx.Channel.connect_abstract({name:?})\n\
         ch.settimeout(60)\n\
         try:\n    ch.recv()\n    raise SystemExit('admitted')\n\
         except cx.PeerClosed:\n    print('refused: ok')\n"
    );
    let worker = python(python3, &refused, Some(NOBODY)).expect("/usr/bin/python3 starts");
    let error = listener.accept().unwrap_err();
    assert!(matches!(&error, IpcError::PeerRefused { credentials } if credentials.uid == NOBODY), "{error}");
    assert!(error.channel_usable(), "the listener goes on");
    worker.wait("refused: ok");

    let listener = listener.with_policy(PeerPolicy::AnyUser);
    let admitted = format!(
        "ch = cx.Channel.connect_abstract({name:?})\n\
         ch.settimeout(60)\n\
         ch.send(cx.DATA, b'from nobody')\n\
         print('admitted: ok')\n"
    );
    let worker = python(python3, &admitted, Some(NOBODY)).expect("/usr/bin/python3 starts");
    let channel = listener.accept().unwrap();
    channel.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    assert_eq!(channel.recv().unwrap().payload, b"from nobody");
    assert_eq!(channel.peer_credentials().map(|c| c.uid), Some(NOBODY));
    worker.wait("admitted: ok");
}
