//! The layering of `src/` (DESIGN §2, docs/src/design.md), held by reading the
//! source: every `crate::<module>` path outside comments is an import of
//! that top-level module. The rules:
//!
//! - a module imports only modules of a lower layer (so no import cycles);
//! - protobuf types (`crate::proto`) appear only at the edges: `service`,
//!   the peer codec under `cluster::peers`, and the CLI;
//! - `service` reaches state only through the `Limiter`, never `store`.
//!
//! A violation fails the test, naming the file and the line;
//! `the_rules_catch_the_old_violations` holds that each import that once
//! tangled the tree (issue 22) would be caught again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first; modules of one layer may not
/// import each other.
const LAYERS: &[&[&str]] = &[
    &["algorithm", "verdict"],
    &["clock", "net", "proto", "threads", "tls"],
    &["metrics", "store"],
    &["lease"],
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

/// The layering broken by `files` (`(path under src/, text)`): one line
/// per offending import, and the import graph between top-level modules.
fn check(files: &[(String, String)]) -> (Vec<String>, BTreeMap<String, BTreeSet<String>>) {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong: Vec<String> = Vec::new();
    for (rel, text) in files {
        if rel == "lib.rs" || rel == "main.rs" {
            continue;
        }
        let module = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        let Some(from) = layer(&module) else {
            wrong.push(format!(
                "src/{rel}: module `{module}` is in no layer of LAYERS"
            ));
            continue;
        };
        for (line, target) in imports(text) {
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
            if !why.is_empty() {
                wrong.push(format!(
                    "src/{rel}:{line}: crate::{target} — {}",
                    why.join("; ")
                ));
            }
        }
    }
    (wrong, graph)
}

#[test]
fn every_import_goes_down_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|path| {
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, std::fs::read_to_string(path).unwrap())
        })
        .collect();
    let (wrong, graph) = check(&files);
    assert!(
        wrong.is_empty(),
        "imports that break the layering:\n{}",
        wrong.join("\n")
    );
    // Every edge points down a layer, so this holds by construction; it
    // is asserted so that a change to the rules above cannot let one in.
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "import cycles: {cycles:?}");
}

/// Each import that tangled the tree before issue 22, as it was written.
const OLD_VIOLATIONS: &[(&str, &str)] = &[
    ("config.rs", "use crate::policy::Policies;"),
    ("policy/mod.rs", "use crate::limiter::Mode;"),
    ("metrics.rs", "use crate::limiter::Reason;"),
    (
        "cluster/peers.rs",
        "use crate::metrics::Metrics; use crate::service::wire;",
    ),
    ("config.rs", "use crate::service::headers::Family;"),
    ("config.rs", "use crate::cluster::auth::Secret;"),
    (
        "cluster/wire.rs",
        "use crate::service::wire::algorithm_to_wire;",
    ),
    ("service/grpc.rs", "use crate::server::StartError;"),
    ("service/admin.rs", "use crate::store::TopBy;"),
    ("limiter/owner.rs", "use crate::proto::peer as pb;"),
    (
        "limiter/fallback.rs",
        "let x = crate::proto::peer::TieredAsk { demand, unused };",
    ),
    ("metrics.rs", "use crate::cluster::breaker::State;"),
    ("store/mod.rs", "use crate::cluster::ring::Ring;"),
    ("algorithm/mod.rs", "use crate::clock::Clock;"),
];

#[test]
fn the_rules_catch_the_old_violations() {
    for (rel, text) in OLD_VIOLATIONS {
        let (wrong, _) = check(&[(rel.to_string(), text.to_string())]);
        assert!(!wrong.is_empty(), "src/{rel}: `{text}` was not caught");
        assert!(
            wrong[0].starts_with(&format!("src/{rel}:1: ")),
            "the message names the file and line: {wrong:?}"
        );
    }
    // And the cycle finder finds a cycle the layers would forbid.
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.insert("service".into(), ["server".to_string()].into());
    graph.insert("server".into(), ["service".to_string()].into());
    assert_eq!(
        cycles(&graph),
        vec![["server".to_string(), "service".to_string()].into()]
    );
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
