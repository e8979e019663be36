//! Step 7, VMM: a virtual buffer grows in place, then is made to move (the addresses after it
//! reserved first with a raw `cuMemAddressReserve`), its data intact through every buffer; then
//! the child maps it and writes it.

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::{DevicePtr, FillPattern};
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions};

use crate::Error;
use crate::child::ChildProcess;
use crate::devices::Demo;
use crate::errors::Context;
use crate::narration::format_bytes;
use crate::protocol::{Patterns, Request};

/// The words written into the virtual buffer: before the in-place grow, before the moving grow,
/// through the moved buffer, and by the child.
const VMM_FIRST: u32 = 0x7777_0001;
const VMM_SECOND: u32 = 0x7777_0002;
const VMM_THIRD: u32 = 0x7777_0003;
const VMM_CHILD: u32 = 0x7777_0004;

/// A virtual buffer and the buffers grown from it.
pub(crate) struct Vmm {
    resource: Arc<VirtualMemoryResource>,
    /// The first allocation: one chunk.
    small: VirtualBuffer,
    /// `small` grown to two chunks.
    grown: VirtualBuffer,
}

/// Allocates one chunk of virtual memory, grows it to two in place, and checks the data through
/// both buffers.
pub(crate) fn vmm_grow_in_place(demo: &Demo) -> Result<Vmm, Error> {
    let gpu = &demo.gpu;
    let mut options = VirtualMemoryResourceOptions::default();
    if !demo.properties.posix_fd_handles_supported {
        options = options.handle_type(None);
    }
    let resource = VirtualMemoryResource::new(gpu.device, options)?;
    let chunk = resource.granularity();
    let mut small = resource.allocate(chunk, &gpu.stream).context("allocating virtual memory")?;
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
pub(crate) fn vmm_moving_grow(demo: &Demo, vmm: &mut Vmm) -> Result<VirtualBuffer, Error> {
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
pub(crate) fn vmm_share(demo: &Demo, child: &ChildProcess, vmm: &Vmm, moved: &mut VirtualBuffer) -> Result<(), Error> {
    let gpu = &demo.gpu;
    child.request(&Request::Vmm(Patterns { expect: VMM_THIRD, write: VMM_CHILD }))?;
    child.ipc.send_virtual_buffer(moved).context("sending the virtual buffer")?;
    println!(
        "  sent the {} virtual buffer on the pools' IpcChannel (send_virtual_buffer): {} chunks, one file \
         descriptor each",
        format_bytes(moved.size() as u64),
        moved.chunk_count()
    );
    crate::sharing::wait_for_child(child, gpu)?;
    let reply = child.reply(&gpu.stream)?;
    println!("  the child replies: {reply}");
    gpu.expect_words(moved.as_buffer(), moved.size(), VMM_CHILD, "the virtual buffer after the child wrote it")?;
    gpu.expect_words(vmm.small.as_buffer(), vmm.small.size(), VMM_CHILD, "the first buffer after the child wrote it")?;
    println!("  the child's {VMM_CHILD:#010x} reads back here through the moved buffer and the first one");
    Ok(())
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
