//! The replicated routing config: which sections of a node's file are
//! cluster-wide (tenants, backends, models, policies, quotas), how they are
//! cut out of a file to seed the cluster, and how a node's own sections and
//! the cluster's are put back together into one validated [`Config`].
//!
//! The cluster's config travels as TOML text of exactly the replicated
//! sections; a node merges it with the node-local sections of its own file
//! (`[node]`, `[admin]`, `[cluster]` with its members, TLS, listen
//! addresses) and validates the result exactly as at start.

use toml::Table;

use super::{Config, ConfigError};

/// The top-level keys that are replicated; everything else is node-local.
pub const REPLICATED: &[&str] = &[
    "tenants",
    "backends",
    "models",
    "prompt_tiers",
    "retry",
    "health",
    "affinity",
    "balance",
    "zones",
    "failover",
    "quotas",
    "rules",
    "shadows",
];

fn table(file: &str, text: &str) -> Result<Table, ConfigError> {
    text.parse::<Table>()
        .map_err(|e| super::syntax_error(file, text, &e))
}

fn render(file: &str, table: &Table) -> Result<String, ConfigError> {
    toml::to_string(table).map_err(|e| ConfigError {
        file: file.to_owned(),
        key: "-".into(),
        reason: format!("cannot be written back as TOML: {e}"),
    })
}

/// The replicated sections of a config text, as TOML.
pub fn cut(file: &str, text: &str) -> Result<String, ConfigError> {
    split(file, text).map(|(_, replicated)| replicated)
}

/// A config text's node-local sections (parsed) and its replicated ones
/// (as TOML), from one parse.
pub(super) fn split(file: &str, text: &str) -> Result<(Table, String), ConfigError> {
    let (replicated, local): (Table, Table) = table(file, text)?
        .into_iter()
        .partition(|(k, _)| REPLICATED.contains(&k.as_str()));
    Ok((local, render(file, &replicated)?))
}

/// A submitted replicated config: only replicated sections are allowed (a
/// node-local section in it is an error naming the key).
pub fn check_sections(file: &str, text: &str) -> Result<(), ConfigError> {
    only_replicated(file, &table(file, text)?)
}

fn only_replicated(file: &str, t: &Table) -> Result<(), ConfigError> {
    match t.keys().find(|k| !REPLICATED.contains(&k.as_str())) {
        Some(k) => Err(ConfigError {
            file: file.to_owned(),
            key: k.clone(),
            reason: format!(
                "is node-local and stays in each node's file; a replicated config holds only {}",
                REPLICATED.join(", ")
            ),
        }),
        None => Ok(()),
    }
}

/// The replicated sections whose content differs between two configs.
pub fn differing(a: &str, b: &str) -> Vec<String> {
    let (Ok(a), Ok(b)) = (a.parse::<Table>(), b.parse::<Table>()) else {
        return vec!["(unreadable)".into()];
    };
    REPLICATED
        .iter()
        .filter(|k| a.get(**k) != b.get(**k))
        .map(|k| (*k).to_owned())
        .collect()
}

impl Config {
    /// This node's file with its replicated sections replaced by
    /// `replicated` (the cluster's config `version`), validated as at
    /// start. Errors in replicated sections name `source` (e.g. "cluster
    /// config v3") as their file; relative paths still resolve against the
    /// node's file.
    pub fn with_replicated(
        &self,
        replicated: &str,
        version: u64,
        source: &str,
    ) -> Result<Config, ConfigError> {
        // One parse of the cluster's text; the node's own sections were
        // parsed when its file was read. The merged table goes to the
        // typed walk as it is, never written out and read back.
        let cluster = table(source, replicated)?;
        only_replicated(source, &cluster)?;
        let mut merged = Table::clone(&self.local);
        merged.extend(cluster);
        let mut cfg = Config::from_table(&self.file, merged).map_err(|mut e| {
            let section = e.key.split(['.', '[']).next().unwrap_or_default();
            if REPLICATED.contains(&section) {
                e.file = source.to_owned();
            }
            e
        })?;
        cfg.file.clone_from(&self.file);
        // The node's own text stays the base for the next merge.
        cfg.text = std::sync::Arc::clone(&self.text);
        cfg.local = std::sync::Arc::clone(&self.local);
        cfg.config_version = version;
        cfg.replicated = replicated.into();
        Ok(cfg)
    }

    /// The replicated sections this node routes with, as TOML.
    pub fn replicated_toml(&self) -> &str {
        &self.replicated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "data"

[[tenants]]
name = "deptA"
key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

[[backends]]
name = "a1"
zone = "az-a"
url = "http://127.0.0.1:8000"
models = ["m"]
"#;

    #[test]
    fn a_file_seeds_its_replicated_sections_and_merges_back() {
        let cfg = Config::parse("node.toml", FILE).unwrap();
        let seed = cut("node.toml", FILE).unwrap();
        assert!(
            seed.contains("[[backends]]") && !seed.contains("[node]"),
            "{seed}"
        );
        let more = format!("{seed}\n[[backends]]\nname = \"b1\"\nzone = \"az-b\"\nurl = \"http://127.0.0.1:8001\"\nmodels = [\"m\"]\n");
        let merged = cfg.with_replicated(&more, 2, "cluster config v2").unwrap();
        assert_eq!(merged.backends.len(), 2);
        assert_eq!(merged.node.id, 1, "node-local sections come from the file");
        assert_eq!(merged.config_version, 2);
        assert_eq!(differing(&seed, &more), vec!["backends".to_owned()]);
        assert!(differing(&seed, &seed).is_empty());
    }

    #[test]
    fn a_bad_replicated_config_names_its_source_key_and_reason() {
        let cfg = Config::parse("node.toml", FILE).unwrap();
        let retry = format!(
            "{}\n[retry]\nbudget_ratio = 2.0\n",
            cut("node.toml", FILE).unwrap()
        );
        let cases = [
            ("[[backends]]\nname = \"x\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:1\"\nmodels = [\"m\"]\ncolour = 1\n", "backends", "colour"),
            ("[node]\nid = 7\n", "node", "node-local"),
            (retry.as_str(), "retry.budget_ratio", "between"),
        ];
        for (text, key, reason) in cases {
            let e = cfg
                .with_replicated(text, 2, "cluster config v2")
                .unwrap_err();
            assert_eq!(e.file, "cluster config v2", "{e}");
            assert!(e.key.contains(key), "{e}");
            assert!(e.to_string().contains(reason), "{e}");
        }
    }
}
