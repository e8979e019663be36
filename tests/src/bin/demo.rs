//! `demo`: the first thing to run on a new machine (`cargo xtask demo`).
//!
//! It tells the workspace's story in a few timed, checked steps, with the high-level crates:
//!
//! 1. the driver: the library `CUDA_MEM_DRIVER` names; else the real driver when it sees a GPU;
//!    else the `cuda-sim` simulator, with two simulated devices unless `CUDA_SIM_DEVICES` is set
//!    (so that the peer-access step has a peer);
//! 2. the devices and what they support (`cuda-mem-core`);
//! 3. a device pool: allocate, fill on the device, copy to pinned memory and check every word,
//!    with the pool's attributes before, during and after;
//! 4. peer access (two devices or more): device 1 becomes a peer of device 0's pool, copies into
//!    it on its own stream, and loses its access again;
//! 5. a child process: this program again, with `--child`, connected by
//!    `cuda_mem_ipc::spawn_with_channel`;
//! 6. sharing (`cuda-mem-ipc`): an IPC-enabled pool and several buffers go to the child, which
//!    checks each pattern and writes a new one that this process then reads;
//! 7. VMM (`cuda-mem-vmm`): a buffer grows in place, then is made to move (the addresses after
//!    it are reserved first with a raw `cuMemAddressReserve`), and its data stays intact through
//!    the old and the new buffers; then the child maps it and writes it;
//! 8. the child's exit, and a check that nothing failed while being released.
//!
//! It ends with a table of the steps and how long each took, and exits non-zero on any error or
//! mismatch. `demo --child` is the child's side; it is not meant to be run by hand.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_mem_core::sys::{DEFAULT_LIBRARY, DRIVER_ENV, cu_call};
use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, DeviceProperties, DevicePtr, FillPattern,
    HandleTypes, LegacyPinnedMemoryResource, MemoryPool, MemoryResource, MemoryResourceExt, PinnedMemoryResource,
    Stream, StreamOptions,
};
use cuda_mem_ipc::{Channel, IpcChannel, IpcError, Received, SharedKind, spawn_with_channel};
use cuda_mem_vmm::ipc::{recv_virtual_buffer, send_virtual_buffer};
use cuda_mem_vmm::{HandleType, VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions};
use tests::driver_choice::How;

/// Any failure of the demo, printed with its causes.
type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: demo\n\nShows and checks what the cuda-mem crates do: a device pool, peer access, sharing \
                     pools and buffers with a child process, and growing and sharing virtual memory. The driver is \
                     the library CUDA_MEM_DRIVER names, else libcuda.so.1 when it finds a GPU, else the cuda-sim \
                     simulator (CUDA_SIM_LIB, or libcuda_sim.so beside this program), with CUDA_SIM_DEVICES=2 unless \
                     it is set.";

/// The argument that makes this program the child of another demo.
const CHILD_ARG: &str = "--child";
/// The simulator's device count variable (read at its first `cuInit`).
const SIM_DEVICES_ENV: &str = "CUDA_SIM_DEVICES";

/// Bytes of the device-pool step's buffer, and the word it is filled with.
const POOL_BYTES: usize = 32 << 20;
const POOL_WORD: u32 = 0xC0FF_EE11;
/// Bytes of the peer-access step's buffers; what device 0 writes, then what device 1 copies in.
const PEER_BYTES: usize = 8 << 20;
const PEER_OWNER_WORD: u32 = 0x0000_0D00;
const PEER_WORD: u32 = 0x0000_0D01;
/// Sizes of the buffers shared with the child.
const SHARED_SIZES: [usize; 4] = [64 << 10, 1 << 20, 4 << 20, 16 << 20];
/// The words written into the virtual buffer: before the in-place grow, before the moving grow,
/// through the moved buffer, and by the child.
const VMM_FIRST: u32 = 0x7777_0001;
const VMM_SECOND: u32 = 0x7777_0002;
const VMM_THIRD: u32 = 0x7777_0003;
const VMM_CHILD: u32 = 0x7777_0004;
/// What a host buffer holds before a download, so that a copy that never happened shows.
const SENTINEL: u8 = 0xA5;
/// How long either process waits for the other's reply, and the child for its exit.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => parent_main(),
        [CHILD_ARG] => child_main(),
        ["--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("demo: unexpected arguments {other:?}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parent: the steps, in order.
// ---------------------------------------------------------------------------------------------

/// Runs every step, prints the table, and turns the outcome into the exit status.
fn parent_main() -> ExitCode {
    let devices_defaulted = default_simulated_devices();
    let mut report = Report::default();
    run(&mut report, devices_defaulted);
    report.print();
    let skipped = report.count(Status::Skipped);
    let failed: Vec<&str> = report.rows.iter().filter(|r| r.status == Status::Failed).map(|r| r.name).collect();
    if failed.is_empty() {
        let skipped = if skipped > 0 { format!(" ({skipped} skipped: see above)") } else { String::new() };
        println!("\nall steps passed{skipped}");
        ExitCode::SUCCESS
    } else {
        eprintln!("\ndemo FAILED: {} step(s) failed: {}", failed.len(), failed.join(", "));
        ExitCode::FAILURE
    }
}

/// The steps. A step whose prerequisite failed or is missing is skipped, saying why.
fn run(report: &mut Report, devices_defaulted: bool) {
    let Some(chosen) = report.timed("choose the driver", || choose_driver(devices_defaulted)) else {
        return;
    };
    let Some(demo) = report.step("devices", || open_devices(chosen)) else {
        return;
    };

    report.step("device pool", || device_pool(&demo));

    match demo.peer() {
        Ok(peer) => {
            report.step("peer access", || peer_access(&demo, peer));
        }
        Err(why) => report.skip("peer access", &why),
    }

    let mut child = report.step("spawn the child", || spawn_child(&demo));
    match (&child, demo.pool_ipc) {
        (Some(child), true) => {
            report.step("share a pool with the child", || share_pool(&demo, child));
        }
        (None, _) => report.skip("share a pool with the child", "the child did not start"),
        (Some(_), false) => report.skip(
            "share a pool with the child",
            "device 0's memory pools cannot be shared by file descriptor (CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)",
        ),
    }

    let mut vmm = None;
    let mut moved = None;
    if demo.properties.virtual_memory_management_supported {
        vmm = report.step("VMM: grow in place", || vmm_grow_in_place(&demo));
        match &mut vmm {
            Some(vmm) => moved = report.step("VMM: forced moving grow", || vmm_moving_grow(&demo, vmm)),
            None => report.skip("VMM: forced moving grow", "the in-place step failed"),
        }
    } else {
        let why = "device 0 does not support virtual memory management";
        report.skip("VMM: grow in place", why);
        report.skip("VMM: forced moving grow", why);
    }
    match (&child, &vmm, &mut moved) {
        (None, ..) => report.skip("VMM: share with the child", "the child did not start"),
        (Some(child), ..) if !child.in_step.get() => {
            report.skip("VMM: share with the child", "the channel to the child is out of step after a failure");
        }
        (Some(child), Some(vmm), Some(moved)) if demo.properties.posix_fd_handles_supported => {
            report.step("VMM: share with the child", || vmm_share(&demo, child, vmm, moved));
        }
        (_, Some(_), Some(_)) => report.skip(
            "VMM: share with the child",
            "device 0 cannot export VMM memory as file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)",
        ),
        _ => report.skip("VMM: share with the child", "there is no grown virtual buffer to share"),
    }

    if let Some(child) = child.take() {
        report.step("the child exits", || finish_child(child));
    }
    let simulator = demo.simulator;
    drop((moved, vmm, demo));
    report.step("everything released", || check_released(simulator));
}

/// Asks for two simulated devices, so that the peer-access step has a peer, unless
/// `CUDA_SIM_DEVICES` is set already (the user's choice stands). The simulator reads it at its
/// first `cuInit`, so this runs before any driver is loaded; a real driver ignores it. Returns
/// whether it set it.
fn default_simulated_devices() -> bool {
    if std::env::var_os(SIM_DEVICES_ENV).is_some() {
        return false;
    }
    // SAFETY: this runs first thing in `main`, before the process has started any thread or
    // loaded any library that could read or write the environment concurrently.
    unsafe { std::env::set_var(SIM_DEVICES_ENV, "2") };
    true
}

/// The driver chosen and installed as the process-wide one.
struct ChosenDriver {
    /// Where it was loaded from (the child loads the same library).
    path: PathBuf,
    /// Whether it is the `cuda-sim` simulator.
    simulator: bool,
}

/// Picks the driver, installs it as the process-wide one, and prints, as the first line of
/// output, which one it is.
fn choose_driver(devices_defaulted: bool) -> Result<ChosenDriver, Error> {
    let choice = tests::driver_choice::choose("demo", "`cargo xtask demo` (it builds cuda-sim first)")?;
    let simulator = choice.is_simulator();
    match &choice.how {
        How::Named => {
            println!("driver: {} (named by {DRIVER_ENV})", choice.driver.path().display());
            if simulator {
                println!("  it is the cuda-sim SIMULATOR");
            }
        }
        How::Real { devices } => {
            println!("driver: the CUDA driver {DEFAULT_LIBRARY}, which sees {devices} device(s)");
        }
        How::NoGpu { why_not_real } => {
            println!(
                "driver: no GPU found, so this runs on the cuda-sim SIMULATOR at {}",
                choice.driver.path().display()
            );
            println!("  ({DEFAULT_LIBRARY}: {why_not_real}; set {DRIVER_ENV} to choose a driver library)");
        }
    }
    if simulator {
        if devices_defaulted {
            println!(
                "  simulating 2 devices: {SIM_DEVICES_ENV} was unset, so the demo set it to 2 before the first cuInit, \
                 for the peer-access step"
            );
        } else {
            let count = std::env::var(SIM_DEVICES_ENV).unwrap_or_default();
            println!("  simulating {SIM_DEVICES_ENV}={count} device(s), as the environment says");
        }
    }
    let path = choice.driver.path().to_path_buf();
    cuda_mem_core::sys::install_driver(choice.driver).map_err(|_| "a process-wide driver was already installed")?;
    Ok(ChosenDriver { path, simulator })
}

/// What the steps share: the driver, device 0 and its stream, and what the devices support.
struct Demo {
    driver_path: PathBuf,
    simulator: bool,
    gpu: Gpu,
    devices: Vec<Device>,
    /// Device 0's properties.
    properties: DeviceProperties,
    /// Whether device 0's pools can be shared by file descriptor.
    pool_ipc: bool,
    /// Whether device 1 (if there is one) can access device 0's memory.
    peer_reachable: bool,
}

impl Demo {
    /// Device 1, the peer of the peer-access step, or why that step cannot run.
    fn peer(&self) -> Result<Device, String> {
        let Some(&peer) = self.devices.get(1) else {
            let hint = if self.simulator { format!(" (run with {SIM_DEVICES_ENV}=2 or more)") } else { String::new() };
            return Err(format!("it needs two devices and there is one{hint}"));
        };
        if self.peer_reachable {
            Ok(peer)
        } else {
            Err("device 1 cannot access device 0's memory (cuDeviceCanAccessPeer)".to_string())
        }
    }
}

/// Initializes the driver and describes every device.
fn open_devices(chosen: ChosenDriver) -> Result<Demo, Error> {
    let driver = cuda_mem_core::driver()?;
    let version = driver.version()?;
    println!("  driver version: CUDA {}.{} ({version})", version / 1000, (version % 1000) / 10);
    let devices = Device::all()?;
    if devices.is_empty() {
        return Err("the driver reports no devices".into());
    }
    for device in &devices {
        let p = device.properties()?;
        println!(
            "  {device}: {}, {}, compute capability {}.{}",
            p.name,
            format_bytes(p.total_memory as u64),
            p.compute_capability.0,
            p.compute_capability.1
        );
        println!(
            "    memory pools: {} (shareable by fd: {}); virtual memory management: {} (shareable by fd: {})",
            yes_no(p.memory_pools_supported),
            yes_no(p.mempool_supported_handle_types.contains(HandleTypes::POSIX_FD)),
            yes_no(p.virtual_memory_management_supported),
            yes_no(p.posix_fd_handles_supported)
        );
    }
    let properties = devices[0].properties()?;
    if !properties.memory_pools_supported {
        return Err("device 0 does not support memory pools, which every step but VMM uses".into());
    }
    let peer_reachable = match devices.get(1) {
        Some(peer) => peer.can_access_peer(devices[0])?,
        None => false,
    };
    if devices.len() > 1 {
        println!("  device 1 can access device 0's memory: {}", yes_no(peer_reachable));
    }
    let gpu = Gpu::open()?;
    println!("  pinned host memory for reading results back: {}", gpu.staging_kind);
    Ok(Demo {
        driver_path: chosen.path,
        simulator: chosen.simulator,
        gpu,
        devices,
        pool_ipc: properties.mempool_supported_handle_types.contains(HandleTypes::POSIX_FD),
        properties,
        peer_reachable,
    })
}

/// A pool of its own on device 0: allocate, fill on the device, read back through pinned
/// memory, free, with the pool's attributes at each stage.
fn device_pool(demo: &Demo) -> Result<(), Error> {
    let gpu = &demo.gpu;
    let pool = DeviceMemoryResource::new(gpu.device, DeviceMemoryResourceOptions::default())?;
    println!(
        "  DeviceMemoryResource::new({}): a pool of its own, release threshold {} (memory beyond it goes back \
         at each synchronization)",
        gpu.device,
        format_bytes(pool.pool().release_threshold()?)
    );
    print_attributes("new:", pool.pool())?;
    let mut buffer = pool.allocate(POOL_BYTES, &gpu.stream).context("allocating 32 MiB from the pool")?;
    buffer.fill(FillPattern::U32(POOL_WORD), &gpu.stream)?;
    gpu.expect_words(&buffer, POOL_BYTES, POOL_WORD, "the pool buffer")?;
    println!(
        "  allocated {} at {:#x}, filled it with {POOL_WORD:#010x} on the device, copied it to pinned memory: \
         every word checked",
        format_bytes(POOL_BYTES as u64),
        buffer.ptr()
    );
    print_attributes("with the buffer:", pool.pool())?;
    buffer.close(None)?;
    gpu.stream.synchronize()?;
    print_attributes("freed, synchronized:", pool.pool())?;
    Ok(())
}

/// Makes `peer` a peer of a pool on device 0, copies into the pool's memory on the peer's
/// stream, checks, and revokes the access.
fn peer_access(demo: &Demo, peer: Device) -> Result<(), Error> {
    let gpu = &demo.gpu;
    let owner = gpu.device;
    let pool = DeviceMemoryResource::new(owner, DeviceMemoryResourceOptions::default())?;
    let mut target = pool.allocate(PEER_BYTES, &gpu.stream).context("allocating from device 0's pool")?;
    target.fill(FillPattern::U32(PEER_OWNER_WORD), &gpu.stream)?;
    gpu.stream.synchronize()?;

    let peer_stream = Stream::new(peer, StreamOptions::default().non_blocking())?;
    let peer_pool = DeviceMemoryResource::new(peer, DeviceMemoryResourceOptions::default())?;
    let mut source = peer_pool.allocate(PEER_BYTES, &peer_stream).context("allocating from device 1's pool")?;
    source.fill(FillPattern::U32(PEER_WORD), &peer_stream)?;
    println!("  {owner}'s pool: peer_accessible_by() = {}", format_devices(&pool.pool().peer_accessible_by()?));

    if demo.simulator {
        // Only on the simulator, which refuses the call: a GPU would fault later instead.
        match target.copy_from(&source, &peer_stream) {
            Err(e) => println!("  without access, a copy on {peer}'s stream into it is refused (simulator): {e}"),
            Ok(()) => {
                return Err("the simulator accepted a copy into a pool the copying device has no access to".into());
            }
        }
    }

    pool.pool().set_peer_accessible_by([peer])?;
    let peers = pool.pool().peer_accessible_by()?;
    println!("  set_peer_accessible_by([{peer}]): peer_accessible_by() = {}", format_devices(&peers));
    if !peers.contains(&peer) {
        return Err(format!("{peer} is not among the pool's peers after set_peer_accessible_by").into());
    }
    target.copy_from(&source, &peer_stream).context("copying on device 1's stream with access granted")?;
    peer_stream.synchronize()?;
    gpu.expect_words(&target, PEER_BYTES, PEER_WORD, "the pool buffer after the copy on device 1's stream")?;
    println!(
        "  copied {} of {PEER_WORD:#010x} from {peer}'s memory into the pool on {peer}'s stream: every word checked",
        format_bytes(PEER_BYTES as u64)
    );

    pool.pool().set_peer_accessible_by([])?;
    let peers = pool.pool().peer_accessible_by()?;
    println!("  revoked with set_peer_accessible_by([]): peer_accessible_by() = {}", format_devices(&peers));
    if !peers.is_empty() {
        return Err(format!("the pool still has peers after revoking: {}", format_devices(&peers)).into());
    }
    Ok(())
}

/// Starts this program again as the child, connected by a channel, and waits for it to say it
/// is ready.
fn spawn_child(demo: &Demo) -> Result<ChildProcess, Error> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(&exe);
    command.arg(CHILD_ARG).env(DRIVER_ENV, &demo.driver_path).stdin(Stdio::null());
    let (process, channel) = spawn_with_channel(&mut command)?;
    let child = ChildProcess { process: KillOnDrop(process), ipc: IpcChannel::new(channel), in_step: Cell::new(true) };
    child.ipc.channel().set_read_timeout(Some(CHILD_TIMEOUT))?;
    let hello = child.reply(&demo.gpu.stream)?;
    println!(
        "  started `{} {CHILD_ARG}` (pid {}) with spawn_with_channel, {DRIVER_ENV}={}",
        exe.file_name().map_or_else(|| exe.display().to_string(), |n| n.to_string_lossy().into_owned()),
        child.process.0.id(),
        demo.driver_path.display()
    );
    println!("  the child says: {hello}");
    Ok(child)
}

/// Sends an IPC-enabled pool and several buffers to the child, which checks each pattern and
/// writes another; then checks the child's patterns here.
fn share_pool(demo: &Demo, child: &ChildProcess) -> Result<(), Error> {
    let gpu = &demo.gpu;
    let pool = DeviceMemoryResource::new(gpu.device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    let patterns: Vec<Patterns> = (0..SHARED_SIZES.len()).map(shared_patterns).collect();
    let mut buffers = Vec::with_capacity(SHARED_SIZES.len());
    for (&size, p) in SHARED_SIZES.iter().zip(&patterns) {
        let mut buffer = pool.allocate(size, &gpu.stream).context("allocating from the IPC-enabled pool")?;
        buffer.fill(FillPattern::U32(p.expect), &gpu.stream)?;
        buffers.push(buffer);
    }
    gpu.stream.synchronize()?;
    child.request(&Request::Buffers(patterns.clone()))?;
    child.ipc.send_buffers(&buffers.iter().collect::<Vec<_>>()).context("sending the buffers")?;
    let sizes: Vec<String> = SHARED_SIZES.iter().map(|&s| format_bytes(s as u64)).collect();
    println!(
        "  sent an IPC-enabled pool (its file descriptor) and {} buffers of it ({}) with send_buffers",
        buffers.len(),
        sizes.join(", ")
    );
    let reply = child.reply(&gpu.stream)?;
    println!("  the child replies: {reply}");
    for (index, (buffer, p)) in buffers.iter().zip(&patterns).enumerate() {
        gpu.expect_words(buffer, buffer.size(), p.write, &format!("shared buffer {index} after the child wrote it"))?;
    }
    println!("  every buffer here now holds the child's pattern: both processes use the same memory");
    Ok(())
}

/// The patterns of shared buffer `index`: what this process writes, what the child writes.
fn shared_patterns(index: usize) -> Patterns {
    Patterns { expect: 0x5AFE_0000 + index as u32, write: 0xB0B0_0000 + index as u32 }
}

/// A virtual buffer and the buffers grown from it.
struct Vmm {
    resource: Arc<VirtualMemoryResource>,
    /// The first allocation: one chunk.
    small: VirtualBuffer,
    /// `small` grown to two chunks.
    grown: VirtualBuffer,
}

/// Allocates one chunk of virtual memory, grows it to two in place, and checks the data through
/// both buffers.
fn vmm_grow_in_place(demo: &Demo) -> Result<Vmm, Error> {
    let gpu = &demo.gpu;
    let mut options = VirtualMemoryResourceOptions::default();
    if !demo.properties.posix_fd_handles_supported {
        options = options.handle_type(HandleType::None);
    }
    let resource = VirtualMemoryResource::new(gpu.device, options)?;
    let chunk = resource.granularity();
    let mut small = resource.allocate(chunk, Some(&gpu.stream)).context("allocating virtual memory")?;
    small.fill(FillPattern::U32(VMM_FIRST), &gpu.stream)?;
    println!(
        "  allocated {} (the granularity) at {:#x}, filled it with {VMM_FIRST:#010x}",
        format_bytes(chunk as u64),
        small.ptr()
    );
    let grown = small.grow(2 * chunk).context("growing to two chunks")?;
    if grown.ptr() == small.ptr() {
        println!(
            "  grow({}): in place, the pointer stays {:#x}; {} chunks, nothing copied",
            format_bytes(grown.size() as u64),
            grown.ptr(),
            grown.chunk_count()
        );
    } else {
        println!(
            "  grow({}): the addresses after the buffer were taken, so it moved to {:#x} (remapped, not copied)",
            format_bytes(grown.size() as u64),
            grown.ptr()
        );
    }
    gpu.expect_words(grown.as_buffer(), chunk, VMM_FIRST, "the grown buffer's first chunk")?;
    gpu.expect_words(small.as_buffer(), chunk, VMM_FIRST, "the original buffer after the grow")?;
    println!(
        "  the first {} reads {VMM_FIRST:#010x} through the old buffer and the new one",
        format_bytes(chunk as u64)
    );
    Ok(Vmm { resource, small, grown })
}

/// Reserves the addresses right after the grown buffer with the raw driver API, so that growing
/// it again must move it; checks that the data is intact through the old and new buffers and
/// that they alias the same memory.
fn vmm_moving_grow(demo: &Demo, vmm: &mut Vmm) -> Result<VirtualBuffer, Error> {
    let gpu = &demo.gpu;
    let chunk = vmm.resource.granularity();
    vmm.grown.fill(FillPattern::U32(VMM_SECOND), &gpu.stream)?;
    let end = vmm.grown.ptr() + vmm.grown.mapped_size() as DevicePtr;
    gpu.device.set_current()?;
    let blocker = AddressBlock::reserve_at(end, chunk).context("reserving the addresses after the buffer")?;
    let blocked = blocker.ptr == end;
    if blocked {
        println!(
            "  reserved the {} right after the buffer ({end:#x}) with a raw cuMemAddressReserve",
            format_bytes(chunk as u64)
        );
    } else {
        println!(
            "  asked cuMemAddressReserve for {end:#x} but the driver gave {:#x}: the next grow may stay in place",
            blocker.ptr
        );
    }
    let mut moved = vmm.grown.grow(4 * chunk).context("growing to four chunks")?;
    drop(blocker);
    if moved.ptr() == vmm.grown.ptr() {
        if blocked {
            return Err("the grow stayed in place though the addresses after the buffer were reserved".into());
        }
        println!("  grow({}): in place after all", format_bytes(moved.size() as u64));
    } else {
        println!(
            "  grow({}): moved from {:#x} to {:#x}; its {} chunks are mapped at the new address, nothing copied",
            format_bytes(moved.size() as u64),
            vmm.grown.ptr(),
            moved.ptr(),
            moved.chunk_count()
        );
    }
    gpu.expect_words(moved.as_buffer(), 2 * chunk, VMM_SECOND, "the moved buffer's first two chunks")?;
    gpu.expect_words(vmm.grown.as_buffer(), 2 * chunk, VMM_SECOND, "the buffer it grew from")?;
    println!("  the data written before the move reads {VMM_SECOND:#010x} through the old buffer and the moved one");
    moved.fill(FillPattern::U32(VMM_THIRD), &gpu.stream)?;
    gpu.expect_words(vmm.small.as_buffer(), chunk, VMM_THIRD, "the first buffer, after a write through the moved one")?;
    gpu.expect_words(
        vmm.grown.as_buffer(),
        2 * chunk,
        VMM_THIRD,
        "the second buffer, after a write through the moved one",
    )?;
    println!("  {VMM_THIRD:#010x} written through the moved buffer reads back through the first two: one memory");
    Ok(moved)
}

/// Sends the moved virtual buffer to the child, which maps it, checks it and writes it; then
/// checks the child's pattern here.
fn vmm_share(demo: &Demo, child: &ChildProcess, vmm: &Vmm, moved: &mut VirtualBuffer) -> Result<(), Error> {
    let gpu = &demo.gpu;
    child.request(&Request::Vmm(Patterns { expect: VMM_THIRD, write: VMM_CHILD }))?;
    send_virtual_buffer(child.ipc.channel(), moved).context("sending the virtual buffer")?;
    println!(
        "  sent the {} virtual buffer with send_virtual_buffer: {} chunks, one file descriptor each",
        format_bytes(moved.size() as u64),
        moved.chunk_count()
    );
    let reply = child.reply(&gpu.stream)?;
    println!("  the child replies: {reply}");
    gpu.expect_words(moved.as_buffer(), moved.size(), VMM_CHILD, "the virtual buffer after the child wrote it")?;
    gpu.expect_words(vmm.small.as_buffer(), vmm.small.size(), VMM_CHILD, "the first buffer after the child wrote it")?;
    println!("  the child's {VMM_CHILD:#010x} reads back here through the moved buffer and the first one");
    Ok(())
}

/// Asks the child to quit (or, after a failure left the channel out of step, closes it) and
/// checks that it exits successfully.
fn finish_child(child: ChildProcess) -> Result<(), Error> {
    let ChildProcess { mut process, ipc, in_step } = child;
    let asked = in_step.get() && ipc.send_data(Request::Quit.encode().as_bytes()).is_ok();
    drop(ipc);
    let status = process.wait(CHILD_TIMEOUT)?;
    if !asked {
        return Err(format!("the channel was out of step, so it was closed; the child exited with {status}").into());
    }
    if !status.success() {
        return Err(format!("the child exited with {status}").into());
    }
    println!("  the child exited: {status}");
    Ok(())
}

/// Checks that nothing failed while being freed (errors in `Drop` are recorded, not lost) and,
/// on the simulator, that no VMM object or pool is left.
fn check_released(simulator: bool) -> Result<(), Error> {
    let errors = cuda_mem_core::take_drop_errors();
    for e in &errors {
        eprintln!("  error while releasing {}: {}", e.what, describe(&e.error));
    }
    if !errors.is_empty() {
        return Err(format!("{} error(s) while releasing memory", errors.len()).into());
    }
    println!("  no errors while freeing buffers, pools, mappings and reservations");
    if simulator {
        let live = cuda_sim::testing::live_objects(cuda_mem_core::driver()?)?;
        println!(
            "  simulator: {} pools, {} reservations, {} mappings, {} physical allocations left",
            live.pools, live.reservations, live.mappings, live.physical_allocations
        );
        if live.pools + live.reservations + live.mappings + live.physical_allocations > 0 {
            return Err(format!("the simulator still holds objects the demo made: {live:?}").into());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Shared by the parent and the child.
// ---------------------------------------------------------------------------------------------

/// Device 0, a stream on it, and pinned host memory to read results back through.
struct Gpu {
    device: Device,
    stream: Stream,
    staging: Arc<dyn MemoryResource>,
    staging_kind: &'static str,
}

impl Gpu {
    /// Device 0 (its primary context made current), a non-blocking stream, and the current
    /// pinned pool (or `cuMemAllocHost` where the driver has no pinned pools).
    fn open() -> Result<Gpu, Error> {
        let device = Device::new(0)?;
        device.set_current()?;
        let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
        let (staging, staging_kind): (Arc<dyn MemoryResource>, _) = match PinnedMemoryResource::current() {
            Ok(pinned) => (pinned, "the current pinned pool (PinnedMemoryResource::current)"),
            Err(_) => (
                LegacyPinnedMemoryResource::new(device),
                "cuMemAllocHost (LegacyPinnedMemoryResource: this driver has no pinned pools)",
            ),
        };
        Ok(Gpu { device, stream, staging, staging_kind })
    }

    /// Copies `buffer` to pinned host memory and checks that its first `len` bytes hold `word`
    /// over and over.
    fn expect_words(&self, buffer: &Buffer, len: usize, word: u32, what: &str) -> Result<(), Error> {
        let mut host = self.staging.allocate(buffer.size(), &self.stream).context("allocating pinned memory")?;
        host.host_slice_mut()?.fill(SENTINEL);
        host.copy_from(buffer, &self.stream).context(format!("copying {what} to pinned memory"))?;
        let bytes = host.host_slice()?;
        let prefix = bytes.get(..len).ok_or_else(|| format!("{what}: {len} bytes to check in {}", bytes.len()))?;
        check_words(prefix, word).map_err(|e| format!("{what}: {e}").into())
    }
}

/// Says what was being done when an error happened.
trait Context<T> {
    fn context(self, what: impl fmt::Display) -> Result<T, Error>;
}

impl<T, E: Into<Error>> Context<T> for Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T, Error> {
        self.map_err(|e| format!("{what}: {}", describe(e.into().as_ref())).into())
    }
}

/// Checks that `bytes` is `word` repeated, describing the mismatches.
fn check_words(bytes: &[u8], word: u32) -> Result<(), String> {
    let expected = word.to_ne_bytes();
    let mut mismatches = bytes.chunks(4).enumerate().filter(|(_, w)| *w != expected.as_slice());
    let Some((first, got)) = mismatches.next() else {
        return Ok(());
    };
    let count = 1 + mismatches.count();
    let got_hex: String = got.iter().rev().map(|b| format!("{b:02x}")).collect();
    let sentinel = if got.iter().all(|&b| b == SENTINEL) { " (the sentinel: nothing was copied there)" } else { "" };
    Err(format!(
        "{count} of {} words differ; the first at byte {}: got 0x{got_hex}, expected {word:#010x}{sentinel}",
        bytes.len().div_ceil(4),
        first * 4
    ))
}

/// What the parent writes into a shared buffer, and what it asks the child to write.
#[derive(Debug, Clone, Copy)]
struct Patterns {
    expect: u32,
    write: u32,
}

impl fmt::Display for Patterns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}>{:08x}", self.expect, self.write)
    }
}

impl Patterns {
    fn parse(word: &str) -> Result<Patterns, String> {
        let bad = || format!("{word:?} is not EXPECT>WRITE in hexadecimal");
        let (expect, write) = word.split_once('>').ok_or_else(bad)?;
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        Ok(Patterns { expect: hex(expect)?, write: hex(write)? })
    }
}

/// What the parent asks of the child: a text message each (then, for buffers, the buffers).
#[derive(Debug)]
enum Request {
    /// Receive buffers (and their pool), check `expect` in each and write `write`.
    Buffers(Vec<Patterns>),
    /// Receive a virtual buffer, check and write it.
    Vmm(Patterns),
    /// Exit.
    Quit,
}

impl Request {
    fn encode(&self) -> String {
        match self {
            Request::Buffers(patterns) => patterns.iter().fold("buffers".to_string(), |s, p| format!("{s} {p}")),
            Request::Vmm(p) => format!("vmm {p}"),
            Request::Quit => "quit".to_string(),
        }
    }

    fn parse(bytes: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "a request that is not UTF-8".to_string())?;
        let mut words = text.split_whitespace();
        match (words.next(), words.clone().count()) {
            (Some("buffers"), _) => Ok(Request::Buffers(words.map(Patterns::parse).collect::<Result<_, _>>()?)),
            (Some("vmm"), 1) => Ok(Request::Vmm(Patterns::parse(words.next().unwrap_or_default())?)),
            (Some("quit"), 0) => Ok(Request::Quit),
            _ => Err(format!("an unknown request {text:?}")),
        }
    }
}

/// The child process and the channel to it.
struct ChildProcess {
    process: KillOnDrop,
    ipc: IpcChannel,
    /// Whether every request so far has had its reply: after a step failed part way, the next
    /// message on the channel is not what either side expects, and no new request is sent.
    in_step: Cell<bool>,
}

impl ChildProcess {
    /// Sends a request (its reply is due before the next one).
    fn request(&self, request: &Request) -> Result<(), Error> {
        if !self.in_step.get() {
            return Err("the channel to the child is out of step after an earlier failure".into());
        }
        self.in_step.set(false);
        Ok(self.ipc.send_data(request.encode().as_bytes())?)
    }

    /// The child's next reply: `ok …` is its text, `error …` an error.
    fn reply(&self, stream: &Stream) -> Result<String, Error> {
        let bytes = match self.ipc.recv(stream) {
            Ok(Received::Data(bytes)) => bytes,
            Ok(_) => return Err("the child sent a pool or buffers where a reply was due".into()),
            Err(IpcError::PeerClosed) => {
                return Err("the child closed the channel (it exited: see its errors above)".into());
            }
            Err(e) => return Err(e.into()),
        };
        let text = String::from_utf8_lossy(&bytes);
        let reply = match text.split_once(' ') {
            Some(("ok", rest)) => Ok(rest.to_string()),
            Some(("error", rest)) => Err(format!("the child reports: {rest}").into()),
            _ => return Err(format!("the child replied {text:?}").into()),
        };
        self.in_step.set(true);
        reply
    }
}

/// A child process, killed if dropped while it still runs (after a failure).
struct KillOnDrop(Child);

impl KillOnDrop {
    /// Waits for the child to exit, at most `timeout`; kills it after that.
    fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.0.kill()?;
                self.0.wait()?;
                return Err(format!("the child did not exit within {} s and was killed", timeout.as_secs()).into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// An address range reserved with the raw driver API, as another allocator in the process might
/// hold it; freed when dropped (a failure is recorded with the library's drop errors).
struct AddressBlock {
    ptr: DevicePtr,
    size: usize,
}

impl AddressBlock {
    /// `cuMemAddressReserve` of `size` bytes, asking for the address `hint`.
    fn reserve_at(hint: DevicePtr, size: usize) -> Result<AddressBlock, Error> {
        let driver = cuda_mem_core::driver()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid, writable CUdeviceptr for the duration of the call; the other
        // arguments are plain values (alignment 0: the default; flags must be 0).
        unsafe { cu_call!(driver, cuMemAddressReserve(&mut ptr, size, 0, hint, 0)) }?;
        Ok(AddressBlock { ptr, size })
    }
}

impl Drop for AddressBlock {
    fn drop(&mut self) {
        let free = || -> Result<(), cuda_mem_core::Error> {
            let driver = cuda_mem_core::driver()?;
            // SAFETY: the exact range `reserve_at` reserved, with nothing mapped in it, freed once.
            unsafe { cu_call!(driver, cuMemAddressFree(self.ptr, self.size)) }?;
            Ok(())
        };
        if let Err(e) = free() {
            cuda_mem_core::record_drop_error("the demo's address reservation", e);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The child.
// ---------------------------------------------------------------------------------------------

/// `demo --child`: serves the parent's requests until it says quit.
fn child_main() -> ExitCode {
    match serve_parent() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("  [child {}] error: {}", std::process::id(), describe(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Takes the channel, opens device 0, says so, then answers each request with `ok …` or
/// `error …`.
fn serve_parent() -> Result<(), Error> {
    let ipc = IpcChannel::new(Channel::from_env()?);
    ipc.channel().set_read_timeout(Some(CHILD_TIMEOUT))?;
    let gpu = match Gpu::open().and_then(|gpu| Ok((gpu.device.name()?, gpu))) {
        Ok((name, gpu)) => {
            ipc.send_data(format!("ok pid {} is ready on {} ({name})", std::process::id(), gpu.device).as_bytes())?;
            gpu
        }
        Err(e) => {
            let _ = ipc.send_data(format!("error {}", describe(e.as_ref())).as_bytes());
            return Err(e);
        }
    };
    let mut vmm = None;
    loop {
        let request = match ipc.recv(&gpu.stream) {
            Ok(Received::Data(bytes)) => Request::parse(&bytes)?,
            Ok(_) => return Err("the parent sent a pool or buffers where a request was due".into()),
            Err(IpcError::PeerClosed) => {
                return Err("the parent closed the channel without asking the child to quit".into());
            }
            Err(e) => return Err(e.into()),
        };
        let outcome = match request {
            Request::Quit => return Ok(()),
            Request::Buffers(patterns) => child_check_buffers(&ipc, &gpu, &patterns),
            Request::Vmm(patterns) => child_check_virtual_buffer(&ipc, &gpu, &mut vmm, patterns),
        };
        let reply = match outcome {
            Ok(summary) => format!("ok {summary}"),
            Err(e) => format!("error {}", describe(e.as_ref())),
        };
        ipc.send_data(reply.as_bytes())?;
    }
}

/// Receives the pool and the buffers, checks each buffer's pattern and writes the new one.
fn child_check_buffers(ipc: &IpcChannel, gpu: &Gpu, patterns: &[Patterns]) -> Result<String, Error> {
    let pid = std::process::id();
    // The imported pools: buffers can only be mapped while their pool is alive here.
    let mut pools = Vec::new();
    let mut buffers = loop {
        match ipc.recv(&gpu.stream).context("receiving the pool and the buffers")? {
            Received::Resource(pool) => {
                let kind = match pool.kind() {
                    SharedKind::Device(device) => format!("memory of {device}"),
                    SharedKind::Pinned => "pinned host memory".to_string(),
                };
                println!("  [child {pid}] imported the pool {} ({kind})", pool.uuid());
                pools.push(pool);
            }
            Received::Buffers(buffers) => break buffers,
            Received::Data(_) => return Err("a request arrived where buffers were due".into()),
        }
    };
    if buffers.len() != patterns.len() {
        return Err(format!("{} buffers arrived for {} patterns", buffers.len(), patterns.len()).into());
    }
    for (index, (buffer, p)) in buffers.iter_mut().zip(patterns).enumerate() {
        gpu.expect_words(buffer, buffer.size(), p.expect, &format!("imported buffer {index}"))?;
        buffer.fill(FillPattern::U32(p.write), &gpu.stream)?;
    }
    gpu.stream.synchronize()?;
    let addresses: Vec<String> = buffers.iter().map(|b| format!("{:#x}", b.ptr())).collect();
    println!(
        "  [child {pid}] mapped {} buffers (at {}), checked each pattern, wrote new ones",
        buffers.len(),
        addresses.join(", ")
    );
    Ok(format!("{} buffers checked and rewritten", buffers.len()))
}

/// Receives a virtual buffer, maps it with a resource of its own, checks it and writes it.
fn child_check_virtual_buffer(
    ipc: &IpcChannel,
    gpu: &Gpu,
    vmm: &mut Option<Arc<VirtualMemoryResource>>,
    patterns: Patterns,
) -> Result<String, Error> {
    let resource = match vmm {
        Some(resource) => Arc::clone(resource),
        None => {
            Arc::clone(vmm.insert(VirtualMemoryResource::new(gpu.device, VirtualMemoryResourceOptions::default())?))
        }
    };
    let mut buffer =
        recv_virtual_buffer(ipc.channel(), &resource, Some(&gpu.stream)).context("receiving the virtual buffer")?;
    gpu.expect_words(buffer.as_buffer(), buffer.size(), patterns.expect, "the imported virtual buffer")?;
    buffer.fill(FillPattern::U32(patterns.write), &gpu.stream)?;
    gpu.stream.synchronize()?;
    println!(
        "  [child {}] mapped the virtual buffer ({} in {} chunks) at {:#x}, checked it, wrote {:#010x}",
        std::process::id(),
        format_bytes(buffer.size() as u64),
        buffer.chunk_count(),
        buffer.ptr(),
        patterns.write
    );
    Ok("virtual buffer checked and rewritten".to_string())
}

// ---------------------------------------------------------------------------------------------
// Printing.
// ---------------------------------------------------------------------------------------------

/// Prints a pool's usage.
fn print_attributes(label: &str, pool: &MemoryPool) -> Result<(), Error> {
    let a = pool.attributes()?;
    println!(
        "    {label:<21} used {:>9} (high {:>9})   reserved {:>9} (high {:>9})",
        format_bytes(a.used_mem_current),
        format_bytes(a.used_mem_high),
        format_bytes(a.reserved_mem_current),
        format_bytes(a.reserved_mem_high)
    );
    Ok(())
}

/// An error and its causes, on one line (a cause already in the message is not repeated).
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text = format!("{text}: {message}");
        }
        source = cause.source();
    }
    text
}

fn format_devices(devices: &BTreeSet<Device>) -> String {
    let names: Vec<String> = devices.iter().map(Device::to_string).collect();
    format!("{{{}}}", names.join(", "))
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// Formats a byte count in the largest binary unit that keeps it at least 1.
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if bytes == u64::MAX {
        "unlimited".to_string()
    } else if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Formats a duration with a unit suited to its size.
fn format_duration(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 1e6 {
        format!("{:.1} ms", micros / 1e3)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Failed,
    Skipped,
}

/// One row of the table.
struct Row {
    name: &'static str,
    time: Option<Duration>,
    status: Status,
}

/// The steps, in the order they ran.
#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    /// Runs a step under a heading of its own (see [`Report::timed`]).
    fn step<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T, Error>) -> Option<T> {
        println!("\n== {name} ==");
        self.timed(name, f)
    }

    /// Runs a step, timing it and recording whether it succeeded; a failure is printed at once.
    fn timed<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T, Error>) -> Option<T> {
        let start = Instant::now();
        let result = f();
        let status = if result.is_ok() { Status::Ok } else { Status::Failed };
        self.rows.push(Row { name, time: Some(start.elapsed()), status });
        result.map_err(|e| eprintln!("  error: {}", describe(e.as_ref()))).ok()
    }

    /// Records a step that cannot run here, and why.
    fn skip(&mut self, name: &'static str, why: &str) {
        println!("\n== {name} ==\n  skipped: {why}");
        self.rows.push(Row { name, time: None, status: Status::Skipped });
    }

    fn count(&self, status: Status) -> usize {
        self.rows.iter().filter(|r| r.status == status).count()
    }

    /// Prints the table of steps.
    fn print(&self) {
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(4);
        println!("\n{:<width$}  {:>10}  result", "step", "time");
        for row in &self.rows {
            let time = row.time.map_or_else(|| "-".to_string(), format_duration);
            let status = match row.status {
                Status::Ok => "ok",
                Status::Failed => "FAILED",
                Status::Skipped => "skipped",
            };
            println!("{:<width$}  {time:>10}  {status}", row.name);
        }
    }
}
