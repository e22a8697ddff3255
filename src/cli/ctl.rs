//! `zonegate ctl`: the operators' client for the admin API. Tables for
//! people, `--json` for scripts; a refused decision exits non-zero with the
//! safety rule's name in the message.
//!
//! Exit codes (DESIGN §5): 0 done; 1 refused (a safety rule, or a definite
//! "nothing was written" such as no leader); 2 bad usage, or the admin API
//! could not be reached before anything was sent; 3 outcome unknown (a
//! write that may have committed: check `zonegate ctl decisions`); 4 the
//! admin token was missing or rejected (nothing was done).

use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

pub(crate) mod render;
mod watch;
pub use render::{human_ms, render, when};

/// One `ctl` verb and its arguments.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Verb {
    /// Cluster status: leader, term, decision version, zones (with what the
    /// automation will do next, and when dwell lets it), per-zone traffic
    /// (asked of the leader: requests/s, share, errors), nodes, and the
    /// last decision.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 status\n  zonegate ctl status --admin https://gw-a.internal:9090 --json"
    )]
    Status,
    /// Backends as this node sees them.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 backends\n  zonegate ctl backends --json | jq '.backends[] | select(.state != \"healthy\")'"
    )]
    Backends,
    /// Tenants' quotas: global limits, zone shares, each node's allocation
    /// (overflow after a failover, and why a node holds another zone's),
    /// this node's usage, decision version.
    #[command(after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 quotas")]
    Quotas,
    /// The decision history, newest first: zone decisions (failover,
    /// failback, freeze, unfreeze); `--all` adds the quota rebalances.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 decisions --limit 5\n  zonegate ctl decisions --all --json"
    )]
    Decisions {
        /// How many decisions to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Also the leader's quota rebalances (kept in their own, shorter
        /// history), merged by version.
        #[arg(long)]
        all: bool,
    },
    /// Move the traffic homed in one zone to another.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 failover --from az-b --dry-run\n  zonegate ctl --admin http://127.0.0.1:9090 failover --from az-b --to az-a --reason 'az-b GPUs failing' --yes"
    )]
    Failover {
        /// The zone whose traffic moves away.
        #[arg(long)]
        from: String,
        /// The zone that takes it; without it, the zone the leader's
        /// detector would pick (the healthiest active zone).
        #[arg(long)]
        to: Option<String>,
        #[command(flatten)]
        opts: DecideOpts,
    },
    /// Give a failed-over zone its own traffic back.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 failback --zone az-b --dry-run\n  zonegate ctl --admin http://127.0.0.1:9090 failback --zone az-b --reason 'az-b repaired' --yes"
    )]
    Failback {
        /// The failed-over zone that takes its own traffic back.
        #[arg(long)]
        zone: String,
        #[command(flatten)]
        opts: DecideOpts,
    },
    /// Stop automatic decisions (operators still decide).
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 freeze --reason 'maintenance in az-c'"
    )]
    Freeze {
        /// Why, for the decision history and the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Allow automatic decisions again.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 unfreeze --reason 'maintenance done'"
    )]
    Unfreeze {
        /// Why, for the decision history and the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Members: list, add, remove, promote, readdress.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 members\n  zonegate ctl --admin http://127.0.0.1:9090 members add --id 4 --zone az-a --raft 10.0.1.4:7070 --member-admin 10.0.1.4:9090 --role voter"
    )]
    Members(super::members::Members),
    /// The replicated routing config: show, diff, apply, rollback, history.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 config show\n  zonegate ctl --admin http://127.0.0.1:9090 config apply gateway.toml --dry-run"
    )]
    Config(super::config::ConfigCmd),
    /// Traffic rules: configured against realised share; tenants' allowed
    /// models and tags.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 rules\n  zonegate ctl rules --json | jq '.rules[] | {name, percent, realised_percent}'"
    )]
    Rules,
    /// Shadow traffic: copies, agreement, latency delta; with a NAME, its
    /// last disagreements.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 shadows\n  zonegate ctl --admin http://127.0.0.1:9090 shadows qwen3-shadow"
    )]
    Shadows(super::policy::ShadowsCmd),
    /// Follow the cluster live: redraws status every interval on a
    /// terminal, else prints one line per change. Ctrl-C stops it.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 watch\n  zonegate ctl watch --interval 5 >> incident.log"
    )]
    Watch {
        /// Seconds between polls.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// What tenants spent per model (and their budgets): this node's
    /// answers; asked of the leader, the cluster's.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 spend\n  zonegate ctl --admin http://127.0.0.1:9090 spend --tenant research --since 7d"
    )]
    Spend(super::spend::SpendCmd),
    /// How a node would route a request now, without sending it: the
    /// effective zone and why, candidate backends, fallbacks.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 explain --model qwen25-7b-instruct --max-tokens 256\n  zonegate ctl explain --model qwen25-7b-instruct --session user-42 --zone az-b"
    )]
    Explain {
        /// The model the request names.
        #[arg(long)]
        model: String,
        /// The session id (`x-session-id`); its home zone comes from the
        /// node's pin table.
        #[arg(long)]
        session: Option<String>,
        /// The zone the request enters at (default: the node's own).
        #[arg(long)]
        zone: Option<String>,
        /// The request's max_tokens (none: a long request).
        #[arg(long)]
        max_tokens: Option<u64>,
        /// The tenant, for the traffic rule the request would match.
        #[arg(long)]
        tenant: Option<String>,
        /// The user (session or `user`) the rule's share is decided by.
        #[arg(long)]
        user: Option<String>,
        /// One request header, `name:value`, for rules that match headers.
        #[arg(long)]
        header: Option<String>,
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
    /// Show what would move, the rules checked and the undo command;
    /// change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Do not ask for confirmation (only a terminal is ever asked).
    #[arg(long, short = 'y')]
    yes: bool,
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
/// The admin API did not accept the token (none given, or a wrong one):
/// nothing was done.
pub const EXIT_AUTH: u8 = 4;

/// A 401 from the admin API in the operator's words: which token, and
/// where to pass one. `None` for any other status.
pub(crate) fn token_refused(
    status: reqwest::StatusCode,
    admin: &str,
    token_given: bool,
) -> Option<anyhow::Error> {
    if status != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    let what = if token_given {
        format!("admin token rejected by {admin}")
    } else {
        format!("no admin token given; {admin} needs one")
    };
    Some(fail(
        EXIT_AUTH,
        format!("{what} (pass --token or ZONEGATE_ADMIN_TOKEN); nothing was done"),
    ))
}

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
    let api = Api::new(admin, token, json_out)?;
    if let Verb::Config(c) = verb {
        return super::config::run(&api, json_out, c).await;
    }
    match verb {
        Verb::Rules => return super::policy::run(&api, json_out, None).await,
        Verb::Shadows(c) => return super::policy::run(&api, json_out, Some(c)).await,
        Verb::Spend(c) => return super::spend::run(&api, json_out, c).await,
        _ => {}
    }
    let look = render::Look::for_stdout();
    match verb {
        Verb::Status => {
            let v = status_of(&api).await?;
            emit(json_out, &v, || {
                render::render_with(&Verb::Status, &v, &look)
            });
            Ok(())
        }
        Verb::Watch { interval } => watch::run(&api, interval, json_out, &look).await,
        Verb::Quotas if !json_out => {
            let mut v = api
                .call(reqwest::Method::GET, "/admin/v1/quotas", None)
                .await?;
            // Each node's zone and each zone's state say why a node holds
            // another zone's allocation (best effort).
            if let Ok(c) = api
                .quiet()
                .call(reqwest::Method::GET, "/admin/v1/cluster", None)
                .await
            {
                v["cluster"] = c;
            }
            print!("{}", render::render_with(&Verb::Quotas, &v, &look));
            Ok(())
        }
        Verb::Failover { from, to, opts } => {
            let (to, chosen) = match to {
                Some(to) => (to, false),
                None => (leader_choice(&api, &from).await?, true),
            };
            let body = json!({"from": from, "to": to});
            decide(
                &api,
                "failover",
                body,
                &opts,
                &look,
                chosen.then_some(to.as_str()),
            )
            .await
        }
        Verb::Failback { zone, opts } => {
            decide(&api, "failback", json!({"zone": zone}), &opts, &look, None).await
        }
        verb => {
            let (method, path, body) = request_of(&verb);
            let v = api.call(method, &path, body).await?;
            emit(json_out, &v, || render::render_with(&verb, &v, &look));
            Ok(())
        }
    }
}

fn emit(json_out: bool, v: &Value, human: impl FnOnce() -> String) {
    if json_out {
        println!("{v}");
    } else {
        print!("{}", human());
    }
}

/// `/admin/v1/cluster`, with the outlook (`outlook`) and the last decision
/// (`last_decision`) added when the node serves them.
async fn status_of(api: &Api) -> anyhow::Result<Value> {
    use reqwest::Method;
    let mut v = api.call(Method::GET, "/admin/v1/cluster", None).await?;
    // An older node without the outlook still gets a status.
    if let Ok(o) = api
        .quiet()
        .call(Method::GET, "/admin/v1/outlook", None)
        .await
    {
        v["outlook"] = o;
    }
    if let Ok(d) = api
        .quiet()
        .call(Method::GET, "/admin/v1/decisions?limit=1", None)
        .await
    {
        v["last_decision"] = d["decisions"][0].clone();
    }
    if v["outlook"].is_object() && v["outlook"]["traffic"].is_null() {
        if let Some(t) = leaders_traffic(api, &v).await {
            v["outlook"]["traffic"] = t;
        }
    }
    Ok(v)
}

/// Per-zone traffic lives on the leader (every node reports to it): asked
/// of a follower, `status` asks the leader's admin API (its address from
/// the membership, this URL's scheme), best effort.
async fn leaders_traffic(api: &Api, v: &Value) -> Option<Value> {
    let leader = v["leader"].as_u64()?;
    let members = api
        .quiet()
        .call(reqwest::Method::GET, "/admin/v1/members", None)
        .await
        .ok()?;
    let addr = members["members"]
        .as_array()?
        .iter()
        .find(|m| m["id"].as_u64() == Some(leader))?["admin_addr"]
        .as_str()?
        .to_owned();
    let scheme = api.admin.split("://").next().unwrap_or("http");
    let at_leader = Api {
        admin: format!("{scheme}://{addr}"),
        ..api.quiet()
    };
    let o = at_leader
        .call(reqwest::Method::GET, "/admin/v1/outlook", None)
        .await
        .ok()?;
    Some(o["traffic"].clone()).filter(|t| t.is_object())
}

/// The zone the leader's detector would fail `from` over to now.
async fn leader_choice(api: &Api, from: &str) -> anyhow::Result<String> {
    let o = api
        .call(reqwest::Method::GET, "/admin/v1/outlook", None)
        .await
        .context("cannot ask the node for the leader's failover target; name one with --to")?;
    if o["zones"].get(from).is_none() {
        return Err(fail(
            EXIT_REFUSED,
            format!("unknown_zone: zone {from} is not in the cluster"),
        ));
    }
    match o["zones"][from]["failover_target"].as_str() {
        Some(t) => Ok(t.to_owned()),
        None => Err(fail(
            EXIT_REFUSED,
            format!("no_target: no active zone other than {from} scores at or above the cutoff; nothing was written (name one with --to)"),
        )),
    }
}

/// A failover or failback: the dry run when asked for; on an interactive
/// terminal without `--yes`, the preview then a confirmation, committed
/// only if nobody decided meanwhile; elsewhere the commit directly.
async fn decide(
    api: &Api,
    kind: &str,
    zones: Value,
    opts: &DecideOpts,
    look: &render::Look,
    chosen: Option<&str>,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let path = format!("/admin/v1/{kind}");
    let post = reqwest::Method::POST;
    let ask = !opts.yes
        && !opts.dry_run
        && !api.json_out
        && std::io::stdin().is_terminal()
        && std::io::stdout().is_terminal();
    if opts.dry_run || ask {
        let mut dry = opts.clone();
        dry.dry_run = true;
        let v = api
            .call(post.clone(), &path, Some(dry.body(zones.clone())))
            .await?;
        emit(api.json_out, &v, || {
            render::dry_run(kind, &zones, &v, chosen, look)
        });
        if opts.dry_run {
            return Ok(());
        }
        if !confirm()? {
            return Err(fail(
                EXIT_REFUSED,
                "not confirmed; nothing was written".into(),
            ));
        }
        // Commit exactly what was previewed: refused (stale_version) if a
        // decision landed in between.
        let mut commit = opts.clone();
        if commit.if_version.is_none() {
            commit.if_version = v["preview"]["version"]
                .as_u64()
                .map(|n| n.saturating_sub(1));
        }
        let changes = v["preview"]["changes"].clone();
        let v = api
            .call(post, &path, Some(commit.body(zones.clone())))
            .await?;
        print!(
            "{}",
            render::committed(kind, &zones, &v, &changes, chosen, look)
        );
        return Ok(());
    }
    // A failback's undo names the zone's target before it: read it first
    // (best effort; without it the undo lets the leader choose).
    let mut changes = Value::Null;
    if let (false, Some(zone)) = (api.json_out, zones["zone"].as_str()) {
        if let Ok(c) = api
            .quiet()
            .call(reqwest::Method::GET, "/admin/v1/cluster?scope=local", None)
            .await
        {
            changes = json!([{"zone": zone, "before": c["zones"][zone].clone()}]);
        }
    }
    let v = api
        .call(post, &path, Some(opts.body(zones.clone())))
        .await?;
    emit(api.json_out, &v, || {
        render::committed(kind, &zones, &v, &changes, chosen, look)
    });
    Ok(())
}

fn confirm() -> anyhow::Result<bool> {
    use std::io::Write as _;
    print!("apply? [y/N] ");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

/// The admin API of one node, and how its failures map to exit codes.
#[derive(Clone)]
pub(crate) struct Api {
    admin: String,
    token: Option<String>,
    client: reqwest::Client,
    /// Print an error answer's JSON body on stdout (scripts read it).
    json_out: bool,
}

impl Api {
    fn new(admin: &str, token: Option<&str>, json_out: bool) -> anyhow::Result<Self> {
        Ok(Self {
            admin: admin.trim_end_matches('/').to_owned(),
            token: token.map(str::to_owned),
            client: super::http_client(Duration::from_secs(30))?,
            json_out,
        })
    }

    /// The same API, printing nothing for a failed call.
    fn quiet(&self) -> Self {
        Self {
            json_out: false,
            ..self.clone()
        }
    }

    /// One call; the error carries the exit code ([`CtlFailure`]).
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let admin = &self.admin;
        let mut req = self
            .client
            .request(method.clone(), format!("{admin}{path}"));
        if let Some(t) = &self.token {
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
        if let Some(refused) = token_refused(status, admin, self.token.is_some()) {
            return Err(refused);
        }
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
        if status.is_success() {
            return Ok(value);
        }
        let err = &value["error"];
        let code = err["code"].as_str().unwrap_or("error");
        let message = err["message"].as_str().unwrap_or(&text);
        if self.json_out {
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
        Err(fail(exit, message))
    }
}

fn request_of(verb: &Verb) -> (reqwest::Method, String, Option<Value>) {
    use reqwest::Method;
    match verb {
        Verb::Backends => (Method::GET, "/admin/v1/backends".into(), None),
        Verb::Quotas => (Method::GET, "/admin/v1/quotas".into(), None),
        Verb::Decisions { limit, all } => (
            Method::GET,
            format!(
                "/admin/v1/decisions?limit={limit}{}",
                if *all { "&all=true" } else { "" }
            ),
            None,
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
        Verb::Explain {
            model,
            session,
            zone,
            max_tokens,
            tenant,
            user,
            header,
        } => {
            let mut path = format!("/admin/v1/explain?model={}", query(model));
            for (k, v) in [
                ("session", session.clone()),
                ("zone", zone.clone()),
                ("tenant", tenant.clone()),
                ("user", user.clone()),
                ("header", header.clone()),
            ] {
                if let Some(v) = v {
                    path.push_str(&format!("&{k}={}", query(&v)));
                }
            }
            if let Some(n) = max_tokens {
                path.push_str(&format!("&max_tokens={n}"));
            }
            (Method::GET, path, None)
        }
        // Status, watch and the zone decisions take more than one call.
        _ => (Method::GET, "/admin/v1/cluster".into(), None),
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub(crate) fn query(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl DecideOpts {
    fn body(&self, mut zones: Value) -> Value {
        zones["reason"] = json!(self.reason);
        zones["if_version"] = json!(self.if_version);
        zones["dry_run"] = json!(self.dry_run);
        zones
    }
}
