//! `zonegate ctl`: the operators' client for the admin API. Tables for
//! people, `--json` for scripts; a refused decision exits non-zero with the
//! safety rule's name in the message.
//!
//! Exit codes (DESIGN §5): 0 done; 1 refused (a safety rule, or a definite
//! "nothing was written" such as no leader); 2 bad usage, or the admin API
//! could not be reached before anything was sent; 3 outcome unknown (a
//! write that may have committed: check `zonegate ctl decisions`).

use std::time::Duration;

use anyhow::Context;
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
    /// Members: list, add, remove, promote, readdress (src/cli/members.rs).
    Members(super::members::Members),
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

/// A `ctl` failure with the exit code it maps to; `main` exits with
/// [`exit_code`] of the error chain.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CtlFailure {
    pub exit: u8,
    pub message: String,
}

/// Refused, or nothing was written.
pub const EXIT_REFUSED: u8 = 1;
/// Bad usage, or nothing was sent.
pub const EXIT_USAGE: u8 = 2;
/// A write that may have committed.
pub const EXIT_OUTCOME_UNKNOWN: u8 = 3;

/// The process exit code for an error `run` returned (1 for any other).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    e.downcast_ref::<CtlFailure>()
        .map_or(EXIT_REFUSED, |f| f.exit)
}

fn fail(exit: u8, message: String) -> anyhow::Error {
    anyhow::Error::new(CtlFailure { exit, message })
}

/// Runs one verb against `admin` (a URL like `http://127.0.0.1:9090`).
/// Prints the result; an error names why (and the rule, for a refusal).
pub async fn run(
    admin: &str,
    token: Option<&str>,
    json_out: bool,
    verb: Verb,
) -> anyhow::Result<()> {
    if let Verb::Members(m) = verb {
        return super::members::run(admin, token, json_out, m).await;
    }
    let admin = admin.trim_end_matches('/');
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build an HTTP client")?;
    let (method, path, body) = request_of(&verb);
    let mut req = client.request(method.clone(), format!("{admin}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let writes = method == reqwest::Method::POST;
    let check = format!("check `zonegate ctl --admin {admin} decisions` before retrying");
    let resp = match req.send().await {
        Ok(resp) => resp,
        // Nothing left this machine: safe to retry.
        Err(e) if e.is_connect() || e.is_builder() || !writes => {
            return Err(fail(
                EXIT_USAGE,
                format!("cannot reach {admin}: {e}; nothing was sent"),
            ))
        }
        Err(e) => {
            return Err(fail(
                EXIT_OUTCOME_UNKNOWN,
                format!("outcome unknown: the write was sent to {admin} but its answer was lost ({e}); it may have committed: {check}"),
            ))
        }
    };
    let status = resp.status();
    let text = match resp.text().await {
        Ok(text) => text,
        Err(e) if writes => {
            return Err(fail(
                EXIT_OUTCOME_UNKNOWN,
                format!("outcome unknown: the answer from {admin} was cut off ({e}); the write may have committed: {check}"),
            ))
        }
        Err(e) => return Err(fail(EXIT_USAGE, format!("the answer from {admin} was cut off: {e}"))),
    };
    let value: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => {
            let exit = if writes && (status.is_server_error() || status.is_success()) {
                EXIT_OUTCOME_UNKNOWN
            } else {
                EXIT_REFUSED
            };
            return Err(fail(
                exit,
                format!("{admin} answered {status} with a non-JSON body: {text}"),
            ));
        }
    };
    if !status.is_success() {
        let err = &value["error"];
        let code = err["code"].as_str().unwrap_or("error");
        let message = err["message"].as_str().unwrap_or(&text);
        if json_out {
            println!("{value}");
        }
        let message = if message.contains(code) {
            format!("{message} (HTTP {status})")
        } else {
            format!("{code}: {message} (HTTP {status})")
        };
        if code == "outcome_unknown" || status == reqwest::StatusCode::GATEWAY_TIMEOUT {
            let version = err["check_version"]
                .as_u64()
                .map(|v| format!(" (look for version {v} or later with this reason)"))
                .unwrap_or_default();
            return Err(fail(
                EXIT_OUTCOME_UNKNOWN,
                format!("{message}\nthe write may have committed: {check}{version}"),
            ));
        }
        let exit = if status == reqwest::StatusCode::BAD_REQUEST {
            EXIT_USAGE
        } else {
            EXIT_REFUSED
        };
        return Err(fail(exit, message));
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
        Verb::Members(m) => super::members::request_of(m),
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
