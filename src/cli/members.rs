//! `zonegate ctl members`: list the replicated membership, and change it
//! one step at a time (`add`, `remove`, `promote`, `readdress`) through
//! `GET|POST /admin/v1/members`. Exit codes as every `ctl` verb: 0 done,
//! 1 refused by a rule (its name is printed), 2 bad usage or unreachable
//! before sending, 3 outcome unknown, 4 admin token missing or rejected.

use std::time::Duration;

use serde_json::{json, Value};

use super::ctl::{token_refused, CtlFailure, EXIT_OUTCOME_UNKNOWN, EXIT_REFUSED, EXIT_USAGE};

/// `ctl members [VERB]`; without a verb, the list.
#[derive(Debug, Clone, clap::Args)]
pub struct Members {
    #[command(subcommand)]
    pub op: Option<MembersOp>,
}

/// One membership change.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum MembersOp {
    /// List members with role, addresses, match index and lag.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 members list\n  zonegate ctl members list --json"
    )]
    List,
    /// Add a new member (a voter or witness is added as a learner first,
    /// then promoted once caught up). Node ids are never reused.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 members add --id 4 --zone az-a --raft 10.0.1.4:7070 --member-admin 10.0.1.4:9090\n  zonegate ctl --admin http://127.0.0.1:9090 members add --id 5 --zone az-d --raft 10.0.4.5:7070 --member-admin 10.0.4.5:9090 --role voter"
    )]
    Add {
        /// Its node id (never one the cluster used before).
        #[arg(long)]
        id: u64,
        /// The availability zone it serves.
        #[arg(long)]
        zone: String,
        /// `host:port` of its Raft listener.
        #[arg(long)]
        raft: String,
        /// `host:port` of its admin API (`--admin` before this release;
        /// `--admin` is now the admin URL of the node you talk to).
        #[arg(long = "member-admin")]
        member_admin: String,
        /// Its role once caught up.
        #[arg(long, value_parser = ["voter", "learner", "witness"], default_value = "learner")]
        role: String,
    },
    /// Remove a member (refused if it would lose quorum or leave a zone
    /// without the voter its topology requires).
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 members remove --id 3"
    )]
    Remove {
        /// The member's node id.
        #[arg(long)]
        id: u64,
    },
    /// Make a caught-up learner a voter.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 members promote --id 4"
    )]
    Promote {
        /// The learner's node id.
        #[arg(long)]
        id: u64,
    },
    /// Change a member's Raft and admin addresses.
    #[command(
        after_help = "Examples:\n  zonegate ctl --admin http://127.0.0.1:9090 members readdress --id 2 --raft 10.0.2.9:7070 --member-admin 10.0.2.9:9090"
    )]
    Readdress {
        /// The member's node id.
        #[arg(long)]
        id: u64,
        /// Its new `host:port` for Raft.
        #[arg(long)]
        raft: String,
        /// Its new `host:port` for the admin API.
        #[arg(long = "member-admin")]
        member_admin: String,
    },
}

/// The request a verb sends: `None` body for the list (a GET).
pub fn request_of(m: &Members) -> (reqwest::Method, String, Option<Value>) {
    let body = match m.op.as_ref().unwrap_or(&MembersOp::List) {
        MembersOp::List => None,
        MembersOp::Add {
            id,
            zone,
            raft,
            member_admin,
            role,
        } => Some(json!({"op": "add", "member": {
            "id": id, "zone": zone, "raft_addr": raft, "admin_addr": member_admin, "role": role,
        }})),
        MembersOp::Remove { id } => Some(json!({"op": "remove", "id": id})),
        MembersOp::Promote { id } => Some(json!({"op": "promote", "id": id})),
        MembersOp::Readdress {
            id,
            raft,
            member_admin,
        } => Some(json!({
            "op": "readdress", "id": id, "raft_addr": raft, "admin_addr": member_admin,
        })),
    };
    let method = if body.is_some() {
        reqwest::Method::POST
    } else {
        reqwest::Method::GET
    };
    (method, "/admin/v1/members".into(), body)
}

/// The old spelling of `members add|readdress --member-admin`, kept for
/// one release: before `--admin` became the node's admin URL everywhere,
/// these two verbs took the new member's admin address as `--admin`.
/// Rewrites the first `--admin` after `members add|readdress` (when
/// `--member-admin` is not given too) and says so in a warning.
pub fn legacy_member_admin(
    mut args: Vec<std::ffi::OsString>,
) -> (Vec<std::ffi::OsString>, Option<String>) {
    let pos = |args: &[std::ffi::OsString], from: usize, want: &[&str]| {
        args.iter()
            .skip(from)
            .position(|a| a.to_str().is_some_and(|a| want.contains(&a)))
            .map(|i| i + from)
    };
    let Some(op) = pos(&args, 0, &["ctl"])
        .and_then(|c| pos(&args, c + 1, &["members"]))
        .and_then(|m| pos(&args, m + 1, &["add", "readdress"]))
    else {
        return (args, None);
    };
    let after = &args[op + 1..];
    let spelled = |a: &std::ffi::OsString, flag: &str| {
        a.to_str()
            .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if after.iter().any(|a| spelled(a, "--member-admin")) {
        return (args, None);
    }
    let Some(i) = after.iter().position(|a| spelled(a, "--admin")) else {
        return (args, None);
    };
    let old = args[op + 1 + i].to_string_lossy().into_owned();
    args[op + 1 + i] = old.replacen("--admin", "--member-admin", 1).into();
    let verb = args[op].to_string_lossy().into_owned();
    let warning = format!(
        "warning: `ctl members {verb} --admin ADDR` is now `--member-admin ADDR` (the old \
         spelling is accepted until the next release); `--admin` names the node you talk to"
    );
    (args, Some(warning))
}

fn fail(exit: u8, message: String) -> anyhow::Error {
    anyhow::Error::new(CtlFailure { exit, message })
}

/// Runs `ctl members …` against `admin` and prints the members table (or
/// the JSON answer with `--json`).
pub async fn run(
    admin: &str,
    token: Option<&str>,
    json_out: bool,
    m: Members,
) -> anyhow::Result<()> {
    let admin = admin.trim_end_matches('/');
    // A change may wait for a learner to catch up and two commits.
    let client = super::http_client(Duration::from_secs(60))?;
    let (method, path, body) = request_of(&m);
    let writes = method == reqwest::Method::POST;
    let mut req = client.request(method, format!("{admin}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = &body {
        req = req.json(b);
    }
    let check = format!("check `zonegate ctl --admin {admin} members` before retrying");
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() || e.is_builder() || !writes => {
            return Err(fail(EXIT_USAGE, format!("cannot reach {admin}: {e}; nothing was sent")))
        }
        Err(e) => {
            return Err(fail(
                EXIT_OUTCOME_UNKNOWN,
                format!("outcome unknown: the change was sent to {admin} but its answer was lost ({e}); {check}"),
            ))
        }
    };
    let status = resp.status();
    if let Some(refused) = token_refused(status, admin, token.is_some()) {
        return Err(refused);
    }
    let text = resp.text().await.unwrap_or_default();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !status.is_success() {
        if json_out && !value.is_null() {
            println!("{value}");
        }
        let code = value["error"]["code"].as_str().unwrap_or("error");
        let message = value["error"]["message"].as_str().unwrap_or(&text);
        let message = if message.contains(code) {
            format!("{message} (HTTP {status})")
        } else {
            format!("{code}: {message} (HTTP {status})")
        };
        let exit = if writes
            && (code == "outcome_unknown" || status == reqwest::StatusCode::GATEWAY_TIMEOUT)
        {
            return Err(fail(EXIT_OUTCOME_UNKNOWN, format!("{message}\n{check}")));
        } else if status == reqwest::StatusCode::BAD_REQUEST {
            EXIT_USAGE
        } else {
            EXIT_REFUSED
        };
        return Err(fail(exit, message));
    }
    if json_out {
        println!("{value}");
    } else {
        if writes {
            println!("committed: {}", value["op"].as_str().unwrap_or("change"));
        }
        print!("{}", table(&value));
    }
    Ok(())
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The members table; then where the bootstrap list differs, if it does.
pub fn table(v: &Value) -> String {
    let header = ["ID", "ZONE", "ROLE", "RAFT", "ADMIN", "MATCHED", "LAG"];
    let rows: Vec<Vec<String>> = v["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    let role = cell(&m["role"]);
                    let role = if m["leader"] == true {
                        format!("{role} (leader)")
                    } else {
                        role
                    };
                    vec![
                        cell(&m["id"]),
                        cell(&m["zone"]),
                        role,
                        cell(&m["raft_addr"]),
                        cell(&m["admin_addr"]),
                        cell(&m["matched_index"]),
                        cell(&m["lag"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    if let Some(diffs) = v["bootstrap_differs"].as_array().filter(|d| !d.is_empty()) {
        out.push_str("\n[[cluster.members]] differs from the replicated membership (the truth):\n");
        for d in diffs {
            out.push_str(&format!("  {}\n", cell(d)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_members_table_lists_role_addresses_match_and_lag() {
        let v = json!({"members": [
            {"id": 1, "zone": "az-a", "role": "voter", "raft_addr": "r1", "admin_addr": "a1", "leader": true, "matched_index": 12, "lag": 0},
            {"id": 4, "zone": "az-a", "role": "learner", "raft_addr": "r4", "admin_addr": "a4", "leader": false, "matched_index": null, "lag": null},
        ], "bootstrap_differs": ["member 4 (az-a, learner) is in the replicated membership but not in [[cluster.members]]"]});
        let t = table(&v);
        assert!(t.starts_with("ID  ZONE  ROLE"), "{t}");
        assert!(t.contains("voter (leader)"), "{t}");
        assert!(t.contains("4   az-a  learner"), "{t}");
        assert!(t.contains("differs"), "{t}");
    }

    #[test]
    fn members_add_admin_is_read_as_member_admin_with_a_warning() {
        let os = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(|s| s.into()).collect() };
        let (args, warning) = legacy_member_admin(os(&[
            "zonegate",
            "ctl",
            "--admin",
            "http://n1:9090",
            "members",
            "add",
            "--id",
            "4",
            "--admin",
            "10.0.0.4:9090",
        ]));
        assert_eq!(args[2], "--admin", "the global flag before the verb stays");
        assert_eq!(args[8], "--member-admin");
        assert!(warning.is_some_and(|w| w.contains("--member-admin")));
        let (args, _) = legacy_member_admin(os(&[
            "zonegate",
            "ctl",
            "members",
            "readdress",
            "--admin=10.0.0.4:9090",
        ]));
        assert_eq!(args[4], "--member-admin=10.0.0.4:9090");
        // The new spelling: `--admin` after the verb is the node's URL.
        let new = os(&[
            "zonegate",
            "ctl",
            "members",
            "add",
            "--member-admin",
            "a:1",
            "--admin",
            "http://n1",
        ]);
        assert_eq!(legacy_member_admin(new.clone()), (new, None));
        let other = os(&["zonegate", "ctl", "status", "--admin", "http://n1"]);
        assert_eq!(legacy_member_admin(other.clone()), (other, None));
    }

    #[test]
    fn each_verb_sends_its_change() {
        let (m, _, body) = request_of(&Members {
            op: Some(MembersOp::Promote { id: 4 }),
        });
        assert_eq!(m, reqwest::Method::POST);
        assert_eq!(body, Some(json!({"op": "promote", "id": 4})));
        let (m, _, body) = request_of(&Members { op: None });
        assert_eq!(m, reqwest::Method::GET);
        assert_eq!(body, None);
    }
}
