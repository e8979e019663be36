//! The full run (`bench` with no arguments: every case in turn, then the outputs) and
//! `bench --pool-pairs` (case 1 alone, for `cargo xtask bench --compare`).

use std::time::Instant;

use cuda_mem_core::Device;
use cuda_mem_core::sys::{DRIVER_ENV, Driver};
use cuda_mem_integration::driver_choice::{self, Choice, How};

use crate::Error;
use crate::adaptors::{adaptors, copies};
use crate::contenders::contenders;
use crate::elastic::elastic;
use crate::first_call::first_call;
use crate::handoff::handoff;
use crate::pacing::pacing;
use crate::pools::{POOL_THREADS, PoolRow, pools};
use crate::replay::replays;
use crate::report::{self, Results};
use crate::resource_pairs::resource_pairs;
use crate::scaling::scaling;
use crate::sharing::sharing;
use crate::snapshots::{recording, snapshots};
use crate::trace::{BENCH_SEED, bench_traces};
use crate::vmm::{first_grows, vmm};

/// `--pool-pairs`: case (1) on one thread, on the driver the full run would choose; its last
/// line is `{"pools":[…]}`, rows as in `results.json`.
pub(crate) fn pool_pairs_main() -> Result<(), Error> {
    install(choose()?.driver)?;
    let rows = pools(Device::new(0)?, &[1])?;
    let rows: Vec<serde_json::Value> = rows.iter().map(PoolRow::json).collect();
    println!("{}", serde_json::json!({ "pools": rows }));
    Ok(())
}

/// `--sharing`: case (2) alone (and the registry rates of (4), which share its child), printed
/// only, on the driver the full run would choose.
pub(crate) fn sharing_main() -> Result<(), Error> {
    let choice = choose()?;
    let path = choice.driver.path().to_path_buf();
    println!("driver: {}{}", path.display(), if choice.is_simulator() { " (the simulator)" } else { "" });
    install(choice.driver)?;
    sharing(Device::new(0)?, &path)?;
    Ok(())
}

/// `--vmm`: case (3)'s growth series alone, printed, on the driver the full run would choose.
pub(crate) fn vmm_main() -> Result<(), Error> {
    let choice = choose()?;
    let simulator = choice.is_simulator();
    install(choice.driver)?;
    vmm(Device::new(0)?, simulator)?;
    Ok(())
}

/// `--scaling`: case (1b)'s curve alone, printed, on the driver the full run would choose.
pub(crate) fn scaling_main() -> Result<(), Error> {
    install(choose()?.driver)?;
    scaling(Device::new(0)?)?;
    Ok(())
}

/// `--resource-pairs`: case (1c) alone, printed, on the driver the full run would choose.
pub(crate) fn resource_pairs_main() -> Result<(), Error> {
    install(choose()?.driver)?;
    let rows = resource_pairs(Device::new(0)?, &contenders())?;
    println!("{}", report::markdown_of(&rows, &[]));
    Ok(())
}

/// `--traces`: case (8) alone, printed, on the driver the full run would choose; its plots and
/// CSV are written to the output folder.
pub(crate) fn traces_main() -> Result<(), Error> {
    install(choose()?.driver)?;
    let runs = replays(Device::new(0)?, &bench_traces(BENCH_SEED), &contenders())?;
    let out = report::output_dir()?;
    let written = report::write_traces(&out, &runs)?;
    println!("{}", report::markdown_of(&[], &runs));
    println!("wrote {}/{{{}}}", out.display(), written.join(", "));
    Ok(())
}

/// `--elastic`: case (10) alone, printed, on the driver the full run would choose.
pub(crate) fn elastic_main() -> Result<(), Error> {
    let choice = choose()?;
    let simulator = choice.is_simulator();
    install(choice.driver)?;
    elastic(Device::new(0)?, simulator)?;
    Ok(())
}

/// `--handoff`: case (11) alone, printed, on the driver the full run would choose.
pub(crate) fn handoff_main() -> Result<(), Error> {
    let choice = choose()?;
    let path = choice.driver.path().to_path_buf();
    println!("driver: {}{}", path.display(), if choice.is_simulator() { " (the simulator)" } else { "" });
    install(choice.driver)?;
    handoff(Device::new(0)?, &path)?;
    Ok(())
}

/// Every case, in turn, then the outputs.
pub(crate) fn parent_main() -> Result<(), Error> {
    let total = Instant::now();
    let choice = choose()?;
    let simulator = choice.is_simulator();
    let version = choice.driver.version()?;
    let version = format!("CUDA {}.{} ({version})", version / 1000, (version % 1000) / 10);
    let path = choice.driver.path().to_path_buf();
    let driver = match (&choice.how, simulator) {
        (_, true) => format!("cuda-sim simulator at {} (reports {version}), not a GPU", path.display()),
        (How::Real { devices }, false) => {
            format!("real CUDA driver {} ({devices} device(s)), {version}", path.display())
        }
        (_, false) => format!("driver {} named by {DRIVER_ENV}, {version}", path.display()),
    };
    println!("driver: {driver}");
    if let How::NoGpu { why_not_real } = &choice.how {
        println!("  (no GPU: {why_not_real})");
    }
    install(choice.driver)?;
    let mut results = Results { driver, simulator, ..Results::default() };

    let device = Device::new(0)?;
    println!("device 0: {}", device.name()?);

    let step = Instant::now();
    results.first_call = Some(first_call(&path)?);
    println!("[5] first driver call: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.pools = pools(device, &[1, POOL_THREADS])?;
    results.pacing = Some(pacing(device)?);
    results.scaling = scaling(device)?;
    results.resource_pairs = resource_pairs(device, &contenders())?;
    println!("[1] pools, scaling and resources: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    let sharing = sharing(device, &path)?;
    results.sharing = sharing.rows;
    results.resend = sharing.resend;
    results.lookups = sharing.rates;
    println!("[2, 4] sharing, registry and import cache: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.vmm = vmm(device, simulator)?;
    results.first_grows = first_grows(device)?;
    println!("[3] VMM growth: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.adaptors = adaptors(device)?;
    results.copies = copies(device)?;
    println!("[6, 7] adaptors and slice copies: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.traces = replays(device, &bench_traces(BENCH_SEED), &contenders())?;
    println!("[8] allocation traces: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.recording = Some(recording(device)?);
    results.snapshots = snapshots(device)?;
    println!("[9] memory history and snapshots: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    let (elastic, on_demand) = elastic(device, simulator)?;
    results.elastic = elastic;
    results.on_demand = Some(on_demand);
    println!("[10] elastic memory: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.handoff = Some(handoff(device, &path)?);
    println!("[11] hand-off to workers: done in {:.1} s", step.elapsed().as_secs_f64());

    report::write_all(&results, total)
}

/// The driver, chosen as the demo chooses it.
fn choose() -> Result<Choice, Error> {
    driver_choice::choose("bench", "`cargo xtask bench` (it builds cuda-sim first)")
}

/// Installs `driver` as the process-wide one.
fn install(driver: Driver) -> Result<(), Error> {
    cuda_mem_core::sys::install_driver(driver).map_err(|_| "a process-wide driver was already installed")?;
    Ok(())
}
