//! `zonegate ctl config`: the replicated routing config through
//! `GET|POST /admin/v1/config`: show a version, diff a file against the
//! current one, apply a file (validated on the leader; `--dry-run` names
//! the rules it would trip and what would move), roll back to a kept
//! version, and list the kept versions. Exit codes as every `ctl` verb.

use std::path::PathBuf;

use anyhow::Context as _;
use reqwest::Method;
use serde_json::{json, Value};

use super::ctl::{Api, CtlFailure, EXIT_USAGE};
use crate::config::replicated;

/// `ctl config VERB`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigCmd {
    #[command(subcommand)]
    pub op: ConfigOp,
}

/// What to do with the replicated config.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigOp {
    /// Print the TOML of the current (or a kept) config version.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 config show\n  zonegate ctl --admin http://127.0.0.1:9090 config show --version 3 > v3.toml"
    )]
    Show {
        /// A kept version instead of the current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// A readable diff of FILE's replicated sections against the current
    /// config (FILE may be a whole node file: only its replicated sections
    /// count).
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 config diff gateway.toml"
    )]
    Diff {
        /// The config file to compare (a node file or replicated sections).
        file: PathBuf,
    },
    /// Validate FILE on the leader and commit its replicated sections as
    /// the next config version.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 config apply gateway.toml --dry-run\n  zonegate ctl --admin http://127.0.0.1:9090 config apply gateway.toml --if-version 4 --reason 'add az-c backends'"
    )]
    Apply {
        /// The config file to apply (a node file or replicated sections).
        file: PathBuf,
        #[command(flatten)]
        opts: ApplyOpts,
    },
    /// Commit a copy of kept version V as the next config version.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 config rollback --to 3 --dry-run\n  zonegate ctl --admin http://127.0.0.1:9090 config rollback --to 3 --reason 'v4 broke routing'"
    )]
    Rollback {
        /// The kept version whose config becomes the next version.
        #[arg(long = "to")]
        to: u64,
        #[command(flatten)]
        opts: ApplyOpts,
    },
    /// The kept config versions, newest first.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 config history"
    )]
    History,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ApplyOpts {
    /// Refuse unless the cluster is at this config version.
    #[arg(long)]
    if_version: Option<u64>,
    /// Show what would move and the rules it would trip; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Commit even when a safety rule would refuse it.
    #[arg(long)]
    force: bool,
    /// Why, for the decision history and the audit log.
    #[arg(long)]
    reason: Option<String>,
}

fn usage(message: String) -> anyhow::Error {
    anyhow::Error::new(CtlFailure {
        exit: EXIT_USAGE,
        message,
    })
}

/// The replicated sections of a file, as the cluster would hold them.
fn sections_of(file: &PathBuf) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read {}", file.display()))
        .map_err(|e| usage(format!("{e:#}")))?;
    replicated::cut(&file.display().to_string(), &text).map_err(|e| usage(e.to_string()))
}

pub(crate) async fn run(api: &Api, json_out: bool, cmd: ConfigCmd) -> anyhow::Result<()> {
    let out = |v: &Value, human: String| {
        if json_out {
            println!("{v}");
        } else {
            print!("{human}");
        }
    };
    match cmd.op {
        ConfigOp::Show { version } => {
            let path = version.map_or_else(
                || "/admin/v1/config".to_owned(),
                |v| format!("/admin/v1/config?version={v}"),
            );
            let v = api.call(Method::GET, &path, None).await?;
            out(&v, v["toml"].as_str().unwrap_or_default().to_owned());
        }
        ConfigOp::Diff { file } => {
            let mine = sections_of(&file)?;
            let v = api.call(Method::GET, "/admin/v1/config", None).await?;
            let theirs = v["toml"].as_str().unwrap_or_default();
            let diff = similar::TextDiff::from_lines(theirs, mine.as_str())
                .unified_diff()
                .header(
                    &format!("cluster config v{}", v["routing_with"]),
                    &file.display().to_string(),
                )
                .to_string();
            let human = if diff.is_empty() {
                "no difference\n".to_owned()
            } else {
                diff.clone()
            };
            out(&json!({"diff": diff}), human);
        }
        ConfigOp::Apply { file, opts } => {
            let body = json!({"toml": sections_of(&file)?});
            submit(api, out, body, &opts).await?;
        }
        ConfigOp::Rollback { to, opts } => {
            submit(api, out, json!({"rollback_to": to}), &opts).await?;
        }
        ConfigOp::History => {
            let v = api.call(Method::GET, "/admin/v1/config", None).await?;
            let now = crate::clock::unix_ms();
            let mut human = String::from("VERSION  AT (UTC)\n");
            for h in v["history"].as_array().into_iter().flatten() {
                human.push_str(&format!(
                    "{:<8} {}  {}: {}\n",
                    h["version"],
                    super::ctl::render::when(h["at_ms"].as_u64().unwrap_or(0), now),
                    h["actor"].as_str().unwrap_or("-"),
                    h["reason"].as_str().unwrap_or("-")
                ));
            }
            out(&v["history"], human);
        }
    }
    Ok(())
}

async fn submit(
    api: &Api,
    out: impl Fn(&Value, String),
    mut body: Value,
    opts: &ApplyOpts,
) -> anyhow::Result<()> {
    body["dry_run"] = json!(opts.dry_run);
    body["force"] = json!(opts.force);
    if let Some(v) = opts.if_version {
        body["if_version"] = json!(v);
    }
    if let Some(r) = &opts.reason {
        body["reason"] = json!(r);
    }
    let v = api
        .call(Method::POST, "/admin/v1/config", Some(body))
        .await?;
    let human = if v["dry_run"] == true {
        plan(&v)
    } else {
        format!(
            "committed: config version {} (decision version {})\n",
            v["config_version"], v["version"]
        )
    };
    out(&v, human);
    Ok(())
}

fn plan(v: &Value) -> String {
    let p = &v["plan"];
    let mut s = format!(
        "dry run: config version {} would {}\n",
        v["config_version"],
        if v["would_apply"] == true {
            "apply"
        } else {
            "be refused"
        }
    );
    let sections: Vec<&str> = p["sections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    s.push_str(&format!(
        "sections changed: {}\n",
        if sections.is_empty() {
            "none".to_owned()
        } else {
            sections.join(", ")
        }
    ));
    for (sign, key) in [("+", "added"), ("-", "removed")] {
        for (pool, names) in p[key].as_object().into_iter().flatten() {
            for n in names.as_array().into_iter().flatten() {
                s.push_str(&format!("  {sign} {pool}: {}\n", n.as_str().unwrap_or("?")));
            }
        }
    }
    for r in p["rules"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "  rule {}: {}\n",
            r["rule"].as_str().unwrap_or("?"),
            r["message"].as_str().unwrap_or("")
        ));
    }
    s
}
