//! `results.md`, also printed at the end: a table per case, with what each column measures.

use std::fmt::Write as _;

use super::{Results, host_cpus};
use crate::adaptors::{ADAPTOR_PAIR_SIZE, AdaptorRow, CopyRow};
use crate::elastic::{ElasticRow, OnDemandRow};
use crate::handoff::{HANDOFF_BUFFER, Handoff};
use crate::pacing::{PACING_WORK_NS, Pacing};
use crate::pools::PoolRow;
use crate::replay::{TIMED_PASSES, TraceRun};
use crate::resource_pairs::{RESOURCE_PAIR_SIZE, ROUNDS, ResourcePairRow};
use crate::scaling::{PAIRS_PER_SYNC, SCALING_SIZE, ScalingRow};
use crate::sharing::{RateRow, ResendRow, ShareRow};
use crate::snapshots::{RECORDING_PAIR_SIZE, RecordingRow, SnapshotRow};
use crate::stats::Stats;
use crate::units::{MIB, bytes, ns};
use crate::vmm::{VmmMode, mode_name};

/// The whole file: a table per case, in the order the cases run.
pub(super) fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# cuda-mem benchmarks\n\ndriver: {}\n\nhost: {} CPUs\n", results.driver, host_cpus());
    md.push_str("Times are medians with p10–p90 in brackets.\n\n");
    pools(&mut md, &results.pools);
    if let Some(pacing) = &results.pacing {
        additivity(&mut md, pacing);
    }
    scaling(&mut md, &results.scaling);
    resource_pairs(&mut md, &results.resource_pairs);
    sharing(&mut md, &results.sharing);
    if let Some(r) = &results.resend {
        resend(&mut md, r);
    }
    vmm(&mut md, &results.vmm);
    vmm_calls(&mut md, &results.vmm);
    first_grows(&mut md, &results.first_grows);
    lookups(&mut md, &results.lookups);
    first_call(&mut md, results.first_call.as_ref());
    adaptors(&mut md, &results.adaptors);
    copies(&mut md, &results.copies);
    traces(&mut md, &results.traces);
    history_and_snapshots(&mut md, results.recording.as_ref(), &results.snapshots);
    elastic(&mut md, &results.elastic, results.on_demand.as_ref());
    if let Some(h) = &results.handoff {
        handoff(&mut md, h);
    }
    md
}

/// Case (11)'s tables.
fn handoff(md: &mut String, h: &Handoff) {
    let _ = writeln!(
        md,
        "\n## 11. Hand-off to workers\n\n\
         Buffers of {} lent to worker processes that hand each straight back (`lend` → `recv` + \
         `give_back` → `Received::Returned`), one in flight per worker: buffers per second (the median of the \
         rounds) with an `AsyncIpcChannel` per worker on one Tokio thread, with an `IpcChannel` per worker on a \
         thread each, and with the same round trip by hand (`cuMemPoolExportPointer`, a plain frame, the worker's \
         `cuMemPoolImportPointer` + `cuMemFreeAsync` + `cuStreamSynchronize`, a plain frame back) on a thread \
         each, in turn in the same rounds. Ratios of rates: above 1.00 is faster than what it is against.\n\n\
         | workers | async | blocking | raw | async/blocking | async/raw | blocking/raw |\n|---|---|---|---|---|---|---|",
        bytes(HANDOFF_BUFFER)
    );
    for r in &h.throughput {
        let [async_raw, blocking_raw] = r.over_raw();
        let _ = writeln!(
            md,
            "| {} | {:.0}/s | {:.0}/s | {:.0}/s | {:.2} | {async_raw:.2} | {blocking_raw:.2} |",
            r.workers,
            r.async_rate.median,
            r.blocking_rate.median,
            r.raw_rate.median,
            r.async_over_blocking()
        );
    }
    md.push_str(
        "\nOne hand-off to one worker, lend to return: a first send (the pool's resource message and import with the \
         buffer; a fresh pool each time; raw: the pool's descriptor exported and imported by hand) and re-sends (the \
         buffer only). Ratios of times: above 1.00 is slower than raw.\n\n\
         | hand-off | blocking | async | raw | blocking/raw | async/raw |\n|---|---|---|---|---|---|\n",
    );
    for r in &h.latency {
        let [async_raw, blocking_raw] = r.over_raw();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {blocking_raw:.2} | {async_raw:.2} |",
            r.what,
            r.blocking.show(),
            r.async_.show(),
            r.raw.show()
        );
    }
}

/// Case (10)'s tables.
fn elastic(md: &mut String, rows: &[ElasticRow], on_demand: Option<&OnDemandRow>) {
    md.push_str("\n## 10. Elastic memory\n\n");
    md.push_str(
        "A group of 256 MiB buffers: `sleep(Release::Offload)` and the `wake` after it (synchronized) against the \
         pinned copies of the same buffers (device → host, host → device) in the same run, the staging pool keeping \
         its memory; `sleep(Release::Discard)` and the `wake` after it; the median of 3. Share: the copy's time over \
         the elastic step's (1.00: the copy's bandwidth). VMM calls (the simulator only): `cuMemCreate`, \
         `cuMemRelease`, `cuMemMap`, `cuMemUnmap`, `cuMemSetAccess`. Against raw: each step's time over the same driver \
         calls made by hand (offload, restore, discard, wake), in the same rounds.\n\n\
         | bytes | buffers | offload | share | restore | share | discard | wake | VMM calls (discard, wake) | against raw |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let calls = r.calls.map_or("-".to_string(), |(d, w)| format!("{d}, {w}"));
        let raw = r.against_raw().map(|x| format!("{x:.2}")).join(", ");
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {} | {:.2} | {} | {} | {calls} | {raw} |",
            bytes(r.bytes),
            r.buffers,
            r.offload.show(),
            r.offload_share(),
            r.restore.show(),
            r.restore_share(),
            r.discard.show(),
            r.wake.show()
        );
    }
    if let Some(o) = on_demand {
        md.push_str("\nAn on-demand range of 2 MiB pages: mapping one more page, with N pages mapped (the median of 9).\n\n| mapped pages | one more page |\n|---|---|\n");
        for (n, s) in &o.per_page {
            let _ = writeln!(md, "| {n} | {} |", s.show());
        }
        let _ = writeln!(md, "\nUnmapping {} gave the device {} back.", bytes(o.mapped), bytes(o.returned));
    }
}

/// Case (9)'s tables.
fn history_and_snapshots(md: &mut String, recording: Option<&RecordingRow>, snapshots: &[SnapshotRow]) {
    md.push_str("\n## 9. Memory history and snapshots\n\n");
    if let Some(r) = recording {
        let _ = writeln!(
            md,
            "A `Buffer` of {} from a pool, allocated and dropped, with the history's recording off (one relaxed load \
             per allocation), on, on with backtraces and on with frees' completions, in turn in the same run.\n\n\
             | recording | per pair | against off |\n|---|---|---|\n| off | {} | 1.00× |",
            bytes(RECORDING_PAIR_SIZE),
            r.off.show()
        );
        for (name, stats) in
            [("on", &r.on), ("on, with backtraces", &r.backtraces), ("on, with frees' completions", &r.completions)]
        {
            let _ = writeln!(md, "| {name} | {} | {:.2}× |", stats.show(), stats.median / r.off.median);
        }
    }
    md.push_str(
        "\nA snapshot of a caching resource holding N live allocations (blocks of its segments) with the events \
         recorded: `take_snapshot()`, `to_json()` and `to_html()` (the viewer's page), the median of 7 (of 3 for the \
         million events).\n\n\
         | live allocations | events | take_snapshot | to_json | to_html | page |\n|---|---|---|---|---|---|\n",
    );
    for r in snapshots {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            r.live,
            r.events,
            r.take.show(),
            r.json.show(),
            r.html.show(),
            bytes(r.page_bytes)
        );
    }
}

/// Case (1)'s table, and a note where some rows have more threads than the host has CPUs.
fn pools(md: &mut String, rows: &[PoolRow]) {
    md.push_str("## 1. Pool allocate+free pairs (one stream per thread)\n\n");
    md.push_str(
        "Safe: `allocate` (a `Buffer`, which holds shares of its pool and stream). Scoped: `allocate_scoped` (a \
         `ScopedBuffer`, which borrows them). Raw: `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` through cuda-mem-sys. Raw \
         + check: the same with the `cuStreamIsCapturing` the safe API makes before each allocation (as cuda.core \
         does), so that safe / (raw + check) is our code's share alone.\n\n\
         | size | threads | safe API per pair | scoped per pair | raw cuda-mem-sys per pair | raw + check per pair | \
         safe/raw | scoped/raw | safe/(raw + check) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.2}× | {:.2}× | {:.2}× |",
            bytes(r.size),
            r.threads,
            r.safe.show(),
            r.scoped.show(),
            r.raw.show(),
            r.raw_checked.show(),
            r.ratio(),
            r.ratio_scoped(),
            r.ratio_checked()
        );
    }
    if let Some(threads) = rows.iter().map(|r| r.threads).filter(|&t| t > host_cpus()).max() {
        let _ = writeln!(
            md,
            "\nThis host has {} CPUs: on {threads} threads the threads take turns, so those rows measure the \
             scheduler as much as the pool (see 1b for the curve).",
            host_cpus()
        );
    }
}

/// Case (1)'s additivity check, under its table: caller work that hides in the driver's time
/// hides overheads as small; work that slows the pairs down hides none.
fn additivity(md: &mut String, p: &Pacing) {
    let hidden = p.hidden_ns();
    let (difference, meaning) = if hidden >= 0.5 {
        (
            format!("{hidden:.0} ns less than alone"),
            format!(
                "Caller work of up to about {:.0} ns per pair, an API's overhead included, can hide in the driver's \
                 time here, so safe minus raw understates it by up to that much.",
                hidden.min(PACING_WORK_NS as f64)
            ),
        )
    } else if hidden <= -0.5 {
        (
            format!("{:.0} ns more than alone", -hidden),
            format!(
                "None of the caller's work hid in the driver's time: safe minus raw does not understate an \
                 overhead here, and may include up to about {:.0} ns of the driver slowed by its caller's work.",
                -hidden
            ),
        )
    } else {
        ("as long as alone".to_string(), "Overheads add to the raw time in full here.".to_string())
    };
    let _ = writeln!(
        md,
        "\nAdditivity check: a raw 256 B pair takes {}; with {PACING_WORK_NS} ns of the caller's own work after \
         each, the work's own time taken off, {}: {difference}, where a driver whose cost does not depend on its \
         caller's pace would take about as long. {meaning}",
        p.raw.show(),
        p.raw_with_work.show(),
    );
}

/// Case (2)'s table.
fn sharing(md: &mut String, rows: &[ShareRow]) {
    md.push_str("\n## 2. Sharing with a child process, per buffer\n\n");
    md.push_str(
        "| batch | ours: parent (export+encode+send) | ours: child (recv+decode+import) | ours total | raw: parent | \
         raw: child | raw total | our cost beyond the raw calls |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.batch,
            r.ours_parent.show(),
            r.ours_child.show(),
            r.ours.show(),
            r.raw_parent.show(),
            r.raw_child.show(),
            r.raw.show(),
            ns(r.overhead())
        );
    }
}

/// Case (3)'s table: each mode's steps.
fn vmm(md: &mut String, modes: &[VmmMode]) {
    md.push_str("\n## 3. VMM growth, 2 MiB to 1 GiB in 2 MiB steps\n\n");
    md.push_str(
        "| mode | steps | per step | first 10% | last 10% | steps not in their mode |\n|---|---|---|---|---|---|\n",
    );
    for m in modes {
        let n = m.steps.len();
        let tenth = m.tenth();
        let _ = writeln!(
            md,
            "| {} | {n} | {} | {} | {} | {} |",
            m.name(),
            m.stats(0..n).show(),
            m.stats(0..tenth).show(),
            m.stats(n - tenth..n).show(),
            m.unexpected
        );
    }
}

/// Case (3)'s driver calls per counted step (the simulator counts them).
fn vmm_calls(md: &mut String, modes: &[VmmMode]) {
    if modes.iter().all(|m| m.calls.is_empty()) {
        md.push_str("\nDriver calls per step are counted on the simulator only.\n");
        return;
    }
    md.push_str("\nDriver calls per step (counted on the simulator), by the chunks the buffer had before it:\n\n");
    md.push_str("| mode | chunks before | calls | by function |\n|---|---|---|---|\n");
    for m in modes {
        for (chunks, calls) in &m.calls {
            let per: Vec<String> = calls.iter().filter(|c| c.1 > 0).map(|(f, c)| format!("{f} {c}")).collect();
            let total: u32 = calls.iter().map(|c| c.1).sum();
            let _ = writeln!(md, "| {} | {chunks} | {total} | {} |", m.name(), per.join(", "));
        }
    }
}

/// Case (3)'s one growth of a fresh buffer, per mode.
fn first_grows(md: &mut String, rows: &[(bool, Stats)]) {
    if rows.is_empty() {
        return;
    }
    md.push_str("\nOne growth of a fresh buffer from 2 MiB to 4 MiB (the grow and dropping the old buffer):\n\n");
    md.push_str("| mode | per growth |\n|---|---|\n");
    for (moving, stats) in rows {
        let _ = writeln!(md, "| {} | {} |", mode_name(*moving), stats.show());
    }
}

/// Case (4)'s table.
fn lookups(md: &mut String, rows: &[RateRow]) {
    md.push_str("\n## 4. Registry lookups and duplicate-import cache hits\n\n");
    md.push_str("| operation | threads | per second (all threads) |\n|---|---|---|\n");
    for r in rows {
        let _ = writeln!(md, "| {} | {} | {} |", r.what, r.threads, millions(&r.rate));
    }
}

/// Case (5)'s table, when it was measured.
fn first_call(md: &mut String, times: Option<&(Stats, Stats)>) {
    md.push_str("\n## 5. First driver call (lazy loading)\n\n");
    if let Some((spawn, main)) = times {
        md.push_str("| measured | time |\n|---|---|\n");
        let _ = writeln!(md, "| spawn to the child's report (parent's clock; exec included) | {} |", spawn.show());
        let _ = writeln!(md, "| child's main() to cuDriverGetVersion returned | {} |", main.show());
    }
}

/// Case (6)'s table.
fn adaptors(md: &mut String, rows: &[AdaptorRow]) {
    md.push_str("\n## 6. Memory-resource adaptors, per allocate+free pair\n\n");
    let _ = writeln!(
        md,
        "A `Buffer` of {} allocated and dropped through each adaptor over a pool, and through the bare pool \
         resource on the same stream, alternately in the same run.\n\n| adaptor | through it | bare pool | ratio |\n\
         |---|---|---|---|",
        bytes(ADAPTOR_PAIR_SIZE)
    );
    for r in rows {
        let _ = writeln!(md, "| {} | {} | {} | {:.2}× |", r.name, r.adapted.show(), r.bare.show(), r.ratio());
    }
}

/// Case (7)'s table.
fn copies(md: &mut String, rows: &[CopyRow]) {
    md.push_str("\n## 7. Slice copies host ↔ device, per round trip (pageable memory)\n\n");
    md.push_str(
        "One copy in and one out of a device buffer, the same pageable `Vec`s each way. Safe: `copy_from_slice` + \
         `copy_to_slice` (+ to_vec: `to_vec` in place of `copy_to_slice`, which allocates the `Vec`). Raw: \
         `cuMemcpyHtoDAsync` + `cuMemcpyDtoHAsync` + `cuStreamSynchronize`. Each safe copy waits for \
         the stream before it returns (the slice's borrow ends there), so the safe round trip synchronizes twice \
         where the raw one does once.\n\n\
         | size each way | safe | + to_vec | raw | safe/raw | to_vec/raw |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2}× | {:.2}× |",
            bytes(r.size),
            r.safe.show(),
            r.to_vec.show(),
            r.raw.show(),
            r.ratio(),
            r.ratio_to_vec()
        );
    }
}

/// A rate's median and spread, in millions per second.
fn millions(rate: &Stats) -> String {
    format!("{:.2} M ({:.2}–{:.2} M)", rate.median / 1e6, rate.p10 / 1e6, rate.p90 / 1e6)
}

/// Case (2)'s re-send row: buffers already sent, sent again, against the raw export+import.
fn resend(md: &mut String, r: &ResendRow) {
    let _ = writeln!(
        md,
        "\nRe-send of {batch} buffers already sent, still held by the child: per buffer, the parent's send (each \
         buffer's export kept from its first send) and the child's recv (each found among the channel's imports), \
         against the raw export+import of the same batch above.\n\n\
         | batch | parent (send) | child (recv) | both | raw export+import | both/raw | target ≤ 1/10 of raw |\n\
         |---|---|---|---|---|---|---|\n\
         | {batch} | {} | {} | {} | {} | {:.3}× | {} |",
        r.parent.show(),
        r.child.show(),
        r.both.show(),
        r.raw.show(),
        r.ratio(),
        if r.ratio() <= ResendRow::TARGET { "met" } else { "missed" },
        batch = r.batch,
    );
}

/// Case (1b)'s table, with which rows have more threads than the host has CPUs.
fn scaling(md: &mut String, rows: &[ScalingRow]) {
    let cpus = host_cpus();
    let _ = writeln!(
        md,
        "\n## 1b. Scaling: {} allocate+free pairs on 1–8 threads (one stream per thread)\n\n\
         All threads allocate from one pool at once, each on a stream of its own, {PAIRS} pairs then a wait for \
         its stream, over and over. Pairs per second are of all threads together, over the span from the first \
         thread's start to the last one's end; per thread is the time one pair takes on each thread (threads / \
         rate). This host has {cpus} CPUs: rows with more threads (marked *) measure the scheduler as much as \
         the pool, the threads taking turns.\n\n\
         | threads | Buffer pairs/s | ScopedBuffer pairs/s | raw pairs/s | Buffer per pair per thread | \
         ScopedBuffer per pair per thread | raw per pair per thread | Buffer/raw | ScopedBuffer/raw |\n\
         |---|---|---|---|---|---|---|---|---|",
        bytes(SCALING_SIZE),
        PAIRS = PAIRS_PER_SYNC,
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {}{} | {} | {} | {} | {} | {} | {} | {:.2}× | {:.2}× |",
            r.threads,
            if r.threads > cpus { " *" } else { "" },
            millions(&r.buffer),
            millions(&r.scoped),
            millions(&r.raw),
            ns(r.per_thread_ns(&r.buffer)),
            ns(r.per_thread_ns(&r.scoped)),
            ns(r.per_thread_ns(&r.raw)),
            r.ratio(&r.buffer),
            r.ratio(&r.scoped)
        );
    }
}

/// Case (1c)'s table (nothing without rows).
pub(super) fn resource_pairs(md: &mut String, rows: &[ResourcePairRow]) {
    if rows.is_empty() {
        return;
    }
    let mut threads: Vec<String> = Vec::new();
    for r in rows {
        if threads.last() != Some(&r.threads.to_string()) {
            threads.push(r.threads.to_string());
        }
    }
    let _ = writeln!(
        md,
        "\n## 1c. Memory resources: {} allocate+free pairs on {} threads (one stream per thread)\n\n\
         Each resource (a fresh one per thread count) on every thread at once, {PAIRS} pairs then a wait for the \
         stream, over and over, as in 1b: a `Buffer` allocated and dropped, and the trait's own calls \
         (`allocate_raw` + `deallocate_raw`). Raw is `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on a driver \
         pool that keeps its memory. Every kind is timed once per round, {ROUNDS} rounds, in the same run; ratios \
         are time per pair against raw's (below 1: faster than the driver). This host has {} CPUs.\n\n\
         | resource | threads | Buffer per pair per thread | calls per pair per thread | raw per pair per thread | \
         Buffer/raw | calls/raw |\n|---|---|---|---|---|---|---|",
        bytes(RESOURCE_PAIR_SIZE),
        match threads.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        },
        host_cpus(),
        PAIRS = PAIRS_PER_SYNC,
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.3}× | {:.3}× |",
            r.name,
            r.threads,
            ns(r.per_thread_ns(&r.buffer)),
            ns(r.per_thread_ns(&r.calls)),
            ns(r.per_thread_ns(&r.raw)),
            r.ratio(&r.buffer),
            r.ratio(&r.calls)
        );
    }
}

/// Case (8)'s table (nothing without runs).
pub(super) fn traces(md: &mut String, runs: &[TraceRun]) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## 8. Allocation traces replayed (tests/src/bin/bench/trace.rs documents the workloads)\n\n\
         Each trace's events against a fresh resource: a `Buffer` per allocation, dropped at its free, every \
         stream waited for at each step's end. Peak reserved is the most the resource held from the driver \
         (read after every allocation), peak allocated the most the trace had live. Time per step is the \
         step's allocate and free calls (not its synchronization), the median of {TIMED_PASSES} passes; the \
         spread is over the steps. Plots: `trace_<trace>.svg`; every step: `trace_<trace>.csv`; every reading (the plot's points): \
         `trace_<trace>_samples.csv`.\n\n\
         | trace | steps | allocations | resource | peak allocated | peak reserved | reserved/allocated | \
         time per step | all steps |\n|---|---|---|---|---|---|---|---|---|"
    );
    let mib = |b: f64| format!("{:.1} MiB", b / MIB as f64);
    for run in runs {
        for r in &run.replays {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {:.3} | {} | {} |",
                run.trace,
                run.live.len(),
                run.allocations,
                r.contender,
                mib(run.peak_allocated() as f64),
                mib(r.peak_reserved() as f64),
                run.ratio(r),
                r.per_step().show(),
                ns(r.total_ns())
            );
        }
    }
}
