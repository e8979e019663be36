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

/// A reading of the memory pass: after an allocation, or after a step's synchronization.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Sample {
    /// Where in the trace: the step, plus the fraction of its events done (1 after its
    /// synchronization).
    pub(crate) at: f64,
    /// Bytes the trace had live.
    pub(crate) allocated: u64,
    /// Bytes the resource held.
    pub(crate) reserved: u64,
}

/// A trace replayed against one resource.
pub(crate) struct Replay {
    /// The resource's name ([`Contender::name`]).
    pub(crate) contender: &'static str,
    /// Per step, from the memory pass.
    pub(crate) memory: Vec<StepMemory>,
    /// Every reading of the memory pass, in order.
    pub(crate) samples: Vec<Sample>,
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

impl TraceRun {
    /// Every reading of the memory passes as CSV, a row per reading: where in the trace, the
    /// trace's allocated bytes, then each resource's reserved bytes (every pass reads at the
    /// same points of the trace).
    pub(crate) fn samples_csv(&self) -> String {
        let mut out = String::from("at_step,allocated");
        for r in &self.replays {
            let _ = write!(out, ",{} reserved", r.contender);
        }
        out.push('\n');
        let first = self.replays.first().map_or(&[][..], |r| &r.samples[..]);
        for (i, sample) in first.iter().enumerate() {
            let _ = write!(out, "{:.4},{}", sample.at, sample.allocated);
            for r in &self.replays {
                let _ = write!(out, ",{}", r.samples.get(i).map_or(0, |s| s.reserved));
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
    let (memory, samples) = {
        let subject = (contender.make)(device)?;
        let mut memory = Vec::with_capacity(trace.steps.len());
        let mut samples = Vec::new();
        play(device, trace, &subject, |_, reserved| memory.push(reserved), Some((&subject.reserved, &mut samples)))?;
        (memory, samples)
    };
    let mut passes = Vec::with_capacity(TIMED_PASSES);
    for _ in 0..TIMED_PASSES {
        let subject = (contender.make)(device)?;
        let mut times = Vec::with_capacity(trace.steps.len());
        play(device, trace, &subject, |t, _| times.push(t), None)?;
        passes.push(times);
    }
    let step_ns = (0..trace.steps.len()).map(|s| Stats::of(passes.iter().map(|p| p[s]).collect()).median).collect();
    Ok(Replay { contender: contender.name, memory, samples, step_ns })
}

/// One pass of `trace` against `subject`: `step_done` gets each step's calls' time and, when
/// `probe` is given (read after every allocation and after each step's synchronization, each
/// reading also pushed to its samples), its memory.
fn play(
    device: Device,
    trace: &Trace,
    subject: &Subject,
    mut step_done: impl FnMut(f64, StepMemory),
    mut probe: Option<(&ReservedProbe, &mut Vec<Sample>)>,
) -> Result<(), Error> {
    let streams: Vec<Stream> = (0..trace.streams)
        .map(|_| Stream::new(device, StreamOptions::default().non_blocking()))
        .collect::<Result<_, _>>()?;
    let mut buffers: Vec<Option<Buffer>> = (0..trace.allocations()).map(|_| None).collect();
    let mut live = 0u64;
    for (index, step) in trace.steps.iter().enumerate() {
        let mut most = 0;
        let start = Instant::now();
        for (k, event) in step.iter().enumerate() {
            match *event {
                Event::Alloc { id, size, stream } => {
                    let stream = streams.get(stream).ok_or("an event names a stream the trace lacks")?;
                    let slot = buffers.get_mut(id).ok_or("an event names an id the trace lacks")?;
                    *slot = Some(subject.resource.allocate(size, stream)?);
                    live += size as u64;
                    if let Some((read, samples)) = &mut probe {
                        let reserved = read()?;
                        most = most.max(reserved);
                        let at = index as f64 + (k + 1) as f64 / (step.len() + 1) as f64;
                        samples.push(Sample { at, allocated: live, reserved });
                    }
                }
                Event::Free { id } => {
                    let buffer = buffers.get_mut(id).and_then(Option::take);
                    live -= buffer.as_ref().map_or(0, |b| b.size() as u64);
                }
            }
        }
        let took = elapsed_ns(start);
        for stream in &streams {
            stream.synchronize()?;
        }
        let mut end = 0;
        if let Some((read, samples)) = &mut probe {
            end = read()?;
            samples.push(Sample { at: (index + 1) as f64, allocated: live, reserved: end });
        }
        step_done(took, StepMemory { reserved_most: most.max(end), reserved_end: end });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contenders::driver_pool;
    use crate::trace::{ServingParams, TrainingParams, serving, training};

    fn replay_of(memory: &[(u64, u64)], step_ns: &[f64]) -> Replay {
        Replay {
            contender: "pool",
            memory: memory.iter().map(|&(m, e)| StepMemory { reserved_most: m, reserved_end: e }).collect(),
            samples: Vec::new(),
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

    /// Short traces against the driver pools on the simulator: the reserved bytes read cover
    /// what the trace has live in every step (the reads see the peaks), a pool that keeps its
    /// memory ends holding its peak, one with release threshold 0 holds nothing after the last
    /// synchronization, and every step is timed.
    #[test]
    fn a_replay_on_the_simulator_sees_the_pools_hold_at_least_what_is_live() {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).expect("device 0");
        device.set_current().expect("device 0 current");
        let traces = [
            serving(&ServingParams { steps: 30, drain_steps: 10, ..ServingParams::BENCH }, 3),
            training(&TrainingParams { steps: 3, layers: 2, ..TrainingParams::BENCH }, 3),
        ];
        let pools = [
            Contender { name: "released", make: |device| driver_pool(device, 0) },
            Contender { name: "kept", make: |device| driver_pool(device, u64::MAX) },
        ];
        let runs = replays(device, &traces, &pools).expect("the replays run");
        for run in &runs {
            let [released, kept] = &run.replays[..] else { panic!("two pools") };
            for r in [released, kept] {
                assert_eq!(r.memory.len(), run.live.len());
                assert!(r.step_ns.iter().all(|&t| t >= 0.0) && r.total_ns() > 0.0, "{}", run.trace);
                for (m, l) in r.memory.iter().zip(&run.live) {
                    assert!(m.reserved_most >= l.0 as u64, "{} {}: {m:?} < {l:?}", run.trace, r.contender);
                }
                // A reading after every allocation and every step; each sees the trace's bytes.
                assert_eq!(r.samples.len(), run.allocations + run.live.len(), "{}", run.trace);
                assert!(r.samples.iter().all(|s| s.reserved >= s.allocated), "{} {}", run.trace, r.contender);
                assert_eq!(r.samples.iter().map(|s| s.allocated).max(), Some(run.peak_allocated() as u64));
            }
            assert!(run.ratio(kept) >= 1.0 && run.ratio(released) >= 1.0, "{}", run.trace);
            assert_eq!(released.memory.last().map(|m| m.reserved_end), Some(0), "{}", run.trace);
            assert_eq!(kept.memory.last().map(|m| m.reserved_end), Some(kept.peak_reserved()), "{}", run.trace);
        }
    }
}
