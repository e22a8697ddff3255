//! The configuration reference (`docs/src/configuration.md`) names every
//! key the raw config types accept, so it cannot drift: a key added to a
//! `deny_unknown_fields` type without a reference entry fails here.

use super::bounds::tests::every_key;

/// The reference's spelling of a walked key: `backends[0].weight` is
/// `backends[].weight`, the walk's zone `az-a` in a map is `<zone>`.
fn reference_name(key: &str) -> String {
    key.replace("[0]", "[]")
        .split('.')
        .map(|seg| if seg == "az-a" { "<zone>" } else { seg })
        .collect::<Vec<_>>()
        .join(".")
}

#[test]
fn configuration_reference_names_every_config_key() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/configuration.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let keys = every_key();
    assert!(keys.len() > 100, "the walk found only {keys:?}");
    let missing: Vec<String> = keys
        .iter()
        .map(|k| reference_name(k))
        .filter(|k| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "{} lacks a row for these config keys (a table row each, the key in backticks):\n{}",
        path.display(),
        missing.join("\n")
    );
}

#[test]
fn configuration_reference_names_no_key_the_config_lacks() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/configuration.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let keys: Vec<String> = every_key().iter().map(|k| reference_name(k)).collect();
    // A row's first cell: `| `key` | ...`.
    let rows: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(k, _)| k))
        .collect();
    assert!(rows.len() >= keys.len(), "only {} rows", rows.len());
    let stale: Vec<&str> = rows
        .into_iter()
        .filter(|r| !keys.iter().any(|k| k == r))
        .collect();
    assert!(
        stale.is_empty(),
        "{} has rows for keys the config types do not accept:\n{}",
        path.display(),
        stale.join("\n")
    );
}
