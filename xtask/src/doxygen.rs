//! What `cuda.h`'s Doxygen markup gives the generated bindings: links and error descriptions.
//!
//! The bindings carry none of the header's documentation prose: NVIDIA's header has a licence of
//! its own, and the crate is MIT or Apache-2.0. Each item links NVIDIA's online reference instead.
//! [`Index`] reads which `\defgroup` of the header declares each name; [`Group::url`] is the page
//! Doxygen made of that group. The pages' per-function anchors are hashes that cannot be derived
//! from the header, so a link names the page and its text names the item.
//!
//! The one text taken from the header is the first sentence describing each `CUresult` code
//! ([`plain`]). Error messages print it, as the driver's `cuGetErrorString` does at run time.

use std::collections::HashMap;

/// The root of NVIDIA's online CUDA Driver API reference; every group page lies under it.
pub const REFERENCE: &str = "https://docs.nvidia.com/cuda/cuda-driver-api/";

/// One `\defgroup` of `cuda.h`: a page of NVIDIA's reference.
#[derive(Debug, PartialEq, Eq)]
pub struct Group {
    /// Its Doxygen name (`CUDA_MEM`).
    pub name: String,
    /// Its title (`Memory Management`).
    pub title: String,
}

impl Group {
    /// The group's page. Doxygen writes each `_` of a group's name as `__` in file names.
    pub fn url(&self) -> String {
        format!("{REFERENCE}group__{}.html", self.name.replace('_', "__"))
    }
}

/// The doc line that links `name` to its group's page, or to the reference's root for a name
/// declared outside every group.
pub fn link(name: &str, group: Option<&Group>) -> String {
    match group {
        // Brackets in a title (`[DEPRECATED]`) would read as a link inside the link.
        Some(group) => format!(
            "`{name}` in NVIDIA's CUDA Driver API reference: [{}]({}).",
            group.title.replace('[', "\\[").replace(']', "\\]"),
            group.url()
        ),
        None => format!("`{name}` in NVIDIA's [CUDA Driver API reference]({REFERENCE})."),
    }
}

/// The groups of `cuda.h`, and the group each name is declared in.
#[derive(Debug)]
pub struct Index {
    groups: Vec<Group>,
    /// The innermost group open on each line of the header, as an index into `groups`.
    line_groups: Vec<Option<usize>>,
    /// Each identifier's first line outside comments. C declares a name before using it, so this
    /// is where the name is declared.
    first_use: HashMap<String, usize>,
    /// The lines declaring each function (`CUresult CUDAAPI cuMemAlloc(`), by the name written.
    declarations: HashMap<String, Vec<usize>>,
    /// `#define cuMemAlloc cuMemAlloc_v2` read backwards: the names written for each symbol.
    written_as: HashMap<String, Vec<String>>,
}

impl Index {
    /// Reads the groups and declarations of `header` (the text of `cuda.h`).
    ///
    /// # Errors
    /// - a `@{` with no `\defgroup` before it, or a `@}` that closes no group;
    /// - a group still open at the end of the header.
    pub fn parse(header: &str) -> Result<Self, String> {
        let (groups, line_groups) = parse_groups(header)?;
        let tokens = tokenize(&strip_comments(header));
        let mut first_use = HashMap::new();
        let mut declarations: HashMap<String, Vec<usize>> = HashMap::new();
        let mut written_as: HashMap<String, Vec<String>> = HashMap::new();
        for (i, (token, line)) in tokens.iter().enumerate() {
            if is_ident(token) {
                first_use.entry(token.clone()).or_insert(*line);
            }
            let next = |k: usize| tokens.get(i + k).map(|(t, _)| t.as_str());
            if token == "CUDAAPI" && next(1).is_some_and(is_ident) && next(2) == Some("(") {
                declarations.entry(tokens[i + 1].0.clone()).or_default().push(tokens[i + 1].1);
            }
            if token == "#" && next(1) == Some("define") {
                let directive: Vec<&str> =
                    tokens[i + 2..].iter().take_while(|(_, l)| l == line).map(|(t, _)| t.as_str()).collect();
                if let Some((written, symbol)) = alias(&directive) {
                    written_as.entry(symbol.to_string()).or_default().push(written.to_string());
                }
            }
        }
        Ok(Index { groups, line_groups, first_use, declarations, written_as })
    }

    /// The group of the line `line` (0-based).
    fn group_at(&self, line: usize) -> Option<&Group> {
        self.line_groups.get(line).copied().flatten().map(|index| &self.groups[index])
    }

    /// The name a function symbol is written as in its group (`cuMemAlloc` for `cuMemAlloc_v2`),
    /// and that group. Declarations outside every group (the header's older variants, for its
    /// own build) do not count.
    pub fn function<'a>(&'a self, symbol: &'a str) -> Option<(&'a str, &'a Group)> {
        let written = self.written_as.get(symbol).into_iter().flatten().map(String::as_str);
        std::iter::once(symbol).chain(written).find_map(|name| {
            let lines = self.declarations.get(name)?;
            lines.iter().find_map(|line| self.group_at(*line)).map(|group| (name, group))
        })
    }

    /// The group of a type, constant or enum. A name bindgen made for a nested type
    /// (`Outer_Inner`, `Outer__bindgen_ty_1`) is filed with its outer type: the longest prefix,
    /// cut at an underscore, that the header uses.
    pub fn item(&self, name: &str) -> Option<&Group> {
        let name = name.split("__bindgen_ty").next().unwrap_or(name);
        let line = std::iter::successors(Some(name), |n| n.rsplit_once('_').map(|(head, _)| head))
            .find_map(|n| self.first_use.get(n))?;
        self.group_at(*line)
    }
}

/// The groups and, for each line, the innermost group open there. A group opens at the `@{`
/// after its `\defgroup` and closes at the matching `@}`.
fn parse_groups(header: &str) -> Result<(Vec<Group>, Vec<Option<usize>>), String> {
    let mut groups = Vec::new();
    let mut line_groups = Vec::new();
    let mut pending = None;
    let mut open = Vec::new();
    for (number, line) in header.lines().enumerate() {
        if let Some((_, rest)) = line.split_once("\\defgroup") {
            let (name, title) = rest.trim().split_once(char::is_whitespace).unwrap_or((rest.trim(), ""));
            pending = Some(Group { name: name.to_string(), title: title.trim().to_string() });
        }
        if line.contains("@{") {
            let group = pending.take().ok_or(format!("cuda.h:{}: `@{{` with no \\defgroup before it", number + 1))?;
            groups.push(group);
            open.push(groups.len() - 1);
        }
        line_groups.push(open.last().copied());
        if line.contains("@}") && open.pop().is_none() {
            return Err(format!("cuda.h:{}: `@}}` closes no group", number + 1));
        }
    }
    match open.last() {
        Some(index) => Err(format!("cuda.h: group {} is never closed", groups[*index].name)),
        None => Ok((groups, line_groups)),
    }
}

/// `cuMemAlloc cuMemAlloc_v2` or `cuMemcpyHtoD __CUDA_API_PTDS ( cuMemcpyHtoD_v2 )` (the tokens
/// of a `#define` after the word) as (written name, symbol); `None` for any other macro.
fn alias<'a>(directive: &[&'a str]) -> Option<(&'a str, &'a str)> {
    match directive {
        [written, symbol] | [written, _, "(", symbol, ")"] if written.starts_with("cu") && is_ident(symbol) => {
            Some((written, symbol))
        }
        _ => None,
    }
}

/// `text` with its comments and string literals blanked, its lines kept where they were.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
                out.push(' ');
            }
            ('/', Some('/')) => {
                while chars.peek().is_some_and(|c| *c != '\n') {
                    chars.next();
                }
            }
            ('"', _) => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '"' && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The identifiers and punctuation characters of C text, each with its line (0-based).
fn tokenize(code: &str) -> Vec<(String, usize)> {
    let mut tokens = Vec::new();
    for (number, line) in code.lines().enumerate() {
        let mut chars = line.char_indices().peekable();
        while let Some((start, c)) = chars.next() {
            if c.is_ascii_alphabetic() || c == '_' || c.is_ascii_digit() {
                let mut end = start + c.len_utf8();
                while let Some((at, next)) = chars.next_if(|(_, n)| n.is_ascii_alphanumeric() || *n == '_') {
                    end = at + next.len_utf8();
                }
                tokens.push((line[start..end].to_string(), number));
            } else if !c.is_whitespace() {
                tokens.push((c.to_string(), number));
            }
        }
    }
    tokens
}

/// Whether a token is a C identifier (a number is not).
fn is_ident(token: &str) -> bool {
    token.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}

/// The plain text of a Doxygen comment, on one line: `\deprecated` and `\note` as words, the
/// inline commands (`\p x`, `\c x`, `\ref x`, `\e x`, `\b x`, `\n`) and `::` references as
/// their bare argument, the `<` of a trailing member comment (`///<`) dropped.
pub fn plain(comment: &str) -> String {
    let mut words = Vec::new();
    let flat = comment.split_whitespace().collect::<Vec<_>>();
    for (index, word) in flat.iter().enumerate() {
        let word = match *word {
            "<" if index == 0 => continue,
            "\\brief" | "\\p" | "\\c" | "\\ref" | "\\e" | "\\b" | "\\n" => continue,
            "\\deprecated" => "Deprecated:",
            "\\note" => "Note:",
            word => word,
        };
        let word = word.strip_suffix("\\n").unwrap_or(word);
        words.push(word.replace("::", ""));
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header in `cuda.h`'s layout: an ungrouped typedef, two groups, a renamed function and
    /// an older variant declared outside every group.
    const HEADER: &str = "\
typedef unsigned int cuuint32_t;
#define cuMemAlloc cuMemAlloc_v2
#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)
/**
 * \\defgroup CUDA_TYPES Data types used by CUDA driver
 * @{
 */
typedef struct CUstream_st *CUstream; /**< CUDA stream */
typedef union CUlaunchAttributeValue_union { struct { int x; } clusterDim; } CUlaunchAttributeValue;
/** @} */ /* END CUDA_TYPES */
/**
 * \\defgroup CUDA_DEVICE_DEPRECATED Device Management [DEPRECATED]
 * @{
 */
/** \\brief Allocates ::CUstream memory. */
#pragma message(\"CUresult CUDAAPI cuFree(void)\")
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize);
CUresult CUDAAPI
cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
/** @} */
#if defined(__CUDA_API_VERSION_INTERNAL)
CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult CUDAAPI cuOutside(void);
#endif
";

    fn group(name: &str, title: &str) -> Group {
        Group { name: name.to_string(), title: title.to_string() }
    }

    #[test]
    fn files_each_name_under_the_group_that_declares_it() -> Result<(), String> {
        let index = Index::parse(HEADER)?;
        let types = group("CUDA_TYPES", "Data types used by CUDA driver");
        let device = group("CUDA_DEVICE_DEPRECATED", "Device Management [DEPRECATED]");
        assert_eq!(index.item("CUstream"), Some(&types));
        assert_eq!(index.item("CUstream_st"), Some(&types));
        assert_eq!(index.item("CUlaunchAttributeValue_union__bindgen_ty_1"), Some(&types));
        assert_eq!(index.item("CUlaunchAttributeValue_union_clusterDim"), Some(&types));
        assert_eq!(index.item("cuuint32_t"), None);
        assert_eq!(index.function("cuMemAlloc_v2"), Some(("cuMemAlloc", &device)));
        assert_eq!(index.function("cuMemcpyHtoD_v2"), Some(("cuMemcpyHtoD", &device)));
        assert_eq!(index.function("cuOutside"), None);
        assert_eq!(index.function("cuFree"), None, "a name in a string is no declaration");
        Ok(())
    }

    #[test]
    fn links_the_group_page_doxygen_names() {
        let device = group("CUDA_DEVICE_DEPRECATED", "Device Management [DEPRECATED]");
        assert_eq!(device.url(), "https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE__DEPRECATED.html");
        assert_eq!(
            link("cuDeviceComputeCapability", Some(&device)),
            "`cuDeviceComputeCapability` in NVIDIA's CUDA Driver API reference: \
             [Device Management \\[DEPRECATED\\]](https://docs.nvidia.com/cuda/cuda-driver-api/\
             group__CUDA__DEVICE__DEPRECATED.html)."
        );
        assert_eq!(
            link("cuuint32_t", None),
            "`cuuint32_t` in NVIDIA's [CUDA Driver API reference](https://docs.nvidia.com/cuda/cuda-driver-api/)."
        );
    }

    #[test]
    fn refuses_groups_that_do_not_nest() {
        assert!(Index::parse("/** @{ */").is_err_and(|e| e.contains("no \\defgroup")));
        assert!(Index::parse("/** @} */").is_err_and(|e| e.contains("closes no group")));
        assert!(Index::parse("/** \\defgroup A B\n @{ */").is_err_and(|e| e.contains("A is never closed")));
    }

    #[test]
    fn error_descriptions_are_plain_text() {
        assert_eq!(
            plain("This indicates that the CUDA driver has not been initialized with\n::cuInit() or that it failed."),
            "This indicates that the CUDA driver has not been initialized with cuInit() or that it failed."
        );
        assert_eq!(
            plain("\\deprecated\nThis error return is deprecated as of CUDA 5.0. It is no longer an error"),
            "Deprecated: This error return is deprecated as of CUDA 5.0. It is no longer an error"
        );
        assert_eq!(plain("< The \\p flags of \\ref CUDA_MEMOP.\\n"), "The flags of CUDA_MEMOP.");
    }
}
