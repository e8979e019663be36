//! `results.json`: every number of the run, as `serde_json` values.

use serde_json::{Value, json};

use super::{Results, host_cpus};
use crate::pacing::{PACING_WORK_NS, Pacing};
use crate::sharing::{RateRow, ShareRow};
use crate::stats::{Stats, rounded};
use crate::vmm::{VmmMode, mode_name};

/// The whole file, indented (`Value`'s alternate display is `serde_json`'s pretty printer).
pub(super) fn json(results: &Results) -> String {
    format!("{:#}\n", value(results))
}

/// The whole file as a value (`serde_json` sorts the keys); what was not measured is `null`.
fn value(results: &Results) -> Value {
    json!({
        "driver": results.driver,
        "host_cpus": host_cpus(),
        "simulator": results.simulator,
        "units": "nanoseconds, except rates (operations per second)",
        "pools": results.pools.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "scaling": results.scaling.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "pacing": results.pacing.as_ref().map(pacing_json),
        "sharing": results.sharing.iter().map(sharing_json).collect::<Vec<_>>(),
        "sharing_resend": results.resend.as_ref().map(|r| r.json()),
        "vmm": results.vmm.iter().map(vmm_json).collect::<Vec<_>>(),
        "vmm_first_grow": results.first_grows.iter().map(first_grow_json).collect::<Vec<_>>(),
        "rates": results.lookups.iter().map(rate_json).collect::<Vec<_>>(),
        "adaptors": results.adaptors.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "copies": results.copies.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "resource_pairs": results.resource_pairs.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "traces": results.traces.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "recording": results.recording.as_ref().map(|r| r.json()),
        "snapshots": results.snapshots.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "elastic": results.elastic.iter().map(|r| r.json()).collect::<Vec<_>>(),
        "on_demand": results.on_demand.as_ref().map(|r| r.json()),
        "handoff": results.handoff.as_ref().map(|r| r.json()),
        "first_call": results.first_call.as_ref().map(|(spawn, main)| {
            json!({"spawn_to_return": spawn.json(), "main_to_return": main.json()})
        }),
    })
}

/// One growth of a fresh buffer (case 3), in one mode.
fn first_grow_json((moving, stats): &(bool, Stats)) -> Value {
    json!({"mode": mode_name(*moving), "per_grow": stats.json()})
}

/// A row of case (4).
fn rate_json(row: &RateRow) -> Value {
    json!({"what": row.what, "threads": row.threads, "per_second": row.rate.json()})
}

/// Case (1)'s additivity check.
fn pacing_json(pacing: &Pacing) -> Value {
    json!({
        "work_ns": PACING_WORK_NS,
        "raw_per_pair": pacing.raw.json(),
        "raw_with_work_per_pair": pacing.raw_with_work.json(),
        "hidden_ns": rounded(pacing.hidden_ns(), 1),
    })
}

/// A row of case (2).
fn sharing_json(row: &ShareRow) -> Value {
    json!({
        "batch": row.batch,
        "per_buffer": {
            "ours_parent": row.ours_parent.json(),
            "ours_child": row.ours_child.json(),
            "ours": row.ours.json(),
            "raw_parent": row.raw_parent.json(),
            "raw_child": row.raw_child.json(),
            "raw": row.raw.json(),
        },
        "overhead_per_buffer": rounded(row.overhead(), 1),
    })
}

/// One mode of case (3): its statistics, the calls of its counted steps, and every step.
fn vmm_json(mode: &VmmMode) -> Value {
    let n = mode.steps.len();
    let tenth = mode.tenth();
    let calls: Vec<Value> = mode
        .calls
        .iter()
        .map(|(chunks, calls)| {
            let by_function: serde_json::Map<String, Value> =
                calls.iter().filter(|c| c.1 > 0).map(|(f, c)| ((*f).to_string(), json!(c))).collect();
            json!({
                "chunks_before": chunks,
                "total": calls.iter().map(|c| c.1).sum::<u32>(),
                "by_function": by_function,
            })
        })
        .collect();
    json!({
        "mode": mode.name(),
        "steps": n,
        "per_step": mode.stats(0..n).json(),
        "first_10pct": mode.stats(0..tenth).json(),
        "last_10pct": mode.stats(n - tenth..n).json(),
        "unexpected_steps": mode.unexpected,
        "calls": calls,
        "size_after": mode.steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        "step_ns": mode.steps.iter().map(|s| rounded(s.1, 0)).collect::<Vec<_>>(),
    })
}
