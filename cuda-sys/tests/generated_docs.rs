//! The generated bindings' documentation is Markdown: no Doxygen command of `cuda.h` is left for
//! rustdoc to print raw (`cargo xtask bindgen` converts them, `xtask/src/doxygen.rs`).

/// Every doc line of the generated files, with its file and line number.
fn doc_lines() -> impl Iterator<Item = (&'static str, usize, &'static str)> {
    [
        ("bindings.rs", include_str!("../src/generated/bindings.rs")),
        ("functions.rs", include_str!("../src/generated/functions.rs")),
    ]
    .into_iter()
    .flat_map(|(file, text)| {
        text.lines()
            .enumerate()
            .filter_map(move |(index, line)| line.trim_start().strip_prefix("///").map(|doc| (file, index + 1, doc)))
    })
}

#[test]
fn no_doxygen_command_in_the_generated_docs() {
    let commands = [
        "\\brief",
        "\\param",
        "\\return",
        "\\sa ",
        "\\note",
        "\\p ",
        "\\c ",
        "\\e ",
        "\\b ",
        "\\deprecated",
        "\\par",
        "\\ref",
        "\\code",
        "\\endcode",
        "\\struct",
        "\\typedef",
        "\\defgroup",
    ];
    let raw: Vec<String> = doc_lines()
        .filter(|(_, _, doc)| commands.iter().any(|command| doc.contains(command)) || doc.trim_end().ends_with("\\n"))
        .map(|(file, line, doc)| format!("{file}:{line}:{doc}"))
        .collect();
    assert!(raw.is_empty(), "{} doc lines with Doxygen markup, first: {:?}", raw.len(), raw.first());
}

#[test]
fn references_to_other_items_are_code() {
    // cuda.h writes `::cuMemFree`; the docs write `cuMemFree`, as code.
    let raw: Vec<String> = doc_lines()
        .filter(|(_, _, doc)| doc.contains(" ::cu") || doc.contains(" ::CU"))
        .map(|(file, line, doc)| format!("{file}:{line}:{doc}"))
        .collect();
    assert!(raw.is_empty(), "{} doc lines with raw references, first: {:?}", raw.len(), raw.first());
}
