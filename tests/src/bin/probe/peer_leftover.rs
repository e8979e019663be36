//! Question 9: nvbug 5698116, which the simulator models under `CUDA_SIM_POOL_HANDLES=recycle`:
//! a pool destroyed while a peer still has access passes that access on to the next pool created
//! on its device when that pool gets the destroyed one's handle value. `cuda-mem-core`
//! revokes peer access before destroying a pool it owns because of it. Does this driver still
//! do it? Needs two devices, the second able to reach the first.

use cuda_mem_sys::types::CUmemAccess_flags;

use crate::owned::OwnedPool;
use crate::raw::{can_access_peer, code, device_location, pool_access, pool_props, set_pool_access};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "peer-access-after-destroy",
    question: "nvbug 5698116: a pool destroyed while device 1 still has access to it; does the next pool created on \
               device 0 start with device 1's access?",
    run,
    child: None,
};

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    details.put("devices", setup.devices);
    if setup.devices < 2 {
        return Ok(format!("not applicable: it needs two devices, the driver reports {}", setup.devices));
    }
    let can_access = can_access_peer(1, 0)?;
    details.put("cuDeviceCanAccessPeer(1, 0)", can_access);
    if !can_access {
        return Ok("not applicable: device 1 cannot access device 0".to_string());
    }
    let mut first = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let granted =
        set_pool_access(first.raw(), device_location(1), CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    details.put("grant_device_1", code(&granted));
    granted?;
    let first_handle = first.raw();
    details.put("destroy_without_revoking", code(&first.destroy()));
    let next = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    // The bug concerns a recycled handle value: report whether this one is.
    let handle = if next.raw() == first_handle { "the destroyed pool's handle value" } else { "a new handle value" };
    details.put("next_pool.handle", handle);
    let inherited = pool_access(next.raw(), device_location(1));
    details.put("next_pool.device_1", &inherited);
    // Revoked, so that this probe leaves no access behind for the pools created after it.
    let revoked = set_pool_access(next.raw(), device_location(1), CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE);
    details.put("revoke_on_the_next_pool", code(&revoked));
    Ok(match inherited.as_str() {
        "NONE" => format!("the next pool ({handle}) starts without device 1's access (the bug is not seen)"),
        "READWRITE" | "READ" => {
            format!("the next pool ({handle}) starts with device 1's access ({inherited}): nvbug 5698116")
        }
        other => format!("the next pool's access could not be read ({other})"),
    })
}
