//! `results.json`: every number of the run, written by hand (the workspace has no JSON crate).

use std::fmt::Write as _;

use tests::output::json_escape;

use super::{Results, host_cpus};
use crate::pacing::PACING_WORK_NS;
use crate::vmm::mode_name;

/// The whole file.
pub(super) fn json(results: &Results) -> String {
    let mut out = String::from("{\n");
    let _ = writeln!(out, r#"  "driver": "{}","#, json_escape(&results.driver));
    let _ = writeln!(out, r#"  "host_cpus": {},"#, host_cpus());
    let _ = writeln!(out, r#"  "simulator": {},"#, results.simulator);
    out.push_str("  \"units\": \"nanoseconds, except rates (operations per second)\",\n");
    out.push_str("  \"pools\": [\n");
    let rows: Vec<String> = results.pools.iter().map(|r| format!("    {}", r.json())).collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"scaling\": [\n");
    let rows: Vec<String> = results.scaling.iter().map(|r| format!("    {}", r.json())).collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n");
    if let Some(p) = &results.pacing {
        let _ = writeln!(
            out,
            r#"  "pacing": {{"work_ns":{PACING_WORK_NS},"raw_per_pair":{},"raw_with_work_per_pair":{},"hidden_ns":{:.1}}},"#,
            p.raw.json(),
            p.raw_with_work.json(),
            p.hidden_ns()
        );
    }
    out.push_str("  \"sharing\": [\n");
    let rows: Vec<String> = results
        .sharing
        .iter()
        .map(|r| {
            format!(
                r#"    {{"batch":{},"per_buffer":{{"ours_parent":{},"ours_child":{},"ours":{},"raw_parent":{},"raw_child":{},"raw":{}}},"overhead_per_buffer":{:.1}}}"#,
                r.batch,
                r.ours_parent.json(),
                r.ours_child.json(),
                r.ours.json(),
                r.raw_parent.json(),
                r.raw_child.json(),
                r.raw.json(),
                r.overhead()
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n");
    match &results.resend {
        Some(r) => {
            let _ = writeln!(out, r#"  "sharing_resend": {},"#, r.json());
        }
        None => out.push_str("  \"sharing_resend\": null,\n"),
    }
    out.push_str("  \"vmm\": [\n");
    let rows: Vec<String> = results
        .vmm
        .iter()
        .map(|m| {
            let n = m.steps.len();
            let tenth = m.tenth();
            let sizes: Vec<String> = m.steps.iter().map(|s| s.0.to_string()).collect();
            let times: Vec<String> = m.steps.iter().map(|s| format!("{:.0}", s.1)).collect();
            let calls: Vec<String> = m
                .calls
                .iter()
                .map(|(chunks, calls)| {
                    let per: Vec<String> =
                        calls.iter().filter(|c| c.1 > 0).map(|(f, c)| format!(r#""{f}":{c}"#)).collect();
                    format!(
                        r#"{{"chunks_before":{chunks},"total":{},"by_function":{{{}}}}}"#,
                        calls.iter().map(|c| c.1).sum::<u32>(),
                        per.join(",")
                    )
                })
                .collect();
            format!(
                "    {{\"mode\":\"{}\",\"steps\":{n},\"per_step\":{},\"first_10pct\":{},\"last_10pct\":{},\"unexpected_steps\":{},\"calls\":[{}],\n     \"size_after\":[{}],\n     \"step_ns\":[{}]}}",
                m.name(),
                m.stats(0..n).json(),
                m.stats(0..tenth).json(),
                m.stats(n - tenth..n).json(),
                m.unexpected,
                calls.join(","),
                sizes.join(","),
                times.join(",")
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"vmm_first_grow\": [\n");
    let rows: Vec<String> = results
        .first_grows
        .iter()
        .map(|(moving, stats)| format!(r#"    {{"mode":"{}","per_grow":{}}}"#, mode_name(*moving), stats.json()))
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"rates\": [\n");
    let rows: Vec<String> = results
        .lookups
        .iter()
        .map(|r| format!(r#"    {{"what":"{}","threads":{},"per_second":{}}}"#, r.what, r.threads, r.rate.json()))
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"adaptors\": [\n");
    let rows: Vec<String> = results.adaptors.iter().map(|r| format!("    {}", r.json())).collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"copies\": [\n");
    let rows: Vec<String> = results.copies.iter().map(|r| format!("    {}", r.json())).collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n");
    match &results.first_call {
        Some((spawn, main)) => {
            let _ = writeln!(
                out,
                r#"  "first_call": {{"spawn_to_return":{},"main_to_return":{}}}"#,
                spawn.json(),
                main.json()
            );
        }
        None => out.push_str("  \"first_call\": null\n"),
    }
    out.push_str("}\n");
    out
}
