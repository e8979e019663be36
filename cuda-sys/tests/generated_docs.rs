//! The generated bindings carry no documentation prose from `cuda.h` (NVIDIA's header has its own
//! licence): each item's doc is one line linking NVIDIA's online reference, made by `cargo xtask
//! bindgen` from the header's Doxygen groups (`xtask/src/doxygen.rs`).

/// The reference every link points into.
const REFERENCE: &str = "https://docs.nvidia.com/cuda/cuda-driver-api/";

/// Functions `cuda.h` declares outside every Doxygen group: NVIDIA's reference has no page for
/// them, so their docs link the reference's root.
const UNGROUPED_FUNCTIONS: [&str; 1] = ["cuGetExportTable"];

const BINDINGS: &str = include_str!("../src/generated/bindings.rs");
const FUNCTIONS: &str = include_str!("../src/generated/functions.rs");

/// The doc lines the generator writes itself, the same for every item: the generated modules'
/// own, and each accessor's note on resolving (no prose of `cuda.h`'s).
const OWN_LINES: [&str; 6] = [
    " Each driver function's symbol, base name and ABI versions.",
    " Every driver function `cuda.h` declares, in header order.",
    " One cache slot per driver function.",
    "",
    " The entry point, resolved on first use (see [`Driver`]); a [`LoadError`] naming the symbol",
    " where the driver lacks it.",
];

/// Every doc line of the generated files, with its file and line number.
fn doc_lines() -> impl Iterator<Item = (&'static str, usize, &'static str)> {
    [("bindings.rs", BINDINGS), ("functions.rs", FUNCTIONS)].into_iter().flat_map(|(file, text)| {
        text.lines()
            .enumerate()
            .filter_map(move |(index, line)| line.trim_start().strip_prefix("///").map(|doc| (file, index + 1, doc)))
    })
}

/// A link line's item name and target: `` `name` in NVIDIA's CUDA Driver API reference:
/// [Title](url).`` or, for an item outside every group, `` `name` in NVIDIA's [CUDA Driver API
/// reference](root).``
fn parse_link(doc: &str) -> Option<(&str, &str)> {
    let rest = doc.strip_prefix(" `")?;
    let (name, rest) = rest.split_once("` in NVIDIA's ")?;
    if let Some(rest) = rest.strip_prefix("CUDA Driver API reference: [") {
        let (title, rest) = rest.split_once("](")?;
        let url = rest.strip_suffix(").")?;
        return (!title.is_empty() && !title.contains('`')).then_some((name, url));
    }
    let url = rest.strip_prefix("[CUDA Driver API reference](")?.strip_suffix(").")?;
    (url == REFERENCE).then_some((name, url))
}

/// Whether `url` is a group page as Doxygen names it: `group__` and the group's name, each `_`
/// doubled (`CUDA_MEM` -> `group__CUDA__MEM.html`).
fn is_group_page(url: &str) -> bool {
    url.strip_prefix(REFERENCE)
        .and_then(|page| page.strip_prefix("group__"))
        .and_then(|page| page.strip_suffix(".html"))
        .is_some_and(|name| {
            name.split("__")
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
        })
}

#[test]
fn every_doc_line_is_one_link_to_nvidias_reference() {
    let prose: Vec<String> = doc_lines()
        .filter(|(_, _, doc)| !OWN_LINES.contains(doc))
        .filter(|(_, _, doc)| parse_link(doc).is_none_or(|(_, url)| url != REFERENCE && !is_group_page(url)))
        .map(|(file, line, doc)| format!("{file}:{line}:{doc}"))
        .collect();
    assert!(prose.is_empty(), "{} doc lines that are not a link, first: {:?}", prose.len(), prose.first());
}

#[test]
fn every_function_links_the_page_of_its_group() {
    let lines: Vec<&str> = FUNCTIONS.lines().map(str::trim_start).collect();
    let mut functions = 0;
    for (index, line) in lines.iter().enumerate() {
        let Some(signature) = line.strip_prefix("pub fn ") else { continue };
        functions += 1;
        let symbol = signature.split('(').next().unwrap_or_default();
        // The link is the accessor's first doc line, above the generator's own ones.
        let doc = lines[..index].iter().rev().take_while(|l| l.starts_with("///") || l.starts_with("#[")).last();
        let doc = doc.copied().unwrap_or_default();
        let link = doc.strip_prefix("///").and_then(parse_link);
        let Some((name, url)) = link else { panic!("{symbol} has no link: {doc:?}") };
        // The link names the function as cuda.h writes it (`cuMemAlloc` for `cuMemAlloc_v2`).
        assert!(symbol.starts_with(name), "{symbol} links {name}");
        if UNGROUPED_FUNCTIONS.contains(&symbol) {
            assert_eq!(url, REFERENCE, "{symbol}");
        } else {
            assert!(is_group_page(url), "{symbol} links {url}, not a group's page");
        }
    }
    assert!(functions > 400, "only {functions} functions in functions.rs");
}

#[test]
fn the_types_link_the_data_types_page() {
    // `CUdeviceptr` and `CUresult` are in cuda.h's `CUDA_TYPES` group.
    for item in ["pub type CUdeviceptr =", "pub struct cudaError_enum("] {
        let at = BINDINGS.find(item).unwrap_or_else(|| panic!("no {item}"));
        // The doc line is above the item's attributes.
        let doc = BINDINGS[..at].lines().rev().find(|line| !line.starts_with("#[")).unwrap_or_default();
        let url = doc.strip_prefix("///").and_then(parse_link).map(|(_, url)| url);
        assert_eq!(url, Some("https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html"), "{item}");
    }
}
