//! `cargo xtask bindgen [--check]`: generates `cuda-sys/src/generated/*.rs` from `cuda.h`.
//!
//! Three files come out of one pass over the header:
//! - `bindings.rs`: every type, constant and enum of `cuda.h` (enums as newtypes, so that codes
//!   the header does not know still fit);
//! - `functions.rs`: for every driver function, its `SymbolInfo` (the base name and the ABI
//!   version that `cuGetProcAddress_v2` needs to return exactly the variant `cuda.h` declares,
//!   and the per-thread-default-stream variant where there is one; the versions come from
//!   `cudaTypedefs.h`, `PFN_<name>_v<version>`), its cache slot, and its accessor on `Driver`,
//!   written out as code (no macro writes the public methods);
//! - `errors.rs`: the name and a one-line description of every `CUresult` code.
//!
//! The files carry none of `cuda.h`'s documentation prose (NVIDIA's header has its own licence):
//! each item's doc is one line linking the page of NVIDIA's online reference for the header group
//! that declares it ([`crate::doxygen`]). The error descriptions are the first sentence of each
//! code's comment, as plain text, which error messages print.
//!
//! `--check` generates into memory and fails if the committed files differ.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use quote::ToTokens;

use crate::doxygen::{self, Index};
use crate::header;

/// Where the generated files live, relative to the workspace root.
const OUT_DIR: &str = "cuda-sys/src/generated";

/// Runs the subcommand.
pub fn run(workspace: &Path, check: bool) -> Result<(), String> {
    let include = header::fetch_include_dir(workspace)?;
    let files = generate(&include)?;
    let out_dir = workspace.join(OUT_DIR);
    let mut stale = Vec::new();
    for (name, text) in &files {
        let path = out_dir.join(name);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current != *text {
            if check {
                stale.push(path.display().to_string());
            } else {
                std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
    }
    if !stale.is_empty() {
        return Err(format!("generated bindings are out of date (run `cargo xtask bindgen`): {}", stale.join(", ")));
    }
    if check {
        println!("bindings are up to date with {}", include.display());
    }
    Ok(())
}

/// Produces the formatted text of each generated file.
fn generate(include: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let header = include.join("cuda.h");
    let typedefs =
        std::fs::read_to_string(include.join("cudaTypedefs.h")).map_err(|e| format!("reading cudaTypedefs.h: {e}"))?;
    let versions = parse_typedef_versions(&typedefs);
    let index = std::fs::read_to_string(&header).map_err(|e| format!("reading cuda.h: {e}"))?;
    let index = Index::parse(&index)?;

    let legacy = run_bindgen(&header, include, false)?;
    let per_thread = run_bindgen(&header, include, true)?;
    let legacy: syn::File = syn::parse_str(&legacy).map_err(|e| format!("parsing bindgen output: {e}"))?;
    let per_thread: syn::File = syn::parse_str(&per_thread).map_err(|e| format!("parsing bindgen output: {e}"))?;

    // Per-thread names keyed by the legacy name they replace (`cuMemcpyHtoD_v2_ptds` for
    // `cuMemcpyHtoD_v2`).
    let mut per_thread_names = BTreeMap::new();
    for f in foreign_fns(&per_thread.items) {
        let name = f.sig.ident.to_string();
        if let Some(legacy_name) = name.strip_suffix("_ptds").or_else(|| name.strip_suffix("_ptsz")) {
            per_thread_names.insert(legacy_name.to_string(), name.clone());
        }
    }

    let mut type_items = Vec::new();
    let mut functions = Functions::default();
    let mut errors = Vec::new();
    for item in &legacy.items {
        match item {
            syn::Item::ForeignMod(m) => {
                for f in m.items.iter().filter_map(|i| match i {
                    syn::ForeignItem::Fn(f) => Some(f),
                    _ => None,
                }) {
                    write_function(&mut functions, f, &versions, &per_thread_names, &index);
                }
            }
            syn::Item::Impl(imp) if is_impl_of(imp, "cudaError_enum") => {
                collect_errors(imp, &mut errors);
                type_items.push(item.clone());
            }
            _ => type_items.push(item.clone()),
        }
    }

    let mut bindings = syn::File { shebang: None, attrs: Vec::new(), items: type_items };
    syn::visit_mut::VisitMut::visit_file_mut(&mut NoDocs, &mut bindings);
    for item in &mut bindings.items {
        link_item(item, &index);
    }
    let bindings = format!("{}{}", banner("types, constants and enums of cuda.h"), prettyplease::unparse(&bindings));
    let functions = format!(
        "{}{}",
        banner("every driver function of cuda.h, with the ABI version cuGetProcAddress needs"),
        functions.render()
    );
    let mut errors_text = banner("the name and description of every CUresult code");
    errors_text.push_str(
        "/// `(code, name, description)` for every `CUresult` value `cuda.h` defines.\n\
         pub static ERROR_TABLE: &[(u32, &core::ffi::CStr, &core::ffi::CStr)] = &[\n",
    );
    for (code, name, description) in &errors {
        let _ = writeln!(errors_text, "    ({code}, c{name:?}, c{description:?}),");
    }
    errors_text.push_str("];\n");

    Ok(vec![
        ("bindings.rs", rustfmt(&bindings)?),
        ("functions.rs", rustfmt(&functions)?),
        ("errors.rs", rustfmt(&errors_text)?),
    ])
}

fn banner(what: &str) -> String {
    format!(
        "// Generated by `cargo xtask bindgen` from cuda.h (nvidia-cuda-runtime {}): {what}.\n\
         // Do not edit by hand; `cargo xtask bindgen --check` fails when this file is stale.\n\n",
        header::WHEEL_VERSION
    )
}

fn run_bindgen(header: &Path, include: &Path, per_thread: bool) -> Result<String, String> {
    let mut builder = bindgen::Builder::default()
        .header(header.display().to_string())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("cu.*")
        .allowlist_type("(CU|cu|CUDA).*")
        .allowlist_var("(CU|CUDA).*")
        .default_enum_style(bindgen::EnumVariation::NewType { is_bitfield: false, is_global: false })
        .bitfield_enum("CUmemAllocationHandleType_enum")
        .derive_default(true)
        .derive_eq(true)
        .derive_hash(true)
        // Only the error codes' comments are read (for their descriptions); the rest are dropped.
        .generate_comments(true)
        .layout_tests(true)
        .formatter(bindgen::Formatter::None);
    if per_thread {
        builder = builder
            .clang_arg("-DCUDA_API_PER_THREAD_DEFAULT_STREAM")
            .with_codegen_config(bindgen::CodegenConfig::FUNCTIONS)
            .generate_comments(false);
    }
    let bindings = builder.generate().map_err(|e| format!("bindgen failed on {}: {e}", header.display()))?;
    Ok(bindings.to_string())
}

/// Removes every `#[doc]` attribute: the prose of `cuda.h`'s comments stays out of the bindings.
struct NoDocs;

impl syn::visit_mut::VisitMut for NoDocs {
    fn visit_attributes_mut(&mut self, attrs: &mut Vec<syn::Attribute>) {
        attrs.retain(|attr| !attr.path().is_ident("doc"));
    }
}

/// Gives a top-level type, constant or enum its link to NVIDIA's reference (fields and enum
/// values are on their type's page).
fn link_item(item: &mut syn::Item, index: &Index) {
    let (name, attrs) = match item {
        syn::Item::Const(i) => (i.ident.to_string(), &mut i.attrs),
        syn::Item::Struct(i) => (i.ident.to_string(), &mut i.attrs),
        syn::Item::Union(i) => (i.ident.to_string(), &mut i.attrs),
        syn::Item::Type(i) => (i.ident.to_string(), &mut i.attrs),
        syn::Item::Enum(i) => (i.ident.to_string(), &mut i.attrs),
        syn::Item::Use(i) => match &i.tree {
            syn::UseTree::Path(syn::UsePath { tree, .. }) => match &**tree {
                syn::UseTree::Rename(rename) => (rename.rename.to_string(), &mut i.attrs),
                _ => return,
            },
            _ => return,
        },
        _ => return,
    };
    if name == "_" {
        // A layout test (`const _: () = …`), not an item of the header.
        return;
    }
    let line = format!(" {}", doxygen::link(&name, index.item(&name)));
    attrs.insert(0, syn::parse_quote!(#[doc = #line]));
}

/// Maps a base name (`cuMemAlloc`) to its ABI versions: legacy ones, then per-thread ones.
type Versions = BTreeMap<String, (Vec<u32>, Vec<u32>)>;

fn parse_typedef_versions(typedefs: &str) -> Versions {
    let mut versions = Versions::new();
    for line in typedefs.lines().filter(|l| l.contains("typedef")) {
        let Some(start) = line.find("PFN_") else {
            continue;
        };
        let ident: String = line[start + 4..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let (ident, per_thread) = match ident.strip_suffix("_ptds").or_else(|| ident.strip_suffix("_ptsz")) {
            Some(stripped) => (stripped.to_string(), true),
            None => (ident, false),
        };
        let Some((base, version)) = ident.rsplit_once("_v") else {
            continue;
        };
        let Ok(version) = version.parse::<u32>() else {
            continue;
        };
        let entry = versions.entry(base.to_string()).or_default();
        let list = if per_thread { &mut entry.1 } else { &mut entry.0 };
        if !list.contains(&version) {
            list.push(version);
        }
    }
    for (legacy, per_thread) in versions.values_mut() {
        legacy.sort_unstable();
        per_thread.sort_unstable();
    }
    versions
}

/// Splits `cuMemAlloc_v2` into (`cuMemAlloc`, 2); a name without a suffix is variant 1.
fn split_variant<'a>(name: &'a str, versions: &Versions) -> (&'a str, usize) {
    if let Some((base, n)) = name.rsplit_once("_v")
        && let Ok(n) = n.parse::<usize>()
        && versions.contains_key(base)
    {
        return (base, n);
    }
    (name, 1)
}

/// The three parts of `functions.rs`, one entry per driver function in header order.
#[derive(Default)]
struct Functions {
    /// `specs`' constants: each function's `SymbolInfo`.
    specs: String,
    /// The names, for `SYMBOLS` and the cache slots.
    names: Vec<String>,
    /// The accessors on `Driver`.
    methods: String,
}

impl Functions {
    /// The file's text: the specs, `SYMBOLS`, the cache slots and the accessors.
    fn render(&self) -> String {
        let mut out = String::from(
            "use crate::LoadError;\nuse crate::loader::{Driver, Slot, SymbolInfo};\n\n\
             /// Each driver function's symbol, base name and ABI versions.\n\
             #[allow(non_upper_case_globals)]\nmod specs {\n    use crate::loader::SymbolInfo;\n\n",
        );
        out.push_str(&self.specs);
        out.push_str("}\n\n/// Every driver function `cuda.h` declares, in header order.\npub static SYMBOLS: &[SymbolInfo] = &[\n");
        for name in &self.names {
            let _ = writeln!(out, "    specs::{name},");
        }
        out.push_str("];\n\n/// One cache slot per driver function.\n#[allow(non_snake_case)]\n#[derive(Default)]\npub(crate) struct Entries {\n");
        for name in &self.names {
            let _ = writeln!(out, "    {name}: Slot,");
        }
        out.push_str(
            "}\n\n#[allow(non_snake_case, clippy::type_complexity, clippy::too_many_arguments)]\nimpl Driver {\n",
        );
        out.push_str(&self.methods);
        out.push_str("}\n");
        out
    }
}

fn write_function(
    out: &mut Functions,
    f: &syn::ForeignItemFn,
    versions: &Versions,
    per_thread_names: &BTreeMap<String, String>,
    index: &Index,
) {
    let name = f.sig.ident.to_string();
    let (base, variant) = split_variant(&name, versions);
    let (legacy, per_thread) = versions.get(base).cloned().unwrap_or_default();
    let version = legacy.get(variant - 1).copied();
    let per_thread_entry = per_thread_names.get(&name).and_then(|pt_name| {
        // Per-thread variants exist only for the newest legacy variants, so they line up with
        // the end of the legacy list.
        let index = (variant - 1).checked_sub(legacy.len().saturating_sub(per_thread.len()))?;
        per_thread.get(index).map(|v| (pt_name.clone(), *v))
    });
    let version = version.map_or("None".to_string(), |v| format!("Some({v})"));
    let per_thread = per_thread_entry.map_or("None".to_string(), |(n, v)| format!("Some((c\"{n}\", {v}))"));
    let _ = writeln!(
        out.specs,
        "    pub(super) const {name}: SymbolInfo = \
         SymbolInfo {{ symbol: c\"{name}\", base: c\"{base}\", version: {version}, per_thread: {per_thread} }};"
    );
    out.names.push(name.clone());
    write_method(&mut out.methods, f, &name, index);
}

/// The accessor of one driver function: its entry point, resolved on first use.
fn write_method(out: &mut String, f: &syn::ForeignItemFn, name: &str, index: &Index) {
    let (written, group) = index.function(name).map_or((name, None), |(w, g)| (w, Some(g)));
    let args: Vec<String> = f
        .sig
        .inputs
        .iter()
        .map(|arg| match arg {
            syn::FnArg::Typed(pat) => format!("{}: {}", tidy(&pat.pat), tidy(&pat.ty)),
            syn::FnArg::Receiver(_) => String::new(),
        })
        .collect();
    let ret = match &f.sig.output {
        syn::ReturnType::Default => "()".to_string(),
        syn::ReturnType::Type(_, ty) => tidy(ty),
    };
    let _ = writeln!(
        out,
        "    /// {}\n    ///\n    /// The entry point, resolved on first use (see [`Driver`]); a [`LoadError`] naming the symbol\n    \
         /// where the driver lacks it.\n    #[inline]\n    \
         pub fn {name}(&self) -> Result<unsafe extern \"C\" fn({}) -> {ret}, LoadError> {{\n        \
         // SAFETY: the signature is `cuda.h`'s for the symbol at the ABI version `specs` names\n        \
         // (both generated from the header).\n        \
         unsafe {{ self.entry(&self.entries.{name}, &specs::{name}) }}\n    }}\n",
        doxygen::link(written, group),
        args.join(", ")
    );
}

fn tidy(tokens: &impl ToTokens) -> String {
    tokens
        .to_token_stream()
        .to_string()
        .replace("* mut ", "*mut ")
        .replace("* const ", "*const ")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" ,", ",")
        .replace("*const::", "*const ::")
        .replace("*mut::", "*mut ::")
}

fn foreign_fns(items: &[syn::Item]) -> impl Iterator<Item = &syn::ForeignItemFn> {
    items.iter().flat_map(|item| match item {
        syn::Item::ForeignMod(m) => m
            .items
            .iter()
            .filter_map(|i| match i {
                syn::ForeignItem::Fn(f) => Some(f),
                _ => None,
            })
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    })
}

fn is_impl_of(imp: &syn::ItemImpl, name: &str) -> bool {
    imp.trait_.is_none() && matches!(&*imp.self_ty, syn::Type::Path(p) if p.path.is_ident(name))
}

fn collect_errors(imp: &syn::ItemImpl, out: &mut Vec<(u32, String, String)>) {
    for item in &imp.items {
        let syn::ImplItem::Const(c) = item else {
            continue;
        };
        let syn::Expr::Call(call) = &c.expr else {
            continue;
        };
        let Some(syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(code), .. })) = call.args.first() else {
            continue;
        };
        let Ok(code) = code.base10_parse::<u32>() else {
            continue;
        };
        out.push((code, c.ident.to_string(), first_sentence(&doxygen::plain(&doc_text(&c.attrs)))));
    }
}

/// The text of an item's `#[doc]` attributes.
fn doc_text(attrs: &[syn::Attribute]) -> String {
    attrs
        .iter()
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first sentence of a doc comment, on one line.
fn first_sentence(doc: &str) -> String {
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = flat.find(". ").map_or(flat.len(), |i| i + 1);
    flat[..end].trim_end_matches('.').to_string()
}

fn rustfmt(text: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024", "--emit", "stdout", "--quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running rustfmt: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("rustfmt has no stdin")?;
    let input = text.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().map_err(|e| format!("rustfmt: {e}"))?;
    let _ = writer.join();
    if !output.status.success() {
        return Err(format!("rustfmt failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    String::from_utf8(output.stdout).map_err(|e| format!("rustfmt output: {e}"))
}
