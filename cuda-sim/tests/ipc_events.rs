//! Interprocess events: `cuIpcGetEventHandle` and `cuIpcOpenEventHandle`, and a stream in one
//! process waiting, through `cuStreamWaitEvent` on the imported event, for work another process
//! recorded.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;
use cuda_mem_sys::types::CUipcEventHandle;

const HANDLE_ENV: &str = "CUDA_SIM_TEST_EVENT_HANDLE";
const INTERPROCESS: CUevent_flags =
    CUevent_flags(CUevent_flags::CU_EVENT_INTERPROCESS.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0);

fn export(event: CUevent) -> Result<CUipcEventHandle, CUresult> {
    let mut handle = CUipcEventHandle::default();
    // SAFETY: valid out-pointer.
    let code = unsafe { code!(driver(), cuIpcGetEventHandle(&mut handle, event)) };
    if code == CUresult::CUDA_SUCCESS { Ok(handle) } else { Err(code) }
}

fn open(handle: CUipcEventHandle) -> Result<CUevent, CUresult> {
    let mut event = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the handle is passed by value.
    let code = unsafe { code!(driver(), cuIpcOpenEventHandle(&mut event, handle)) };
    if code == CUresult::CUDA_SUCCESS { Ok(event) } else { Err(code) }
}

fn to_hex(handle: &CUipcEventHandle) -> String {
    handle.reserved.iter().map(|&b| format!("{:02x}", b as u8)).collect()
}

fn from_hex(text: &str) -> CUipcEventHandle {
    let mut handle = CUipcEventHandle::default();
    for (i, byte) in handle.reserved.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap() as std::ffi::c_char;
    }
    handle
}

#[test]
fn only_interprocess_events_are_exported_and_handles_are_checked() {
    use_device(0);
    let plain = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
    assert_eq!(export(plain).err(), Some(CUresult::CUDA_ERROR_INVALID_HANDLE), "not interprocess");
    let mut refused = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let code = unsafe { code!(driver(), cuEventCreate(&mut refused, CUevent_flags::CU_EVENT_INTERPROCESS.0)) };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE, "interprocess needs timing off");
    let shared = event(INTERPROCESS);
    let handle = export(shared).unwrap();
    assert_eq!(open(handle).err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "opened by its exporter");
    assert_eq!(open(CUipcEventHandle::default()).err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "zeros");
    let mut forged = handle;
    forged.reserved[3] ^= 1;
    assert_eq!(open(forged).err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "forged");
    // SAFETY: the out-pointer is null.
    let code = unsafe { code!(driver(), cuIpcGetEventHandle(std::ptr::null_mut(), shared)) };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
}

/// The child: opens the parent's event, makes a stream wait for it, and reports that the
/// stream (and the event) are not done while the parent holds its work; then waits for them.
fn waiting_child(handle: &str) {
    use_device(0);
    let imported = open(from_hex(handle)).unwrap();
    let mut ms = 0.0f32;
    // SAFETY: valid out-pointer.
    let timing = unsafe { code!(driver(), cuEventElapsedTime_v2(&mut ms, imported, imported)) };
    assert_eq!(timing, CUresult::CUDA_ERROR_INVALID_HANDLE, "an imported event has timing off");
    let stream = non_blocking_stream();
    wait_event(stream, imported);
    assert_eq!(event_query(imported), CUresult::CUDA_ERROR_NOT_READY);
    assert_eq!(query(stream), CUresult::CUDA_ERROR_NOT_READY, "the stream waits for the other process");
    println!("waiting");
    std::io::stdout().flush().unwrap();
    sync(stream);
    assert_eq!(event_query(imported), CUresult::CUDA_SUCCESS);
    // Recording the imported event here is seen by the exporter too.
    let held = Gate::new();
    hold(held.0, driver(), stream);
    record(imported, stream);
    println!("recorded");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "open");
    held.0.open();
    sync(stream);
    // SAFETY: the event is this process's and no longer used.
    unsafe { cu_call!(driver(), cuEventDestroy_v2(imported)) }.unwrap();
}

#[test]
fn a_stream_waits_for_work_recorded_in_another_process() {
    if let Ok(handle) = std::env::var(HANDLE_ENV) {
        return waiting_child(&handle);
    }
    use_device(0);
    let stream = non_blocking_stream();
    let (gate, _open_on_drop) = Gate::new();
    hold(gate, driver(), stream);
    let shared = event(INTERPROCESS);
    record(shared, stream);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test_name!(), "--nocapture", "--test-threads=1"])
        .env(HANDLE_ENV, to_hex(&export(shared).unwrap()))
        .env_remove(cuda_sim::testing::CHILD_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A child that hangs fails the test instead of hanging it.
    let pid = rustix::process::Pid::from_child(&child);
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    });
    drop(watchdog);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut expect = |want: &str| loop {
        // libtest's "test name ... " precedes the first line on the same line.
        let line = lines.next().expect("the child reports").unwrap();
        if line.ends_with(want) {
            break;
        }
    };
    expect("waiting");
    assert_eq!(event_query(shared), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    expect("recorded");
    // The child's recording, held by its gate, is the event's latest: not done here either.
    assert_eq!(event_query(shared), CUresult::CUDA_ERROR_NOT_READY, "the importer's recording counts");
    let waiter = non_blocking_stream();
    wait_event(waiter, shared);
    assert_eq!(query(waiter), CUresult::CUDA_ERROR_NOT_READY);
    writeln!(child.stdin.as_mut().unwrap(), "open").unwrap();
    sync(waiter);
    assert_eq!(event_query(shared), CUresult::CUDA_SUCCESS);
    let status = child.wait().unwrap();
    for line in lines.map_while(Result::ok) {
        println!("child: {line}");
    }
    assert!(status.success(), "the child failed: {status}");
}
