//! `snapshot-view SNAPSHOT.json [PAGE.html] [--torch OUT.pickle]`: turns a memory snapshot
//! written by `MemorySnapshot::write_json` (`cuda_mem_core::snapshot`, feature `snapshot`) into
//! the viewer's self-contained page (beside the JSON by default, with `.html`), and the
//! timeline's SVG beside it (`.svg`); with `--torch`, also into the pickle file PyTorch's memory
//! viewer (pytorch.org/memory_viz) opens. Prints the snapshot's table. `cargo xtask
//! snapshot-view` runs it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cuda_mem_core::snapshot::MemorySnapshot;

const USAGE: &str = "usage: snapshot-view SNAPSHOT.json [PAGE.html] [--torch OUT.pickle]";

/// What to read and write.
struct Paths {
    input: PathBuf,
    page: PathBuf,
    torch: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(paths) = parse(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::FAILURE;
    };
    match convert(&paths) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("snapshot-view: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The paths `args` name: `--torch` and its path anywhere, then one or two paths.
fn parse(args: &[String]) -> Option<Paths> {
    let mut positional = Vec::new();
    let mut torch = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--torch" {
            torch = Some(PathBuf::from(args.next()?));
        } else {
            positional.push(PathBuf::from(arg));
        }
    }
    let (input, page) = match positional.as_slice() {
        [input] => (input.clone(), input.with_extension("html")),
        [input, page] => (input.clone(), page.clone()),
        _ => return None,
    };
    Some(Paths { input, page, torch })
}

fn convert(paths: &Paths) -> Result<(), Box<dyn std::error::Error>> {
    let input = &paths.input;
    let text = std::fs::read_to_string(input).map_err(|e| format!("{}: {e}", input.display()))?;
    let snapshot = MemorySnapshot::from_json(&text).map_err(|e| format!("{}: {e}", input.display()))?;
    print!("{snapshot}");
    snapshot.write_html(&paths.page)?;
    let svg = paths.page.with_extension("svg");
    std::fs::write(&svg, snapshot.timeline_svg())?;
    println!("wrote {} and {}", paths.page.display(), svg.display());
    if let Some(torch) = &paths.torch {
        write_torch(&snapshot, torch)?;
    }
    Ok(())
}

/// Writes PyTorch's pickle of `snapshot` to `path`.
fn write_torch(snapshot: &MemorySnapshot, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    snapshot.write_torch_pickle(path).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("wrote {} (open it at pytorch.org/memory_viz)", path.display());
    Ok(())
}
