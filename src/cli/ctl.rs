//! `zonegate ctl`: the operators' client for the admin API. Tables for
//! people, `--json` for scripts; a refused decision exits non-zero with the
//! safety rule's name in the message.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

mod render;
pub use render::render;

/// One `ctl` verb and its arguments.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Verb {
    /// Cluster status: leader, term, decision version, zones, nodes.
    Status,
    /// Backends as this node sees them.
    Backends,
    /// The decision history, newest first.
    Decisions {
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Move the traffic homed in one zone to another.
    Failover {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[command(flatten)]
        opts: DecideOpts,
    },
    /// Give a failed-over zone its own traffic back.
    Failback {
        #[arg(long)]
        zone: String,
        #[command(flatten)]
        opts: DecideOpts,
    },
    /// Stop automatic decisions (operators still decide).
    Freeze {
        #[arg(long)]
        reason: Option<String>,
    },
    /// Allow automatic decisions again.
    Unfreeze {
        #[arg(long)]
        reason: Option<String>,
    },
}

/// What every zone decision takes besides its zones.
#[derive(Debug, Clone, clap::Args)]
pub struct DecideOpts {
    /// Why, for the decision history and the audit log.
    #[arg(long)]
    reason: Option<String>,
    /// Refuse unless the current decision version is this one.
    #[arg(long)]
    if_version: Option<u64>,
    /// Show what would move, or which rule would refuse it.
    #[arg(long)]
    dry_run: bool,
}

/// Runs one verb against `admin` (a URL like `http://127.0.0.1:9090`).
/// Prints the result; an error names why (and the rule, for a refusal).
pub async fn run(
    admin: &str,
    token: Option<&str>,
    json_out: bool,
    verb: Verb,
) -> anyhow::Result<()> {
    let admin = admin.trim_end_matches('/');
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build an HTTP client")?;
    let (method, path, body) = request_of(&verb);
    let mut req = client.request(method, format!("{admin}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach {admin}"))?;
    let status = resp.status();
    let text = resp.text().await.context("the answer was cut off")?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|_| anyhow!("{admin} answered {status} with a non-JSON body: {text}"))?;
    if !status.is_success() {
        let err = &value["error"];
        let code = err["code"].as_str().unwrap_or("error");
        let message = err["message"].as_str().unwrap_or(&text);
        if json_out {
            println!("{value}");
        }
        if message.contains(code) {
            bail!("{message} (HTTP {status})");
        }
        bail!("{code}: {message} (HTTP {status})");
    }
    if json_out {
        println!("{value}");
    } else {
        print!("{}", render(&verb, &value));
    }
    Ok(())
}

fn request_of(verb: &Verb) -> (reqwest::Method, String, Option<Value>) {
    use reqwest::Method;
    match verb {
        Verb::Status => (Method::GET, "/admin/v1/cluster".into(), None),
        Verb::Backends => (Method::GET, "/admin/v1/backends".into(), None),
        Verb::Decisions { limit } => (
            Method::GET,
            format!("/admin/v1/decisions?limit={limit}"),
            None,
        ),
        Verb::Failover { from, to, opts } => (
            Method::POST,
            "/admin/v1/failover".into(),
            Some(opts.body(json!({"from": from, "to": to}))),
        ),
        Verb::Failback { zone, opts } => (
            Method::POST,
            "/admin/v1/failback".into(),
            Some(opts.body(json!({"zone": zone}))),
        ),
        Verb::Freeze { reason } => (
            Method::POST,
            "/admin/v1/freeze".into(),
            Some(json!({"reason": reason})),
        ),
        Verb::Unfreeze { reason } => (
            Method::POST,
            "/admin/v1/unfreeze".into(),
            Some(json!({"reason": reason})),
        ),
    }
}

impl DecideOpts {
    fn body(&self, mut zones: Value) -> Value {
        zones["reason"] = json!(self.reason);
        zones["if_version"] = json!(self.if_version);
        zones["dry_run"] = json!(self.dry_run);
        zones
    }
}
