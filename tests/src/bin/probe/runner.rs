//! Running the questions: the driver and device 0's context, each probe on its own (an error
//! or a panic is its answer, and what it failed to release is noted), the report, and on a real
//! driver the same questions asked of the simulator, whose answers the report shows beside.

use std::ffi::c_int;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use cuda_mem_integration::child_process::{KillOnDrop, read_in_background};
use cuda_mem_integration::errors::describe;
use cuda_mem_sys::DRIVER_ENV;

use crate::driver::{self, DriverInfo, SIM_DEVICES_ENV};
use crate::owned::{PrimaryContext, take_cleanup_notes};
use crate::report::{Details, Record, Report, parse_answers};
use crate::{Error, QUESTIONS, Question, USAGE};

/// The argument that makes this run the simulator's side of a comparison: its report goes to
/// `probe-simulator.json`, and it compares with nothing.
pub(crate) const SIMULATOR_SIDE_ARG: &str = "--simulator-side";

/// The variable naming the report's folder.
const OUT_ENV: &str = "PROBE_OUT";

/// The variable that turns the comparison with the simulator on (`1`) or off (`0`); by
/// default it runs on a real driver only.
const COMPARE_ENV: &str = "PROBE_COMPARE";

/// How long the simulator may take over the whole set of questions.
const SIMULATOR_TIMEOUT: Duration = Duration::from_secs(300);

/// What every probe is given.
pub(crate) struct Setup<'a> {
    /// Device 0's primary context, current on the main thread.
    pub(crate) context: &'a PrimaryContext,
    /// How many devices the driver reports.
    pub(crate) devices: c_int,
}

/// Runs the questions named (all when none is), writes the report and says whether every probe
/// answered.
pub(crate) fn main(names: &[&str], simulator_side: bool) -> ExitCode {
    match run(names, simulator_side) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(names: &[&str], simulator_side: bool) -> Result<bool, Error> {
    let questions = select(names)?;
    driver::default_simulated_devices();
    let chosen = driver::choose()?;
    let context = PrimaryContext::open().map_err(|e| format!("opening device 0: {e}"))?;
    let info = DriverInfo::read(&chosen);
    info.print();
    let setup = Setup { context: &context, devices: info.devices.len() as c_int };
    println!();
    let mut records = Vec::new();
    for question in questions {
        let record = ask(question, &setup);
        record.print();
        records.push(record);
    }
    let compare = match std::env::var(COMPARE_ENV).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !chosen.simulator,
    };
    let compared_with =
        if compare && !simulator_side { compare_with_simulator(&mut records, info.devices.len(), names) } else { None };
    let answered = records.iter().filter(|r| r.answered).count();
    let all = records.len();
    let file = if simulator_side { "probe-simulator.json" } else { "probe.json" };
    let path = cuda_mem_integration::output::output_dir(OUT_ENV, "probe").join(file);
    Report { driver: info, compared_with, records }.write(&path)?;
    println!("\n{answered} of {all} questions answered; report: {}", path.display());
    Ok(answered == all)
}

/// The questions `names` names, in the order of [`QUESTIONS`]; all when `names` is empty.
fn select(names: &[&str]) -> Result<Vec<&'static Question>, Error> {
    if let Some(unknown) = names.iter().find(|n| !QUESTIONS.iter().any(|q| q.name == **n)) {
        let known: Vec<&str> = QUESTIONS.iter().map(|q| q.name).collect();
        return Err(format!("no question named {unknown:?} (there are: {})\n{USAGE}", known.join(", ")).into());
    }
    Ok(QUESTIONS.iter().filter(|q| names.is_empty() || names.contains(&q.name)).collect())
}

/// Asks one question: its answer, or the error or panic that stopped it, with what it observed
/// and what it failed to release.
fn ask(question: &'static Question, setup: &Setup<'_>) -> Record {
    let start = Instant::now();
    let mut details = Details::default();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| (question.run)(setup, &mut details)));
    let (answer, answered) = match outcome {
        Ok(Ok(answer)) => (answer, true),
        Ok(Err(e)) => (format!("error: {}", describe(e.as_ref())), false),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(ToString::to_string)
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            (format!("error: the probe panicked: {message}"), false)
        }
    };
    let notes = take_cleanup_notes();
    if !notes.is_empty() {
        details.put("release_failures", notes.join("; "));
    }
    Record {
        name: question.name,
        question: question.question,
        answer: answer.replace(['\n', '\r'], " "),
        answered,
        seconds: start.elapsed().as_secs_f64(),
        details,
        simulator_answer: None,
    }
}

/// Asks the simulator the same questions (this program again, `--simulator-side`, on
/// `libcuda_sim.so` with `devices` simulated devices and every one visible), puts its answers beside these and prints
/// where they differ. Returns the simulator library and its report's file name.
fn compare_with_simulator(records: &mut [Record], devices: usize, names: &[&str]) -> Option<(String, String)> {
    println!("\n== the same questions on the simulator");
    let Some(library) = cuda_mem_integration::driver_choice::simulator_path() else {
        println!("no simulator library (libcuda_sim.so beside this program, or CUDA_SIM_LIB): no comparison");
        return None;
    };
    let output = match simulator_output(&library, devices, names) {
        Ok(output) => output,
        Err(e) => {
            println!("the simulator's run failed: {e}");
            return None;
        }
    };
    let answers = parse_answers(&output);
    println!("{} ({devices} simulated device(s)):", library.display());
    for record in records.iter_mut() {
        record.simulator_answer = answers.iter().find(|(name, _)| name == record.name).map(|(_, a)| a.clone());
        match &record.simulator_answer {
            Some(simulator) if *simulator == record.answer => println!("  agrees   {}", record.name),
            Some(simulator) => {
                println!("  DIFFERS  {}", record.name);
                println!("           here:      {}", record.answer);
                println!("           simulator: {simulator}");
            }
            None => println!("  (no simulator answer) {}", record.name),
        }
    }
    Some((library.display().to_string(), "probe-simulator.json".to_string()))
}

/// The standard output of this program run on the simulator.
fn simulator_output(library: &PathBuf, devices: usize, names: &[&str]) -> Result<String, Error> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg(SIMULATOR_SIDE_ARG)
        .args(names)
        .env(DRIVER_ENV, library)
        .env(SIM_DEVICES_ENV, devices.clamp(1, 64).to_string())
        // The GPU machine's device list (a scheduler's UUIDs, say) would hide simulated devices.
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut process = KillOnDrop::new(command.spawn()?);
    let reader = process.child().stdout.take().map(read_in_background);
    let status = process.wait(SIMULATOR_TIMEOUT)?;
    let output = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    if parse_answers(&output).is_empty() {
        return Err(format!("it gave no answers ({status})").into());
    }
    Ok(output)
}
