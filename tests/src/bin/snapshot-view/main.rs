//! `snapshot-view SNAPSHOT.json [PAGE.html]`: turns a memory snapshot written by
//! `MemorySnapshot::write_json` (`cuda_mem_core::snapshot`, feature `snapshot`) into the
//! viewer's self-contained page (beside the JSON by default, with `.html`), and the timeline's
//! SVG beside it (`.svg`); prints the snapshot's table. `cargo xtask snapshot-view` runs it.

use std::path::PathBuf;
use std::process::ExitCode;

use cuda_mem_core::snapshot::MemorySnapshot;

const USAGE: &str = "usage: snapshot-view SNAPSHOT.json [PAGE.html]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, page) = match args.as_slice() {
        [input] => (PathBuf::from(input), PathBuf::from(input).with_extension("html")),
        [input, page] => (PathBuf::from(input), PathBuf::from(page)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    match convert(&input, &page) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("snapshot-view: {error}");
            ExitCode::FAILURE
        }
    }
}

fn convert(input: &std::path::Path, page: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(input).map_err(|e| format!("{}: {e}", input.display()))?;
    let snapshot = MemorySnapshot::from_json(&text).map_err(|e| format!("{}: {e}", input.display()))?;
    print!("{snapshot}");
    snapshot.write_html(page)?;
    let svg = page.with_extension("svg");
    std::fs::write(&svg, snapshot.timeline_svg())?;
    println!("wrote {} and {}", page.display(), svg.display());
    Ok(())
}
