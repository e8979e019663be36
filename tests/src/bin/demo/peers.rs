//! Step 4, peer access: device 1 becomes a peer of a pool on device 0, copies into it on its
//! own stream (refused before, on the simulator), and loses its access again.

use cuda_mem_core::{Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, Stream, StreamOptions};

use crate::Error;
use crate::devices::Demo;
use crate::errors::Context;
use crate::narration::{format_bytes, format_devices};

/// Bytes of the peer-access step's buffers; what device 0 writes, then what device 1 copies in.
const PEER_BYTES: usize = 8 << 20;
const PEER_OWNER_WORD: u32 = 0x0000_0D00;
const PEER_WORD: u32 = 0x0000_0D01;

/// Makes `peer` a peer of a pool on device 0, copies into the pool's memory on the peer's
/// stream, checks, and revokes the access.
pub(crate) fn peer_access(demo: &Demo, peer: Device) -> Result<(), Error> {
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
