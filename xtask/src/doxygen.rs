//! `cuda.h`'s Doxygen comments as rustdoc Markdown, for the generated bindings.
//!
//! A converter of our own rather than a Doxygen→Markdown crate (`doxygen-rs`): `cuda.h` leans on
//! NVIDIA's own aliases (`\notefnerr`, `\note_null_stream`, …), which such a crate leaves as raw
//! markup, and on `::name` references, which it does not know; the commands the header uses are
//! few and line-oriented. What each becomes:
//!
//! - `\brief`: the summary line, as is; `\par`: a paragraph break; `\struct`, `\typedef` and
//!   `\defgroup` (Doxygen's own bookkeeping): dropped;
//! - `\param[in] name - text`: an item of a `# Parameters` list; `\return(s)`: a `# Returns`
//!   section; `\sa`: "See also:"; `\note`: "**Note:**"; `\deprecated`: "**Deprecated:**";
//! - NVIDIA's note aliases: the sentence each stands for, linking NVIDIA's page where there is one;
//! - inline: `\p x`, `\c x`, `\ref x` and `::x` references as code, `\e x` as emphasis, `\b x` as
//!   bold, `\n` dropped (a line break in Doxygen, a line end here anyway); `\code`…`\endcode` as a
//!   `text` block; HTML tags the header uses for tables and lists kept, any other `<…>` escaped;
//! - the `< ` that opens a trailing member comment (`///<`) dropped.

/// NVIDIA's Doxygen aliases for notes, and the sentence each stands for.
const NOTE_ALIASES: &[(&str, &str)] = &[
    ("notefnerr", "this function may also return error codes from previous, asynchronous launches."),
    (
        "note_null_stream",
        "this function uses standard [default stream semantics](https://docs.nvidia.com/cuda/cuda-driver-api/stream-sync-behavior.html).",
    ),
    (
        "note_sync",
        "this function exhibits [synchronous behavior](https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html) for most use cases.",
    ),
    (
        "note_async",
        "this function exhibits [asynchronous behavior](https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html) for most use cases.",
    ),
    (
        "note_memcpy",
        "see the [synchronization behavior of memcpy](https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html).",
    ),
    (
        "note_memset",
        "see the [synchronization behavior of memset](https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html).",
    ),
    (
        "note_graph_thread_safety",
        "graph objects are not thread-safe; see [graph thread safety](https://docs.nvidia.com/cuda/cuda-driver-api/graphs-thread-safety.html).",
    ),
    (
        "note_destroy_ub",
        "using the handle after this call, or destroying it while it is in use, is undefined behavior.",
    ),
];

/// HTML tags `cuda.h` writes on purpose (tables, lists, small print); rustdoc renders them.
const KEPT_TAGS: &[&str] =
    &["table", "tr", "td", "th", "br", "ul", "ol", "li", "small", "i", "b", "em", "strong", "sup", "sub"];

/// Doxygen commands that only file the comment somewhere in Doxygen's output.
const DROPPED: &[&str] = &["struct", "typedef", "defgroup", "ingroup", "addtogroup", "{", "}"];

/// Converts one Doxygen comment (its text, without the comment markers) to Markdown.
pub fn to_markdown(comment: &str) -> String {
    let mut out = Lines::default();
    let mut in_code = false;
    let mut in_params = false;
    let mut had_params = false;
    for (index, raw) in normalize_lines(comment).iter().enumerate() {
        let mut line = raw.trim();
        if index == 0 {
            line = line.strip_prefix("< ").or_else(|| line.strip_prefix('<').filter(|_| line == "<")).unwrap_or(line);
        }
        if line == "\\code" {
            out.push("```text".to_string());
            in_code = true;
            continue;
        }
        if line == "\\endcode" {
            out.push("```".to_string());
            in_code = false;
            continue;
        }
        if in_code {
            out.push(raw.trim_end().to_string());
            continue;
        }
        let (command, rest) = split_command(line);
        if command.is_none() && line.is_empty() {
            in_params = false;
        }
        match command {
            Some("brief") => out.push(inline(rest)),
            Some("param") | Some("param[in]") | Some("param[out]") | Some("param[in,out]") => {
                if !had_params {
                    out.section("# Parameters");
                    had_params = true;
                } else if !in_params {
                    out.blank();
                }
                in_params = true;
                let (name, text) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                let text = text.trim_start();
                let text = text.strip_prefix("- ").unwrap_or(text).trim();
                let direction = match command {
                    Some("param[in]") => " (in)",
                    Some("param[out]") => " (out)",
                    Some("param[in,out]") => " (in, out)",
                    _ => "",
                };
                out.push(format!("- `{name}`{direction}: {}", inline(text)));
            }
            Some("return") | Some("returns") => {
                in_params = false;
                out.section("# Returns");
                if !rest.is_empty() {
                    out.push(inline(rest));
                }
            }
            Some("sa") => {
                in_params = false;
                out.paragraph(format!("See also: {}", inline(rest)));
            }
            Some("note" | "note:") => {
                in_params = false;
                out.paragraph(format!("**Note:** {}", inline(rest)));
            }
            Some("deprecated") => {
                in_params = false;
                out.paragraph(format!("**Deprecated:** {}", inline(rest)).trim_end().to_string());
            }
            Some("par") => {
                in_params = false;
                out.blank();
                if !rest.is_empty() {
                    out.push(format!("**{}**", inline(rest)));
                }
            }
            Some(name) if DROPPED.contains(&name) => {}
            Some(name) if NOTE_ALIASES.iter().any(|(alias, _)| *alias == name) => {
                in_params = false;
                let sentence = NOTE_ALIASES.iter().find(|(alias, _)| *alias == name).map_or("", |(_, s)| s);
                out.paragraph(format!("**Note:** {sentence}"));
                if !rest.is_empty() {
                    out.push(inline(rest));
                }
            }
            _ if in_params && !line.is_empty() => out.push(format!("  {}", inline(line))),
            _ => out.push(inline(line)),
        }
    }
    if in_code {
        out.push("```".to_string());
    }
    out.finish()
}

/// The comment's lines, one command per line where Doxygen reads commands anywhere: `\code`,
/// `\endcode` and the block commands (`\param`, `\return`, `\note`, `\sa`) start lines of their
/// own, and an inline command that ends a line (`… and \p`) moves to the next, beside its word.
fn normalize_lines(comment: &str) -> Vec<String> {
    const BREAKS: &[&str] = &["\\code", "\\endcode", "\\param", "\\returns", "\\return", "\\note", "\\sa "];
    let mut lines: Vec<String> = Vec::new();
    let mut carried = String::new();
    for line in comment.lines() {
        let mut rest = format!("{carried}{line}");
        carried.clear();
        for inline_command in ["\\p", "\\c", "\\e", "\\b", "\\ref"] {
            if let Some(stripped) = rest.trim_end().strip_suffix(inline_command)
                && (stripped.is_empty() || stripped.ends_with(char::is_whitespace) || stripped.ends_with(','))
            {
                carried = format!("{inline_command} ");
                rest = stripped.trim_end().to_string();
                break;
            }
        }
        let was_blank = rest.trim().is_empty();
        loop {
            let trimmed = rest.trim_start();
            if let Some(fence) = ["\\code", "\\endcode"].into_iter().find(|fence| trimmed.starts_with(fence)) {
                lines.push(fence.to_string());
                rest = trimmed[fence.len()..].to_string();
                continue;
            }
            // A break after the line's first character: a command that starts the line stays.
            let skip = trimmed.chars().next().map_or(0, char::len_utf8);
            let found = BREAKS.iter().filter_map(|token| trimmed[skip..].find(token).map(|at| at + skip)).min();
            let Some(at) = found else { break };
            if !trimmed[..at].trim().is_empty() {
                lines.push(trimmed[..at].to_string());
            }
            rest = trimmed[at..].to_string();
        }
        if !rest.trim().is_empty() || was_blank {
            lines.push(rest);
        }
    }
    if !carried.is_empty() {
        lines.push(carried);
    }
    lines
}

/// The output's lines, with blank lines where sections begin and none doubled.
#[derive(Default)]
struct Lines(Vec<String>);

impl Lines {
    fn push(&mut self, line: String) {
        if line.is_empty() {
            self.blank();
        } else {
            self.0.push(line);
        }
    }

    fn blank(&mut self) {
        if self.0.last().is_some_and(|last| !last.is_empty()) {
            self.0.push(String::new());
        }
    }

    fn paragraph(&mut self, line: String) {
        self.blank();
        self.0.push(line);
    }

    fn section(&mut self, heading: &str) {
        self.blank();
        self.0.push(heading.to_string());
        self.0.push(String::new());
    }

    fn finish(mut self) -> String {
        while self.0.last().is_some_and(String::is_empty) {
            self.0.pop();
        }
        let mut text = self.0.join("\n");
        text.push('\n');
        text
    }
}

/// Splits `\command rest` into the command (with a `[in]`-style suffix) and the rest.
fn split_command(line: &str) -> (Option<&str>, &str) {
    let Some(body) = line.strip_prefix('\\') else {
        return (None, line);
    };
    let end = body.find(char::is_whitespace).unwrap_or(body.len());
    let (command, rest) = body.split_at(end);
    (Some(command), rest.trim())
}

/// Inline markup: `\p x`, `\c x`, `\ref x`, `::x`, `\e x`, `\b x`, `\n`, stray `*` and `<…>`.
fn inline(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 16);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let prev = if i == 0 { ' ' } else { chars[i - 1] };
        if c == '\\' {
            let word: String = chars[i + 1..].iter().take_while(|c| c.is_ascii_alphabetic()).collect();
            let after = i + 1 + word.len();
            match word.as_str() {
                "p" | "c" | "ref" | "e" | "b" if chars.get(after).is_some_and(|c| c.is_whitespace()) => {
                    let start = after + 1;
                    let len = chars[start..].iter().take_while(|c| is_word_char(**c)).count();
                    let argument: String = chars[start..start + len].iter().collect();
                    let argument = argument.trim_start_matches("::");
                    if argument.is_empty() {
                        i = after;
                        continue;
                    }
                    match word.as_str() {
                        "e" => out.push_str(&format!("*{argument}*")),
                        "b" => out.push_str(&format!("**{argument}**")),
                        _ => out.push_str(&format!("`{argument}`")),
                    }
                    i = start + len;
                    continue;
                }
                "n" => {
                    i = after;
                    continue;
                }
                _ => {}
            }
            out.push('\\');
            i += 1;
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') && !is_word_char(prev) && prev != ':' {
            let start = i + 2;
            let len = chars[start..].iter().take_while(|c| is_word_char(**c)).count();
            if len > 0 && !chars[start].is_ascii_digit() {
                let mut name: String = chars[start..start + len].iter().collect();
                let mut end = start + len;
                // `::cuInit()`: the call parentheses go inside the code span.
                if chars.get(end) == Some(&'(') && chars.get(end + 1) == Some(&')') {
                    name.push_str("()");
                    end += 2;
                }
                out.push_str(&format!("`{name}`"));
                i = end;
                continue;
            }
        }
        if c == '*' && !prev.is_alphanumeric() && chars.get(i + 1).is_some_and(|n| n.is_alphanumeric() || *n == '_') {
            // `*dptr`: a C dereference, not emphasis.
            out.push_str("\\*");
            i += 1;
            continue;
        }
        if c == '<' {
            let close = chars[i..].iter().position(|c| *c == '>');
            let tag: Option<String> = close.map(|len| chars[i + 1..i + len].iter().collect());
            let known = tag.as_deref().is_some_and(|tag| {
                let name = tag.trim_start_matches('/').trim_end_matches('/').trim();
                KEPT_TAGS.contains(&name.to_ascii_lowercase().as_str())
            });
            out.push_str(if known { "<" } else { "&lt;" });
            i += 1;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Characters of a C identifier or a `::`-qualified path.
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The plain text of converted Markdown (for the error table's descriptions, printed in error
/// messages): code spans and emphasis markers removed.
pub fn plain(markdown: &str) -> String {
    markdown.replace("**", "").replace('`', "").replace("\\*", "*").replace("&lt;", "<")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_a_function_comment() {
        let doxygen = "\\brief Frees memory with stream ordered semantics\n\n\
            Inserts a free operation into \\p hStream.\n\
            \\note During stream capture, this function results in a free node.\n\n\
            \\param dptr - memory to free\n\
            \\param[in] hStream  - The stream establishing the\n\
            stream ordering contract.\n\
            \\returns\n::CUDA_SUCCESS,\n::CUDA_ERROR_INVALID_VALUE\n\
            \\notefnerr\n\n\\sa ::cuMemAllocAsync, ::cuMemFree_v2\n";
        let expected = "Frees memory with stream ordered semantics\n\n\
            Inserts a free operation into `hStream`.\n\n\
            **Note:** During stream capture, this function results in a free node.\n\n\
            # Parameters\n\n\
            - `dptr`: memory to free\n\
            - `hStream` (in): The stream establishing the\n  stream ordering contract.\n\n\
            # Returns\n\n`CUDA_SUCCESS`,\n`CUDA_ERROR_INVALID_VALUE`\n\n\
            **Note:** this function may also return error codes from previous, asynchronous launches.\n\n\
            See also: `cuMemAllocAsync`, `cuMemFree_v2`\n";
        assert_eq!(to_markdown(doxygen), expected);
    }

    #[test]
    fn leaves_no_doxygen_command_behind() {
        let doxygen = "< The ::CU_STREAM_WAIT_VALUE_FLUSH flag. See \\ref CUDA_MEMOP for details.\\n\n\
            \\deprecated Use \\c cuFoo instead.\n\\par\n\\e italic \\b bold <major number> <td>x</td>\n\
            \\typedef struct CUfoo_st* CUfoo\nReturned in *dptr, by ::cuInit().";
        let markdown = to_markdown(doxygen);
        assert!(!markdown.contains('\\') || markdown.contains("\\*"), "{markdown}");
        for command in ["\\ref", "\\n", "\\deprecated", "\\par", "\\e ", "\\b ", "\\c ", "\\typedef"] {
            assert!(!markdown.contains(command), "{command} in {markdown}");
        }
        assert!(markdown.starts_with("The `CU_STREAM_WAIT_VALUE_FLUSH` flag. See `CUDA_MEMOP` for details."));
        assert!(markdown.contains("**Deprecated:** Use `cuFoo` instead."));
        assert!(markdown.contains("*italic* **bold** &lt;major number> <td>x</td>"));
        assert!(markdown.contains("Returned in \\*dptr, by `cuInit()`."));
        assert_eq!(plain("**Deprecated:** `cuInit()` in \\*dptr"), "Deprecated: cuInit() in *dptr");
    }

    #[test]
    fn reads_commands_where_doxygen_does() {
        let doxygen = "Mapping for a certain\nkernel \\param blockSize Block size.\n\
            leave both \\p\nblockSize and \\p\ndynamicSMemSize as 0.\n\\note: Allocations count.";
        let expected = "Mapping for a certain\nkernel\n\n# Parameters\n\n- `blockSize`: Block size.\n  \
            leave both\n  `blockSize` and\n  `dynamicSMemSize` as 0.\n\n**Note:** Allocations count.\n";
        assert_eq!(to_markdown(doxygen), expected);
    }

    #[test]
    fn keeps_code_blocks_verbatim() {
        let doxygen = "Example: \\code\n    int a = ::b; \\p c\n\\endcode\nAfter.";
        assert_eq!(to_markdown(doxygen), "Example:\n```text\n    int a = ::b; \\p c\n```\nAfter.\n");
    }
}
