//! Example 5: hand a pool buffer to other libraries: as a DLPack tensor (what PyTorch, CuPy,
//! JAX and cuda.core take) and to cudarc, whose copies and kernels work on it in place.
//!
//! ```sh
//! cargo run -p cuda-mem-core --features dlpack,cudarc --example 05_dlpack_and_cudarc                 # on the simulator
//! CUDA_MEM_DRIVER=libcuda.so.1 cargo run -p cuda-mem-core --features dlpack,cudarc --example 05_dlpack_and_cudarc
//! ```
//!
//! cudarc loads the driver by name (`libcuda.so`). On the simulator the example starts itself
//! again with the simulator findable under that name, so that both crates share one driver.

use std::error::Error;
use std::process::Command;

use cuda_mem_core::cudarc::driver::CudaContext;
use cuda_mem_core::{Buffer, ConsumerStream, DeviceMemoryResource, DlpackImport, ExportOptions, Stream};

/// Set in the environment of the example started again.
const RESTARTED: &str = "CUDA_MEM_EXAMPLE_RESTARTED";

fn main() -> Result<(), Box<dyn Error>> {
    // The library CUDA_MEM_DRIVER names, or the simulator beside this example.
    cuda_sim::testing::driver()?;
    if cuda_sim::testing::on_simulator() && std::env::var_os(RESTARTED).is_none() {
        let links = cuda_sim::testing::libcuda_dir()?;
        let path = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
        let path = std::env::join_paths(std::iter::once(links).chain(std::env::split_paths(&path)))?;
        let status =
            Command::new(std::env::current_exe()?).env(RESTARTED, "1").env("LD_LIBRARY_PATH", path).status()?;
        return if status.success() { Ok(()) } else { Err(format!("the example exited with {status}").into()) };
    }

    // cudarc's stream, used as ours: both crates enqueue on the same stream.
    let context = CudaContext::new(0)?;
    let theirs = context.new_stream()?;
    let ours = Stream::from_cudarc(&theirs)?;
    let pool = DeviceMemoryResource::new(ours.device(), Default::default())?;
    let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let mut buffer = pool.allocate(data.len() * size_of::<f32>(), &ours)?;
    buffer.copy_from_slice(&data, &ours)?;

    // cudarc zeroes the first quarter in place and reads the buffer back.
    theirs.memset_zeros(&mut buffer.view_mut::<f32>()?.slice_mut(..256)?.on_cudarc(&theirs)?)?;
    let back: Vec<f32> = theirs.clone_dtoh(&buffer.cudarc_view::<f32>(&theirs)?)?;
    println!("cudarc zeroed 256 floats in place: element 255 is {}, element 256 is {}", back[255], back[256]);

    // Out as a 32x32 DLPack tensor that owns the buffer (and keeps the pool alive).
    let options = ExportOptions::default().shape(&[32, 32]).consumer_stream(ConsumerStream::Stream(&ours));
    let tensor = buffer.into_dlpack::<f32>(&options)?;
    println!("exported: {tensor:?}");

    // In again, as a consumer would take it (from C or Python, `tensor.into_raw()` travels).
    // SAFETY: the tensor's memory stays valid until its deleter runs (it owns the buffer), and
    // nothing else writes it.
    let import = unsafe { DlpackImport::from_dlpack(tensor)? };
    let rows = import.view::<f32>()?.to_vec(&ours)?;
    assert_eq!(rows[256..], data[256..]);
    println!("imported {:?} float32: {} elements, the last {}", import.shape(), rows.len(), rows[1023]);
    drop(import); // the deleter: the buffer is freed after the consumer's work

    // A cudarc allocation as a buffer of ours: cudarc frees it when the buffer goes.
    let slice = theirs.clone_htod(&data)?;
    let adopted = Buffer::from_cudarc(slice)?;
    assert_eq!(adopted.to_vec::<f32>(&ours)?, data);
    println!("a cudarc allocation of {} bytes read through cuda-mem", adopted.size());
    Ok(())
}
