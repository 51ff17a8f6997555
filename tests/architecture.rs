//! The layering of `src/` (DESIGN §2, README "Layout"), held by reading the
//! source: every `crate::<module>` path outside comments is an import of
//! that top-level module. The rules:
//!
//! - a module imports only modules of a lower layer (so no import cycles);
//! - protobuf types (`crate::proto`) appear only at the edges: `service`,
//!   the peer codec under `cluster::peers`, and the CLI;
//! - `service` reaches state only through the `Limiter`, never `store`.
//!
//! `PENDING` lists the violations that issue 22 is removing, one by one: a
//! violation not listed fails the test (naming the file and the line), and
//! so does a listed one that no longer occurs (remove it from the list).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first; modules of one layer may not
/// import each other.
const LAYERS: &[&[&str]] = &[
    &["algorithm", "verdict"],
    &["clock", "proto", "tls"],
    &["metrics", "store"],
    &["lease", "tiered"],
    &["config"],
    &["policy"],
    &["cluster"],
    &["limiter"],
    &["service"],
    &["server"],
    &["cli", "fuzzing"],
];

/// Files that may name protobuf types (prefixes of paths under `src/`).
const PROTO_AT: &[&str] = &["proto", "service/", "cluster/peers", "cli/", "fuzzing"];

/// Today's violations, as `(file, imported module)`: issue 22 removes them.
const PENDING: &[(&str, &str)] = &[
    ("limiter/forward.rs", "proto"),
    ("limiter/replicate.rs", "proto"),
    ("limiter/reports.rs", "proto"),
    ("limiter/tiered.rs", "proto"),
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The peer protocol's number: a constant every layer may read (it is
/// gossiped, configured and checked), not a protobuf type.
const PROTOCOL_NUMBER: &str = "crate::proto::PEER_PROTOCOL_VERSION";

/// `(line, module)` for each `crate::<module>` outside comments.
fn imports(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line
            .split("//")
            .next()
            .unwrap_or("")
            .replace(PROTOCOL_NUMBER, "");
        let code = code.as_str();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn every_import_goes_down_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong: Vec<String> = Vec::new();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for path in &files {
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "lib.rs" || rel == "main.rs" {
            continue;
        }
        let module = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        let from = layer(&module)
            .unwrap_or_else(|| panic!("src/{rel}: module `{module}` is in no layer of LAYERS"));
        let text = std::fs::read_to_string(path).unwrap();
        for (line, target) in imports(&text) {
            if target == module {
                continue;
            }
            let Some(to) = layer(&target) else {
                continue; // not a module (a macro path, say)
            };
            graph
                .entry(module.clone())
                .or_default()
                .insert(target.clone());
            let mut why = Vec::new();
            if to >= from {
                why.push(format!(
                    "`{module}` (layer {from}) imports `{target}` (layer {to}): only lower layers"
                ));
            }
            if target == "proto" && !PROTO_AT.iter().any(|p| rel.starts_with(p)) {
                why.push("protobuf types only in service, cluster::peers and the CLI".into());
            }
            if module == "service" && target == "store" {
                why.push("service reaches state only through the Limiter".into());
            }
            if why.is_empty() {
                continue;
            }
            seen.insert((rel.clone(), target.clone()));
            if !PENDING.contains(&(rel.as_str(), target.as_str())) {
                wrong.push(format!(
                    "src/{rel}:{line}: crate::{target} — {}",
                    why.join("; ")
                ));
            }
        }
    }
    let stale: Vec<_> = PENDING
        .iter()
        .filter(|(f, t)| !seen.contains(&(f.to_string(), t.to_string())))
        .collect();
    assert!(
        wrong.is_empty(),
        "imports that break the layering:\n{}",
        wrong.join("\n")
    );
    assert!(stale.is_empty(), "fixed — remove from PENDING: {stale:?}");
    // With every edge pointing down a layer there is no cycle; name any
    // that the PENDING exceptions still close, so they are not forgotten.
    let cycles = cycles(&graph);
    println!("module graph: {graph:?}\ncycles left (PENDING): {cycles:?}");
}

/// Strongly connected components of more than one module.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for n in &nodes {
        let scc: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reaches[*n].contains(**m) && reaches[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

#[test]
fn the_scanner_finds_imports_and_skips_comments() {
    let text = "use crate::store::Store;\n// crate::service in a comment\nlet x = crate::limiter::Mode::Exact; // crate::cli\n";
    assert_eq!(
        imports(text),
        vec![(1, "store".to_string()), (3, "limiter".to_string())]
    );
}
