//! The configuration reference: every setting as commented TOML — its doc
//! comment, its environment variable, its default — printed by `sluice
//! config defaults` and checked in as `docs/src/config-defaults.toml`.
//!
//! Built from the config types themselves so it cannot drift: the fields
//! and their doc comments come from the source (`build.rs` parses
//! `config.rs` and `tls.rs`), the defaults from `Config::default()`
//! serialized as a config file is read. A field without a doc line fails a
//! test below.

use super::{Config, PolicyConfig};

/// `(struct, field, type, doc)`, in declaration order.
const FIELDS: &[(&str, &str, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/config_fields.rs"));

/// The defaults the reference shows: `Config::default()`, with `node_id`
/// not read from this machine's `HOSTNAME` (its doc says so).
pub fn reference_defaults() -> Config {
    Config {
        node_id: "sluice".into(),
        ..Config::default()
    }
}

/// The reference, as `sluice config defaults` prints it. Lines setting a
/// value are live TOML (the file loads as the defaults); everything else is
/// a comment.
pub fn reference() -> String {
    let value = toml::Value::try_from(reference_defaults()).expect("the config serializes");
    let mut out = String::from(
        "# Sluice's settings, each with its default: `sluice config defaults`.\n\
         # A file passed with --config overrides these, SLUICE_* environment\n\
         # variables override the file (nested keys joined by `__`), and flags\n\
         # override both. Lines without `#` set a default; loading this file as\n\
         # it is changes nothing.\n",
    );
    table(&mut out, "Config", &[], Some(&value), false);
    out
}

fn fields(
    ty: &str,
) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str, &'static str)> {
    FIELDS.iter().filter(move |f| f.0 == ty)
}

fn is_struct(ty: &str) -> bool {
    FIELDS.iter().any(|f| f.0 == ty)
}

/// `Option<T>` → `T`.
fn inner(ty: &str) -> &str {
    ty.strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty)
}

/// `BTreeMap<String, T>` → `T`.
fn map_of(ty: &str) -> Option<&str> {
    ty.strip_prefix("BTreeMap<String, ")
        .and_then(|t| t.strip_suffix('>'))
}

/// What a value of a field's type is written as, in words.
fn kind(ty: &str) -> &'static str {
    match inner(ty) {
        "String" | "PathBuf" => "a string",
        "u64" | "usize" | "u32" | "i64" => "an integer",
        "f64" => "a number",
        "bool" => "true or false",
        "Duration" => "a duration, e.g. \"250ms\", \"5s\", \"1h\"",
        "SocketAddr" => "an address, \"host:port\"",
        "ByteSize" => "bytes: an integer, or a string like \"512MiB\"",
        "Vec<String>" => "a list of strings",
        "LogFormat" => "\"text\" or \"json\"",
        _ => "a value",
    }
}

fn env(path: &[&str]) -> String {
    format!("SLUICE_{}", path.join("__").to_uppercase())
}

fn doc(out: &mut String, text: &str) {
    for line in text.lines() {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            out.push_str(&format!("# {line}\n"));
        }
    }
}

/// The fields of struct `ty` at `path`: its values first (TOML wants a
/// table's keys before its sub-tables), then its tables. `value`: the
/// defaults of this table, if it has any; `commented`: the table is not
/// set by default, so none of it is live.
fn table(out: &mut String, ty: &str, path: &[&str], value: Option<&toml::Value>, commented: bool) {
    let get = |name: &str| value.and_then(|v| v.get(name));
    for &(_, name, fty, text) in fields(ty) {
        if is_struct(inner(fty)) || map_of(fty).is_some_and(is_struct) {
            continue;
        }
        let at: Vec<&str> = path.iter().copied().chain([name]).collect();
        out.push('\n');
        doc(out, text);
        match get(name) {
            Some(v) if !commented => {
                out.push_str(&format!("# ({}; {})\n", kind(fty), env(&at)));
                out.push_str(&format!("{name} = {v}\n"));
            }
            Some(v) => out.push_str(&format!(
                "# ({}; {})\n# {name} = {v}\n",
                kind(fty),
                env(&at)
            )),
            None if fty.starts_with("Option<") => out.push_str(&format!(
                "# {name}: optional ({}; {})\n",
                kind(fty),
                env(&at)
            )),
            None => out.push_str(&format!(
                "# {name}: required ({}; {})\n",
                kind(fty),
                env(&at)
            )),
        }
    }
    for &(_, name, fty, text) in fields(ty) {
        let at: Vec<&str> = path.iter().copied().chain([name]).collect();
        if let Some(entry) = map_of(fty).filter(|t| is_struct(t)) {
            let defaults = (entry == "PolicyConfig")
                .then(|| toml::Value::try_from(PolicyConfig::default()).expect("serializes"));
            out.push('\n');
            doc(out, text);
            out.push_str(&format!(
                "# [{}.NAME]  (one table per entry; {}__NAME__…)\n",
                at.join("."),
                env(&at)
            ));
            let named: Vec<&str> = at.iter().copied().chain(["NAME"]).collect();
            table(out, entry, &named, defaults.as_ref(), true);
        } else if is_struct(inner(fty)) {
            let sub = get(name);
            let off = commented || sub.is_none();
            out.push('\n');
            doc(out, text);
            out.push_str(&format!(
                "{}[{}]\n",
                if off { "# " } else { "" },
                at.join(".")
            ));
            table(out, inner(fty), &at, sub, off);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config types a config file reaches, from `Config` down.
    fn reachable() -> Vec<&'static str> {
        let mut seen = vec!["Config"];
        let mut i = 0;
        while i < seen.len() {
            for &(_, _, fty, _) in fields(seen[i]) {
                let t = map_of(fty).unwrap_or(inner(fty));
                let t = FIELDS.iter().find(|f| f.0 == t).map(|f| f.0);
                if let Some(t) = t.filter(|t| !seen.contains(t)) {
                    seen.push(t);
                }
            }
            i += 1;
        }
        seen
    }

    fn settings()
    -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str, &'static str)> {
        let types = reachable();
        FIELDS.iter().filter(move |f| types.contains(&f.0))
    }

    #[test]
    fn the_reference_covers_the_config_types_and_no_others() {
        let types = reachable();
        for t in [
            "Config",
            "Limits",
            "AdminConfig",
            "ClusterConfig",
            "ClientAllotments",
            "PeerTls",
            "EnvoyConfig",
            "ApiTls",
            "PolicyConfig",
        ] {
            assert!(types.contains(&t), "{t} unreached: {types:?}");
        }
        assert!(
            !types.contains(&"TlsError") && !types.contains(&"Sources"),
            "{types:?}"
        );
    }

    #[test]
    fn every_setting_has_a_doc_line() {
        let bare: Vec<String> = settings()
            .filter(|f| f.3.trim().is_empty())
            .map(|f| format!("{}.{}", f.0, f.1))
            .collect();
        assert!(
            bare.is_empty(),
            "config fields without a doc comment: {bare:?}"
        );
    }

    #[test]
    fn the_reference_loads_as_the_defaults() {
        let loaded: Config = toml::from_str(&reference()).expect("the reference is TOML");
        assert_eq!(loaded, reference_defaults());
    }

    #[test]
    fn the_reference_names_every_setting() {
        let text = reference();
        for &(ty, name, _, _) in settings() {
            assert!(
                text.contains(&format!("{name} ="))
                    || text.contains(&format!("{name}:"))
                    || text.contains(&format!("{name}]"))
                    || text.contains(&format!("{name}.NAME]")),
                "{ty}.{name} is missing from the reference"
            );
        }
    }

    #[test]
    fn the_checked_in_reference_is_current() {
        let checked_in = include_str!("../../docs/src/config-defaults.toml");
        assert!(
            checked_in == reference(),
            "docs/src/config-defaults.toml is stale: run \
             `cargo run --release -- config defaults > docs/src/config-defaults.toml`"
        );
    }
}
