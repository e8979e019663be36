//! The parent's story: the steps in order, each run under its heading and timed, skipped with
//! the reason when what it needs is missing; the final check that everything was released;
//! and the exit status.

use std::process::ExitCode;

use cuda_mem_core::history::HistoryOptions;

use crate::Error;
use crate::child::{finish_child, spawn_child};
use crate::devices::open_devices;
use crate::driver::{choose_driver, default_simulated_devices};
use crate::errors::describe;
use crate::peers::peer_access;
use crate::pool::device_pool;
use crate::report::{Report, Status};
use crate::sharing::share_pool;
use crate::vmm::{vmm_grow_in_place, vmm_moving_grow, vmm_share};

/// Runs every step, prints the table, and turns the outcome into the exit status.
pub(crate) fn parent_main() -> ExitCode {
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
    // Everything from here on is recorded, for the snapshot at the end.
    cuda_mem_core::history::start_recording(HistoryOptions::default().backtraces(true));
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
    report.step("memory snapshot", write_snapshot);
    let simulator = demo.simulator;
    drop((moved, vmm, demo));
    report.step("everything released", || check_released(simulator));
}

/// Takes a snapshot of every resource the demo holds and of what it recorded, and writes it as
/// JSON, as the viewer's page and as the timeline's SVG, in `DEMO_OUT` (else the system's
/// temporary folder, under `cuda-mem-demo`).
fn write_snapshot() -> Result<(), Error> {
    cuda_mem_core::history::stop_recording();
    let snapshot = cuda_mem_core::snapshot::take_snapshot();
    let folder = std::env::var_os("DEMO_OUT")
        .map_or_else(|| std::env::temp_dir().join("cuda-mem-demo"), std::path::PathBuf::from);
    std::fs::create_dir_all(&folder)?;
    snapshot.write_json(folder.join("memory_snapshot.json"))?;
    snapshot.write_html(folder.join("memory_snapshot.html"))?;
    std::fs::write(folder.join("memory_timeline.svg"), snapshot.timeline_svg())?;
    let allocations = snapshot.events.iter().filter(|event| event.kind == "allocate").count();
    println!(
        "  {} resource(s) alive, {} event(s) recorded ({allocations} allocations)",
        snapshot.resources.len(),
        snapshot.events.len()
    );
    println!("  open {} in a browser to see them", folder.join("memory_snapshot.html").display());
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
