//! Case (8): allocation traces ([`crate::trace`]) replayed against each memory resource of
//! [`crate::contenders`], for the memory the resource holds against what the trace has live,
//! and the time its calls take per step.
//!
//! A replay plays a trace's events in order, each allocation a [`Buffer`] from the resource on
//! the event's stream (one stream per trace stream, made for the replay), each free the drop
//! of that buffer; at the end of every step it waits for every stream, as a serving loop that
//! reads back its sampled tokens does (the driver pool releases memory above its release
//! threshold there). Two kinds of pass, each on a fresh resource:
//! - the **memory** pass reads the resource's reserved bytes (its [`ReservedProbe`]) after
//!   every allocation and after each step's synchronization: the exact peak, and per step its
//!   most and its end;
//! - [`TIMED_PASSES`] **timed** passes read nothing between calls, and time each step's calls
//!   (from its first event to its last, not the synchronization); a step's time is its median
//!   over the passes.
//!
//! Allocated bytes are the trace's own (what it has live), not read from the resource.

use std::fmt::Write as _;
use std::time::Instant;

use cuda_mem_core::{Buffer, Device, MemoryResourceExt, Stream, StreamOptions};
use serde_json::{Value, json};

use crate::Error;
use crate::contenders::{Contender, ReservedProbe, Subject};
use crate::stats::{Stats, elapsed_ns, rounded};
use crate::trace::{Event, Trace};
use crate::units::{MIB, ns};

/// Timed passes per trace and resource.
pub(crate) const TIMED_PASSES: usize = 5;

/// One step of the memory pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StepMemory {
    /// The most reserved bytes read in the step (after its allocations and its synchronization).
    pub(crate) reserved_most: u64,
    /// Reserved bytes after the step's synchronization.
    pub(crate) reserved_end: u64,
}

/// A trace replayed against one resource.
pub(crate) struct Replay {
    /// The resource's name ([`Contender::name`]).
    pub(crate) contender: &'static str,
    /// Per step, from the memory pass.
    pub(crate) memory: Vec<StepMemory>,
    /// Per step, its calls' median time over the timed passes, ns.
    pub(crate) step_ns: Vec<f64>,
}

impl Replay {
    /// The most reserved bytes read.
    pub(crate) fn peak_reserved(&self) -> u64 {
        self.memory.iter().map(|m| m.reserved_most).max().unwrap_or(0)
    }

    /// The steps' times, ns.
    pub(crate) fn per_step(&self) -> Stats {
        Stats::of(self.step_ns.clone())
    }

    /// All steps' calls together, ns (the sum of the per-step medians).
    pub(crate) fn total_ns(&self) -> f64 {
        self.step_ns.iter().sum()
    }
}

/// One trace against every resource.
pub(crate) struct TraceRun {
    /// The trace's name.
    pub(crate) trace: &'static str,
    /// Per step, the most bytes live in it and the bytes live at its end ([`Trace::live_bytes`]).
    pub(crate) live: Vec<(usize, usize)>,
    /// Allocations and steps in the trace.
    pub(crate) allocations: usize,
    /// A replay per resource.
    pub(crate) replays: Vec<Replay>,
}

impl TraceRun {
    /// The most bytes the trace has live at once.
    pub(crate) fn peak_allocated(&self) -> usize {
        self.live.iter().map(|l| l.0).max().unwrap_or(0)
    }

    /// A replay's peak reserved against the trace's peak allocated.
    pub(crate) fn ratio(&self, replay: &Replay) -> f64 {
        replay.peak_reserved() as f64 / self.peak_allocated().max(1) as f64
    }

    /// As a JSON object (a row of `results.json`'s `traces`): the summary and every step.
    pub(crate) fn json(&self) -> Value {
        let replays: Vec<Value> = self
            .replays
            .iter()
            .map(|r| {
                json!({
                    "resource": r.contender,
                    "peak_reserved": r.peak_reserved(),
                    "peak_reserved_over_allocated": rounded(self.ratio(r), 3),
                    "per_step": r.per_step().json(),
                    "total_ns": rounded(r.total_ns(), 0),
                    "reserved_most": r.memory.iter().map(|m| m.reserved_most).collect::<Vec<_>>(),
                    "reserved_end": r.memory.iter().map(|m| m.reserved_end).collect::<Vec<_>>(),
                    "step_ns": r.step_ns.iter().map(|&t| rounded(t, 0)).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "trace": self.trace,
            "steps": self.live.len(),
            "allocations": self.allocations,
            "peak_allocated": self.peak_allocated(),
            "allocated_most": self.live.iter().map(|l| l.0).collect::<Vec<_>>(),
            "allocated_end": self.live.iter().map(|l| l.1).collect::<Vec<_>>(),
            "replays": replays,
        })
    }

    /// The series as CSV, a row per step: the trace's allocated bytes (most, end), then per
    /// resource its reserved bytes (most, end) and its calls' time in ns.
    pub(crate) fn csv(&self) -> String {
        let mut out = String::from("step,allocated_most,allocated_end");
        for r in &self.replays {
            let _ = write!(out, ",{0} reserved_most,{0} reserved_end,{0} step_ns", r.contender);
        }
        out.push('\n');
        for (step, (most, end)) in self.live.iter().enumerate() {
            let _ = write!(out, "{step},{most},{end}");
            for r in &self.replays {
                let m = r.memory.get(step).copied().unwrap_or_default();
                let t = r.step_ns.get(step).copied().unwrap_or(f64::NAN);
                let _ = write!(out, ",{},{},{t:.0}", m.reserved_most, m.reserved_end);
            }
            out.push('\n');
        }
        out
    }
}

/// Case (8): each of `traces` against each of `contenders`, printed as it comes.
pub(crate) fn replays(device: Device, traces: &[Trace], contenders: &[Contender]) -> Result<Vec<TraceRun>, Error> {
    let mut runs = Vec::new();
    for trace in traces {
        let mut run = TraceRun {
            trace: trace.name,
            live: trace.live_bytes(),
            allocations: trace.allocations(),
            replays: Vec::new(),
        };
        for contender in contenders {
            let replay = replay(device, trace, contender)?;
            println!(
                "  {} × {}: peak reserved {:.1} MiB / allocated {:.1} MiB = {:.3}, per step {}, all steps {}",
                trace.name,
                contender.name,
                replay.peak_reserved() as f64 / MIB as f64,
                run.peak_allocated() as f64 / MIB as f64,
                run.ratio(&replay),
                replay.per_step().show(),
                ns(replay.total_ns()),
            );
            run.replays.push(replay);
        }
        runs.push(run);
    }
    Ok(runs)
}

/// `trace` against `contender`: the memory pass, then the timed passes.
pub(crate) fn replay(device: Device, trace: &Trace, contender: &Contender) -> Result<Replay, Error> {
    let memory = {
        let subject = (contender.make)(device)?;
        let mut memory = Vec::with_capacity(trace.steps.len());
        play(device, trace, &subject, |_, reserved| memory.push(reserved), Some(&subject.reserved))?;
        memory
    };
    let mut passes = Vec::with_capacity(TIMED_PASSES);
    for _ in 0..TIMED_PASSES {
        let subject = (contender.make)(device)?;
        let mut times = Vec::with_capacity(trace.steps.len());
        play(device, trace, &subject, |t, _| times.push(t), None)?;
        passes.push(times);
    }
    let step_ns = (0..trace.steps.len()).map(|s| Stats::of(passes.iter().map(|p| p[s]).collect()).median).collect();
    Ok(Replay { contender: contender.name, memory, step_ns })
}

/// One pass of `trace` against `subject`: `step_done` gets each step's calls' time and, when
/// `probe` is given (read after every allocation and after each step's synchronization), its
/// memory.
fn play(
    device: Device,
    trace: &Trace,
    subject: &Subject,
    mut step_done: impl FnMut(f64, StepMemory),
    probe: Option<&ReservedProbe>,
) -> Result<(), Error> {
    let streams: Vec<Stream> = (0..trace.streams)
        .map(|_| Stream::new(device, StreamOptions::default().non_blocking()))
        .collect::<Result<_, _>>()?;
    let mut buffers: Vec<Option<Buffer>> = (0..trace.allocations()).map(|_| None).collect();
    let read = || probe.map_or(Ok(0), |p| p());
    for step in &trace.steps {
        let mut most = 0;
        let start = Instant::now();
        for event in step {
            match *event {
                Event::Alloc { id, size, stream } => {
                    let stream = streams.get(stream).ok_or("an event names a stream the trace lacks")?;
                    let slot = buffers.get_mut(id).ok_or("an event names an id the trace lacks")?;
                    *slot = Some(subject.resource.allocate(size, stream)?);
                    if probe.is_some() {
                        most = most.max(read()?);
                    }
                }
                Event::Free { id } => drop(buffers.get_mut(id).and_then(Option::take)),
            }
        }
        let took = elapsed_ns(start);
        for stream in &streams {
            stream.synchronize()?;
        }
        let end = read()?;
        step_done(took, StepMemory { reserved_most: most.max(end), reserved_end: end });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay_of(memory: &[(u64, u64)], step_ns: &[f64]) -> Replay {
        Replay {
            contender: "pool",
            memory: memory.iter().map(|&(m, e)| StepMemory { reserved_most: m, reserved_end: e }).collect(),
            step_ns: step_ns.to_vec(),
        }
    }

    #[test]
    fn the_summary_and_the_csv_follow_the_series() {
        let run = TraceRun {
            trace: "t",
            live: vec![(100, 50), (200, 0)],
            allocations: 3,
            replays: vec![replay_of(&[(128, 64), (256, 0)], &[1000.0, 3000.0])],
        };
        let r = &run.replays[0];
        assert_eq!((run.peak_allocated(), r.peak_reserved()), (200, 256));
        assert!((run.ratio(r) - 1.28).abs() < 1e-9);
        assert!((r.total_ns() - 4000.0).abs() < 1e-9);
        assert_eq!(
            run.csv(),
            "step,allocated_most,allocated_end,pool reserved_most,pool reserved_end,pool step_ns\n\
             0,100,50,128,64,1000\n1,200,0,256,0,3000\n"
        );
        let json = run.json();
        assert_eq!(json["replays"][0]["peak_reserved_over_allocated"], 1.28);
        assert_eq!(json["allocated_most"], json!([100, 200]));
    }
}
