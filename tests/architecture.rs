//! The shape of the crate, checked: module dependencies run one way, and no modules
//! import each other in a cycle.
//!
//! Layers, top down: gateway → harness → config → call → (registry, permission, audit) → server →
//! transport → protocol; `util` holds leaves anyone may use. A module may use its own
//! layer and the layers below it, never one above, and registry, permission and audit
//! do not use each other. Within the crate no two modules may depend on each other,
//! directly or through others; a module declaring and re-exporting its own children is
//! structure, not a dependency, and is left out.
//!
//! The check reads `src/` as text: `use` trees and `crate::…` / `super::…` paths in
//! code (comments and string literals are skipped). It does not expand macros.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level modules by layer: a module may depend on modules of a layer with a greater
/// or equal index (its own layer only within its own top-level module).
const LAYERS: &[&[&str]] = &[
    &["gateway"],
    &["harness"],
    &["config"],
    &["call"],
    &["registry", "permission", "audit"],
    &["server"],
    &["transport"],
    &["protocol"],
];
/// Anyone may use these; they use nothing of the crate.
const LEAVES: &[&str] = &["util"];

fn layer_of(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&top))
}

/// Module path (`a::b`) → its source text, for every file under `dir`.
fn read_modules(dir: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read src").flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                if prefix.is_empty() && name == "bin" {
                    continue;
                }
                let mut p = prefix.to_vec();
                p.push(name);
                walk(&path, &p, out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let mut p = prefix.to_vec();
                if stem != "mod" && stem != "lib" {
                    p.push(stem.to_string());
                }
                let text = std::fs::read_to_string(&path).expect("read file");
                out.insert(p.join("::"), text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &[], &mut out);
    out
}

/// Code without comments, string and char literals.
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if let Some(end) = raw_string_end(b, i) {
            i = end;
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Where the raw string literal (`r"…"`, `r#"…"#`, `br"…"`) that begins at `i` ends,
/// if one does: its quotes and slashes are text, not code.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let word_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if b[i] != b'r'
        || (word_before && !(b[i - 1] == b'b' && (i < 2 || !b[i - 2].is_ascii_alphanumeric())))
    {
        return None;
    }
    let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
    let open = i + 1 + hashes;
    if b.get(open) != Some(&b'"') {
        return None;
    }
    let mut j = open + 1;
    while j < b.len() {
        if b[j] == b'"'
            && b[j + 1..]
                .iter()
                .take(hashes)
                .filter(|c| **c == b'#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(b.len())
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_string()];
    };
    let prefix = tree[..open].trim_end_matches("::").trim();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| {
            if p == "self" {
                prefix.to_string()
            } else {
                format!("{prefix}::{p}")
            }
        })
        .collect()
}

/// Every path a module names: `use` trees, and `crate::`/`super::` paths in code.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        rest = &rest[i + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        out.extend(expand(&rest[..end]));
        rest = &rest[end..];
    }
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            out.push(code[at..at + len].trim_end_matches(':').to_string());
        }
    }
    out
}

/// The module a path names, from module `here`: the longest known module prefix.
fn resolve(here: &str, path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<&str> = if here.is_empty() {
        Vec::new()
    } else {
        here.split("::").collect()
    };
    match segments.first() {
        Some(&"crate") => {
            base.clear();
            segments.remove(0);
        }
        Some(&"super") => {
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop();
            }
        }
        Some(&"self") => {
            segments.remove(0);
        }
        Some(first) => {
            // A path relative to this module: only its own children count.
            let child = if here.is_empty() {
                first.to_string()
            } else {
                format!("{here}::{first}")
            };
            if !modules.contains(&child) {
                return None;
            }
        }
        None => return None,
    }
    let mut full: Vec<&str> = base;
    full.extend(segments);
    while !full.is_empty() {
        let candidate = full.join("::");
        if modules.contains(&candidate) {
            return Some(candidate);
        }
        full.pop();
    }
    None
}

fn is_within(module: &str, ancestor: &str) -> bool {
    ancestor.is_empty() || module == ancestor || module.starts_with(&format!("{ancestor}::"))
}

/// Module → the modules it depends on (no self edges, no edges to its own descendants).
fn graph(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (name, text) in modules {
        let mut deps = BTreeSet::new();
        for path in paths(&strip(text)) {
            if let Some(target) = resolve(name, &path, &names)
                && target != *name
                && !is_within(&target, name)
            {
                deps.insert(target);
            }
        }
        g.insert(name.clone(), deps);
    }
    g
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}

/// Imports that go up the layers, or sideways between top-level modules of one layer.
fn upward(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    for (from, deps) in g {
        let (ft, from_layer) = (top(from), layer_of(top(from)));
        for to in deps {
            let tt = top(to);
            if ft == tt || LEAVES.contains(&tt) || ft.is_empty() {
                continue;
            }
            let ok = match (from_layer, layer_of(tt)) {
                _ if LEAVES.contains(&ft) => false,
                (Some(f), Some(t)) => t > f,
                _ => false,
            };
            if !ok {
                bad.push(format!("{from} -> {to}"));
            }
        }
    }
    bad
}

/// Groups of modules that depend on each other (Tarjan's strongly connected components).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(deps) = t.g.get(v) {
            for w in deps {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut group = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                t.out.push(group);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn module_dependencies_run_one_way_and_never_in_a_cycle() {
    let modules = read_modules(Path::new("src"));
    assert!(modules.len() > 40, "read the crate's modules");
    let g = graph(&modules);
    let up = upward(&g);
    assert!(
        up.is_empty(),
        "imports against the layering:\n{}",
        up.join("\n")
    );
    let c = cycles(&g);
    assert!(c.is_empty(), "modules that import each other: {c:?}");
}

/// A public error enum can gain a variant without breaking those who match on it: each
/// says so with `#[non_exhaustive]` (an embedder's match then has a catch-all arm).
#[test]
fn public_error_enums_are_non_exhaustive() {
    let modules = read_modules(Path::new("src"));
    let mut open = Vec::new();
    let mut seen = 0;
    for (module, text) in &modules {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix("pub enum ") else {
                continue;
            };
            let name = rest.split([' ', '<', '{']).next().unwrap_or_default();
            if !name.ends_with("Error") {
                continue;
            }
            seen += 1;
            // The attributes just above the item.
            let marked = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim_start())
                .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
                .any(|l| l.trim() == "#[non_exhaustive]");
            if !marked {
                open.push(format!("{module}::{name}"));
            }
        }
    }
    assert!(seen >= 10, "found the crate's error enums ({seen})");
    assert!(
        open.is_empty(),
        "error enums without #[non_exhaustive]: {open:?}"
    );
}

/// The checker itself, on a tree shaped like the first wave's (which it must refuse).
#[test]
fn the_check_refuses_upward_imports_and_cycles() {
    let tree: BTreeMap<String, String> = [
        (
            "",
            "pub mod call; pub mod harness; pub mod server; pub mod config;",
        ),
        (
            "call",
            "use crate::harness::HarnessError; use crate::server::ServerError;",
        ),
        (
            "harness",
            "use crate::call::{Caller, run}; pub(crate) mod core; mod supervisor;",
        ),
        ("harness::core", "use super::supervisor::ServerTable;"),
        ("harness::supervisor", "use super::core::Services;"),
        (
            "server",
            "use crate::call::handler::InputMsg; use crate::config::ServerConfig;",
        ),
        ("config", "use crate::server::RestartConfig;"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let g = graph(&tree);
    let up = upward(&g);
    assert!(up.contains(&"call -> harness".to_string()), "{up:?}");
    assert!(up.contains(&"server -> call".to_string()), "{up:?}");
    assert!(up.contains(&"server -> config".to_string()), "{up:?}");
    let c = cycles(&g);
    assert!(
        c.contains(&vec![
            "harness::core".to_string(),
            "harness::supervisor".to_string()
        ]),
        "{c:?}"
    );
    assert!(
        c.iter()
            .any(|g| g.contains(&"call".to_string()) && g.contains(&"harness".to_string())),
        "{c:?}"
    );
    // And nested use trees, `self`, and `super` paths resolve.
    assert_eq!(
        expand("crate::a::{b, c::{d, self}}"),
        vec!["crate::a::b", "crate::a::c::d", "crate::a::c"]
    );
}
