//! The crate's modules depend on each other in one direction only: no
//! module reaches, through `crate::` paths, a module that reaches it back.
//!
//! A cycle (the lease importing the queue's shared state, which imported
//! the lease to build one) means two modules that cannot be read, changed
//! or tested apart; #30 asked for the ones around the hand-out to be
//! broken, and this test keeps every one broken. It reads the sources as
//! text: each `crate::name` path outside comments and unit-test modules
//! (`#[cfg(test)] mod`, which may use the whole crate) is an edge to the
//! top-level module `name` (a folder module counts as one), and a name the
//! crate root re-exports (`crate::WorkItem`) is an edge to the module it
//! comes from.
//!
//! What it cannot see: a call of a method that another module defines on
//! a type (`impl Holder` in `take.rs`, called from `drain.rs` without a
//! `use` of `take`) is no edge, and cycles among the files of one folder
//! module are not looked for.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn the_module_graph_has_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(
        graph.len() > 10,
        "too few modules read from {}: {:?}",
        src.display(),
        graph.keys()
    );
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "modules that import each other (each with what it imports of the others): {}",
        cycles
            .iter()
            .map(|c| c
                .iter()
                .map(|m| format!("{m} -> {:?}", graph[m].intersection(c).collect::<Vec<_>>()))
                .collect::<Vec<_>>()
                .join("; "))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// The checker itself finds a cycle, through a root re-export too.
#[test]
fn a_cycle_through_a_re_export_is_found() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("b")).unwrap();
    fs::write(
        dir.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\npub use b::{Thing, Other};\n",
    )
    .unwrap();
    // `a` reaches `b` through the root's re-export, `b` (a folder) reaches
    // `a` from a file inside it; `c` only reaches `a`, and names `b` in a
    // comment, in a string (with an unmatched brace, an escaped quote and a
    // `//`) and in its unit tests, which count for nothing.
    fs::write(dir.join("a.rs"), "use crate::{Thing, c as _};\n").unwrap();
    fs::write(dir.join("b/mod.rs"), "mod inner;\npub struct Thing;\n").unwrap();
    fs::write(dir.join("b/inner.rs"), "use crate::a::X;\n").unwrap();
    fs::write(
        dir.join("c.rs"),
        "// crate::b::Thing\nconst S: &str = \"{ crate::b \\\" //\";\nuse crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b::{Thing};\n}\n",
    )
    .unwrap();
    let graph = module_graph(&dir);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(graph["a"], BTreeSet::from(["b".into(), "c".into()]));
    assert_eq!(graph["c"], BTreeSet::from(["a".into()]));
    let found = cycles(&graph);
    assert_eq!(
        found,
        vec![BTreeSet::from(["a".to_string(), "b".into(), "c".into()])]
    );
}

/// Every top-level module of the crate under `src`, with the top-level
/// modules its files name through `crate::`.
fn module_graph(src: &Path) -> Graph {
    let root = strip_comments(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let exported = re_exports(&root);
    let mut graph = Graph::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let text = strip_test_modules(&strip_comments(&fs::read_to_string(&file).unwrap()));
        let deps = graph.entry(module.clone()).or_default();
        for name in crate_paths(&text) {
            let target = exported.get(&name).cloned().unwrap_or(name);
            if target != module && target != "self" {
                deps.insert(target);
            }
        }
    }
    // Edges to names that are not modules (`crate::Key`'s trait, were it
    // defined in lib.rs) are no modules' edges.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The text without `//` comments (doc comments included: their links are
/// no imports), `/* */` blocks and the contents of string literals (a
/// `{` or a `//` in a string would otherwise end a block or a line early).
/// Char literals and raw strings are not parsed: the crate has none that
/// hold a quote or a brace.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if rest.starts_with("//") {
            rest = rest.find('\n').map_or("", |i| &rest[i..]);
        } else if rest.starts_with("/*") {
            rest = rest.find("*/").map_or("", |i| &rest[i + 2..]);
        } else if let Some(string) = rest.strip_prefix('"') {
            out.push_str("\"\"");
            rest = string.get(string_end(string) + 1..).unwrap_or("");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Where the string literal whose contents `text` starts with ends (the
/// index of its closing quote), escapes skipped.
fn string_end(text: &str) -> usize {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return i,
            _ => escaped = false,
        }
    }
    text.len()
}

/// The text without its `#[cfg(test)] mod name { .. }` blocks.
fn strip_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let is_mod = after.trim_start().starts_with("mod ");
        match after.find('{') {
            Some(open) if is_mod => {
                let body = &after[open + 1..];
                rest = body.get(matching_brace(body) + 1..).unwrap_or("");
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// The first segment of every `crate::` path: `crate::a::b` gives `a`, and
/// `crate::{a::b, C}` gives `a` and `C`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `mycrate::`, not ours.
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            names.extend(
                top_level_items(&group[..end])
                    .into_iter()
                    .filter_map(first_segment),
            );
            rest = &group[end..];
        } else if let Some(name) = first_segment(rest) {
            names.push(name);
        }
    }
    names
}

/// Where the group that `text` opens inside ends (the index of its `}`).
fn matching_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// The comma-separated items of a `use` group, nested groups kept whole.
fn top_level_items(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// What the crate root re-exports, by name: `pub use queue::WorkQueue;`
/// maps `WorkQueue` to `queue`.
fn re_exports(root: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in root.split(';') {
        let stmt = stmt.trim();
        let Some(path) = stmt
            .strip_prefix("pub use ")
            .or_else(|| stmt.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let path = path.trim().trim_start_matches("crate::");
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        let names = match rest.trim().strip_prefix('{') {
            Some(group) => top_level_items(&group[..matching_brace(group)]),
            None => vec![rest],
        };
        for item in names {
            // `a::B`, `B as C`, or `B`: the name it is known by at the root.
            let item = item.trim();
            let name = item.rsplit(" as ").next().unwrap_or(item);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            if !name.is_empty() {
                map.insert(name.to_string(), module.to_string());
            }
        }
    }
    map
}

/// The strongly connected groups of more than one module (Tarjan's).
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in &self.graph[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    group.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}
