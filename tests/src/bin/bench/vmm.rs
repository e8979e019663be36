//! Case (3): VMM growth from 2 MiB to 1 GiB in 2 MiB steps, in place, forced to move (the
//! addresses after the buffer reserved first) and with the device's memory reserved ahead
//! (`ReserveAhead::DeviceMemory`: growth inside the reservation, no address hint), timed per
//! step, with the driver calls of some steps counted on the simulator; and one growth of a fresh
//! buffer, repeated.

use std::time::Instant;

use cuda_mem_core::sys::{Driver, cu_call};
use cuda_mem_core::{Device, DevicePtr, Stream, StreamOptions};
use cuda_mem_vmm::{ReserveAhead, VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions};

use crate::Error;
use crate::call_count::{Calls, arm, probe};
use crate::stats::{Stats, elapsed_ns};
use crate::units::{MIB, ns};

/// Bytes per growth step (and of the first allocation).
const VMM_STEP: usize = 2 * MIB;
/// The size growth stops at.
const VMM_LIMIT: usize = 1 << 30;

/// How a growth series grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Growth {
    /// In place when the driver grants the addresses after the buffer.
    InPlace,
    /// Forced to move: the addresses after the buffer reserved first.
    Moving,
    /// Inside a reservation of the device's memory, made with the first allocation.
    ReserveAhead,
}

impl Growth {
    /// The modes, in the order they run.
    const ALL: [Growth; 3] = [Growth::InPlace, Growth::Moving, Growth::ReserveAhead];

    /// Whether each step is meant to move.
    fn moves(self) -> bool {
        self == Growth::Moving
    }
}

/// One mode's growth from one step to the limit.
pub(crate) struct VmmMode {
    /// How it grows.
    pub(crate) growth: Growth,
    /// Per step: the size after it and its time.
    pub(crate) steps: Steps,
    /// Steps whose pointer did not behave as the mode wants (moved in place or with reserve-ahead,
    /// stayed put in moving mode).
    pub(crate) unexpected: usize,
    /// Counted steps: chunks before the step, calls per function (simulator only).
    pub(crate) calls: Counts,
}

impl VmmMode {
    /// The mode, in words.
    pub(crate) fn name(&self) -> &'static str {
        match self.growth {
            Growth::ReserveAhead => "with reserve-ahead",
            growth => mode_name(growth.moves()),
        }
    }

    /// The statistics of the steps in `range`.
    pub(crate) fn stats(&self, range: std::ops::Range<usize>) -> Stats {
        Stats::of(self.steps[range].iter().map(|&(_, t)| t).collect())
    }

    /// How many steps make the first (or last) tenth: at least one.
    pub(crate) fn tenth(&self) -> usize {
        (self.steps.len() / 10).max(1)
    }
}

/// A growth mode, in words: in place, or forced to move.
pub(crate) fn mode_name(moving: bool) -> &'static str {
    if moving { "forced to move" } else { "in place" }
}

/// Every mode, timed, then (on the simulator) counted; each printed.
pub(crate) fn vmm(device: Device, simulator: bool) -> Result<Vec<VmmMode>, Error> {
    let mut modes = Vec::new();
    for growth in Growth::ALL {
        let (steps, unexpected, _) = grow_all(device, growth, false)?;
        modes.push(VmmMode { growth, steps, unexpected, calls: Vec::new() });
    }
    // Counting arms the simulator's fault injection, which makes every later call slower: last.
    if simulator {
        for mode in &mut modes {
            mode.calls = grow_all(device, mode.growth, true)?.2;
        }
    }
    for mode in &modes {
        let tenth = mode.tenth();
        let n = mode.steps.len();
        println!(
            "  {}: {} steps, {} per step, first 10% {}, last 10% {}, {} not in their mode{}",
            mode.name(),
            n,
            mode.stats(0..n).show(),
            ns(mode.stats(0..tenth).median),
            ns(mode.stats(n - tenth..n).median),
            mode.unexpected,
            calls_summary(mode)
        );
    }
    Ok(modes)
}

/// The calls of each counted step, for the printed line (empty when none was counted).
fn calls_summary(mode: &VmmMode) -> String {
    let totals: Vec<String> = mode
        .calls
        .iter()
        .map(|(chunks, calls)| format!("{chunks}:{}", calls.iter().map(|c| c.1).sum::<u32>()))
        .collect();
    if totals.is_empty() {
        String::new()
    } else {
        format!("; calls per step by chunks before it: {}", totals.join(" "))
    }
}

/// Whether step `index` (0-based) is one the counting pass counts.
fn counted_step(index: usize, last: usize) -> bool {
    index == last || (index + 1).is_power_of_two()
}

/// Per counted step: the chunks before it and its calls per function.
pub(crate) type Counts = Vec<(usize, Calls)>;

/// Per step: the size after it and its time.
pub(crate) type Steps = Vec<(usize, f64)>;

/// Grows from one step to the limit; per step its size and time, the unexpected steps, and
/// (when counting) the calls of the counted steps.
fn grow_all(device: Device, growth: Growth, count: bool) -> Result<(Steps, usize, Counts), Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let mut options = VirtualMemoryResourceOptions::default();
    if growth == Growth::ReserveAhead {
        options = options.reserve_ahead(ReserveAhead::DeviceMemory);
    }
    let vmm = VirtualMemoryResource::new(device, options)?;
    let moving = growth.moves();
    let mut buffer: VirtualBuffer = vmm.allocate(VMM_STEP, &stream)?;
    let last = VMM_LIMIT / VMM_STEP - 2;
    let (mut steps, mut unexpected, mut counts) = (Vec::new(), 0, Vec::new());
    for index in 0..=last {
        let size = buffer.size() + VMM_STEP;
        let end = buffer.ptr() + buffer.size() as u64;
        let block = if moving { Some(Block::reserve_at(d, end, VMM_STEP)?) } else { None };
        let counting = count && counted_step(index, last);
        if counting {
            arm(d)?;
        }
        let chunks = buffer.chunk_count();
        let before = buffer.ptr();
        let start = Instant::now();
        let grown = buffer.grow(size)?;
        drop(std::mem::replace(&mut buffer, grown));
        let took = elapsed_ns(start);
        if counting {
            counts.push((chunks, probe(d, &stream)?));
        }
        drop(block);
        if (buffer.ptr() != before) != moving {
            unexpected += 1;
        }
        steps.push((size, took));
    }
    drop(buffer);
    stream.synchronize()?;
    Ok((steps, unexpected, counts))
}

/// Repetitions of the single growth (2 MiB to 4 MiB) that cuda.core's side compares with.
const FIRST_GROW_REPS: usize = 300;

/// One growth from 2 MiB to 4 MiB of a fresh buffer, in place and forced to move, repeated: the
/// one growth cuda.core 1.2.2 can make (see BENCHMARKS.md), so the comparison has a number for
/// both. Timed like a step of [`grow_all`]: the grow and dropping the buffer it grew from.
pub(crate) fn first_grows(device: Device) -> Result<Vec<(bool, Stats)>, Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
    let mut rows = Vec::new();
    for moving in [false, true] {
        let (mut sample, mut unexpected) = (Vec::with_capacity(FIRST_GROW_REPS), 0);
        for rep in 0..FIRST_GROW_REPS + FIRST_GROW_REPS / 10 {
            let buffer: VirtualBuffer = vmm.allocate(VMM_STEP, &stream)?;
            let end = buffer.ptr() + buffer.size() as u64;
            let block = if moving { Some(Block::reserve_at(d, end, VMM_STEP)?) } else { None };
            let before = buffer.ptr();
            let start = Instant::now();
            let grown = buffer.grow(2 * VMM_STEP)?;
            drop(buffer);
            let took = elapsed_ns(start);
            let in_mode = (grown.ptr() != before) == moving;
            drop((grown, block));
            // The first tenth warms up; a growth that did not behave as the mode wants (the
            // driver did not give the blocking reservation the address asked for) is left out.
            if rep >= FIRST_GROW_REPS / 10 {
                if in_mode { sample.push(took) } else { unexpected += 1 }
            }
        }
        let stats = Stats::of(sample);
        let mode = mode_name(moving);
        println!("  one growth 2 MiB -> 4 MiB, {mode}: {} ({unexpected} left out)", stats.show());
        rows.push((moving, stats));
    }
    stream.synchronize()?;
    Ok(rows)
}

/// An address range reserved with the raw driver API right after a buffer, as another allocator
/// might, so that the buffer cannot grow in place.
struct Block<'a> {
    d: &'a Driver,
    ptr: DevicePtr,
    size: usize,
}

impl<'a> Block<'a> {
    fn reserve_at(d: &'a Driver, hint: DevicePtr, size: usize) -> Result<Block<'a>, Error> {
        let mut ptr: DevicePtr = 0;
        // SAFETY: a valid out-pointer; a hint is only a request.
        unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, 0, hint, 0)) }?;
        Ok(Block { d, ptr, size })
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        // SAFETY: the range this value reserved, freed once; nothing is mapped in it.
        if let Err(error) = unsafe { cu_call!(self.d, cuMemAddressFree(self.ptr, self.size)) } {
            eprintln!("bench: freeing a blocking reservation: {error}");
        }
    }
}
