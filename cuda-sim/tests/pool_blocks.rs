//! Device pool allocations whose bytes are carved from larger host mappings: live allocations
//! never share bytes or addresses, copies are still checked against each allocation's end, and
//! the host still cannot read device pool memory.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::{NULL_STREAM, code, driver, dtoh, htod, use_device};
use cuda_mem_sys::types::{CUdeviceptr, CUresult};
use proptest::prelude::*;

const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
/// Set in the child that reads device pool memory from the host.
const READER_ENV: &str = "CUDA_SIM_POOL_BLOCKS_READER";
/// `SIGSEGV` (Linux).
const SIGSEGV: i32 = 11;

fn alloc_async(len: usize) -> CUdeviceptr {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    let result = unsafe { code!(driver(), cuMemAllocAsync(&mut ptr, len, NULL_STREAM)) };
    assert_eq!(result, CUresult::CUDA_SUCCESS, "allocating {len} bytes");
    ptr
}

fn free_async(ptr: CUdeviceptr) {
    // SAFETY: no host pointers are dereferenced.
    assert_eq!(unsafe { code!(driver(), cuMemFreeAsync(ptr, NULL_STREAM)) }, CUresult::CUDA_SUCCESS);
}

/// Copies `len` bytes from device memory at `src` into a host vector; gives back the code.
fn copy_out(src: CUdeviceptr, len: usize) -> CUresult {
    let mut bytes = vec![0u8; len];
    // SAFETY: `bytes` is valid for `len` bytes during the (synchronous) call.
    unsafe { code!(driver(), cuMemcpyDtoH_v2(bytes.as_mut_ptr().cast(), src, len)) }
}

/// Fills `len` bytes at `ptr` with `value`.
fn fill(ptr: CUdeviceptr, value: u8, len: usize) {
    // SAFETY: no host pointers are dereferenced.
    assert_eq!(unsafe { code!(driver(), cuMemsetD8_v2(ptr, value, len)) }, CUresult::CUDA_SUCCESS);
}

/// Whether the `len` bytes at `ptr` all still hold `value`: one byte of each page and the last
/// (blocks are whole pages, so bytes shared with another allocation would show in every page).
fn holds(ptr: CUdeviceptr, value: u8, len: usize) -> bool {
    let bytes = dtoh(ptr, len);
    bytes.iter().step_by(4096).chain(bytes.last()).all(|&b| b == value)
}

/// Sizes across the block classes, their edges, and past the largest (a mapping of its own).
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=256, 4095usize..=4097, 8000usize..=70_000, Just(1 << 20), Just((1 << 20) + 1), Just(3 << 20)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random allocations and frees: live allocations' address ranges never overlap, each keeps
    /// its own bytes whatever the others write, and a copy one byte past any allocation's end is
    /// refused.
    #[test]
    fn live_pool_allocations_never_share_addresses_or_bytes(
        ops in proptest::collection::vec((size(), any::<bool>(), any::<prop::sample::Index>()), 1..40)
    ) {
        use_device(0);
        let mut live: Vec<(CUdeviceptr, usize, u8)> = Vec::new();
        for (n, (len, free_one, which)) in (1u8..).zip(ops) {
            if free_one && !live.is_empty() {
                let (ptr, _, _) = live.swap_remove(which.index(live.len()));
                free_async(ptr);
            }
            let ptr = alloc_async(len);
            fill(ptr, n, len);
            prop_assert_eq!(copy_out(ptr, len + 1), INVALID, "a copy past the end is refused");
            prop_assert_eq!(copy_out(ptr + 1, len), INVALID, "a copy that ends past the end is refused");
            live.push((ptr, len, n));
            let mut ranges: Vec<(u64, u64)> = live.iter().map(|&(p, l, _)| (p, p + l as u64)).collect();
            ranges.sort_unstable();
            prop_assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping addresses: {:x?}", ranges);
            for &(p, l, k) in &live {
                prop_assert!(holds(p, k, l), "allocation {} of {} bytes kept its bytes", k, l);
            }
        }
        for (ptr, _, _) in live {
            free_async(ptr);
        }
    }
}

/// In the child: reads the first byte of a device pool allocation of the size `READER_ENV`
/// names, from the host, which must fault.
#[test]
fn host_reads_of_device_pool_memory_fault() {
    if let Ok(len) = std::env::var(READER_ENV) {
        use_device(0);
        let len: usize = len.parse().expect("a size");
        // A freed neighbour first, so that the block read is not the first of its chunk.
        let before = alloc_async(len);
        free_async(before);
        let ptr = alloc_async(len);
        htod(ptr, &vec![1; len]);
        // SAFETY: none: this read must fault, killing this child process, as on a GPU.
        let byte = unsafe { std::ptr::read_volatile(ptr as usize as *const u8) };
        println!("read {byte} from device pool memory");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let library = cuda_sim::testing::library_path().expect("libcuda_sim.so is built beside the test binary");
    for len in [256, 64 << 10, 1 << 20, 4 << 20] {
        let output = Command::new(&exe)
            .args(["--exact", "host_reads_of_device_pool_memory_fault", "--nocapture", "--test-threads=1"])
            .env(READER_ENV, len.to_string())
            .env(cuda_sim::testing::LIBRARY_ENV, &library)
            .stdin(Stdio::null())
            .output()
            .expect("the test binary re-spawns");
        assert_eq!(
            output.status.signal(),
            Some(SIGSEGV),
            "{len} bytes: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
