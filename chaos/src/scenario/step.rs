//! One raw step into a validated [`Step`]: its action, the keys that
//! action takes, and the ones it refuses.

use super::raw::RawStep;
use super::*;

pub(super) fn validate_step(i: usize, s: RawStep, local: bool) -> Result<Step, Invalid> {
    let k = |f: &str| format!("steps[{i}].{f}");
    let at = s.at.as_deref().map(|a| duration(&k("at"), a)).transpose()?;
    let for_ = s
        .for_
        .as_deref()
        .map(|a| duration(&k("for"), a))
        .transpose()?;
    let node = s
        .node
        .as_ref()
        .map(|n| node_sel(&k("node"), n))
        .transpose()?;
    // Which optional keys each action reads; any other key set is an error.
    let (uses, action): (&[&str], Action) = match s.action.as_str() {
        "backend_fault" => {
            let target = backend_sel(&k(""), s.backends.clone(), s.zone.clone())?;
            let Some(table) = s.faults.clone() else {
                return bad(k("faults"), "required: the /mock/faults keys to set");
            };
            let mut faults = serde_json::Map::new();
            for (key, v) in table {
                if !FAULT_KEYS.contains(&key.as_str()) {
                    return bad(
                        k(&format!("faults.{key}")),
                        format!("not a mock fault (known: {})", FAULT_KEYS.join(", ")),
                    );
                }
                let json = serde_json::to_value(&v)
                    .map_err(|e| (k(&format!("faults.{key}")), e.to_string()))?;
                faults.insert(key, json);
            }
            (
                &["backends", "zone", "faults", "for"],
                Action::BackendFault {
                    target,
                    faults,
                    for_,
                },
            )
        }
        "backend_restore" => (
            &["backends", "zone"],
            Action::BackendRestore {
                target: backend_sel(&k(""), s.backends.clone(), s.zone.clone())?,
            },
        ),
        "kill" => (
            &["node"],
            Action::Kill {
                node: node.clone().ok_or_else(|| (k("node"), "required".to_owned()))?,
            },
        ),
        "pause" => (
            &["node", "for"],
            Action::Pause {
                node: node.clone().ok_or_else(|| (k("node"), "required".to_owned()))?,
                for_,
            },
        ),
        "resume" => (&["node"], Action::Resume { node: node.clone() }),
        "restart" => (&["node"], Action::Restart { node: node.clone() }),
        "partition" => {
            let sides = match (&s.groups, &s.isolate) {
                (Some(g), None) => {
                    if g.len() != 2 || g.iter().any(Vec::is_empty) {
                        return bad(k("groups"), "expected two non-empty groups of node ids");
                    }
                    if g[0].iter().any(|id| g[1].contains(id)) {
                        return bad(k("groups"), "a node is on both sides");
                    }
                    PartitionSel::Groups(g[0].clone(), g[1].clone())
                }
                (None, Some(n)) => PartitionSel::Isolate(node_sel(&k("isolate"), n)?),
                (Some(_), Some(_)) => {
                    return bad(k("isolate"), "give either groups or isolate, not both")
                }
                (None, None) => return bad(k("groups"), "required (or isolate)"),
            };
            let direction = match s.direction.as_deref() {
                None | Some("both") => Direction::Both,
                Some("one-way") | Some("one_way") => Direction::OneWay,
                Some(d) => return bad(k("direction"), format!("`{d}` is not both or one-way")),
            };
            (
                &["groups", "isolate", "direction", "for"],
                Action::Partition {
                    sides,
                    direction,
                    for_,
                },
            )
        }
        "heal" => (&[], Action::Heal),
        "ctl" => {
            let Some(args) = s.args.clone() else {
                return bad(k("args"), "required, e.g. [\"freeze\"]");
            };
            if args.is_empty() {
                return bad(k("args"), "empty");
            }
            if args
                .iter()
                .any(|a| a == "--admin" || a == "--token" || a.starts_with("--admin=") || a.starts_with("--token="))
            {
                return bad(k("args"), "the drill sets --admin and --token itself");
            }
            (
                &["args", "node", "expect_exit"],
                Action::Ctl {
                    args,
                    node: node.clone(),
                    expect_exit: s.expect_exit,
                },
            )
        }
        "wait_for" => {
            let condition = match s.condition.as_deref() {
                Some("decision") => Condition::Decision {
                    kind: s.kind.clone(),
                    zone: s.zone.clone(),
                },
                Some("leader_change") => Condition::LeaderChange,
                Some("leader") => Condition::Leader,
                Some("converged") => Condition::Converged,
                Some("version") => Condition::Version(
                    s.version
                        .ok_or_else(|| (k("version"), "required for condition version".to_owned()))?,
                ),
                Some(c) => {
                    return bad(
                        k("condition"),
                        format!("`{c}` is not one of decision, leader_change, leader, converged, version"),
                    )
                }
                None => return bad(k("condition"), "required"),
            };
            if let Some(kind) = &s.kind {
                if !["failover", "failback", "freeze", "unfreeze"].contains(&kind.as_str()) {
                    return bad(k("kind"), format!("`{kind}` is not a decision kind"));
                }
            }
            let timeout = match &s.timeout {
                Some(t) => duration(&k("timeout"), t)?,
                None => Duration::from_secs(30),
            };
            (
                &["condition", "kind", "zone", "version", "timeout"],
                Action::WaitFor { condition, timeout },
            )
        }
        "move_clients" => {
            let Some(from) = s.zone.clone() else {
                return bad(k("zone"), "required: the zone whose clients move");
            };
            let Some(to) = s.to.clone() else {
                return bad(k("to"), "required: the zone they move to");
            };
            (&["zone", "to"], Action::MoveClients { from, to })
        }
        other => {
            return bad(
                k("action"),
                format!(
                    "`{other}` is not an action (backend_fault, backend_restore, kill, pause, resume, restart, partition, heal, ctl, wait_for, move_clients)"
                ),
            )
        }
    };
    let set: [(&str, bool); 15] = [
        ("for", s.for_.is_some()),
        ("node", s.node.is_some()),
        ("zone", s.zone.is_some()),
        ("backends", s.backends.is_some()),
        ("faults", s.faults.is_some()),
        ("groups", s.groups.is_some()),
        ("isolate", s.isolate.is_some()),
        ("direction", s.direction.is_some()),
        ("args", s.args.is_some()),
        ("expect_exit", s.expect_exit.is_some()),
        ("condition", s.condition.is_some()),
        ("kind", s.kind.is_some()),
        ("version", s.version.is_some()),
        ("timeout", s.timeout.is_some()),
        ("to", s.to.is_some()),
    ];
    for (key, present) in set {
        if present && !uses.contains(&key) {
            return bad(k(key), format!("not used by action `{}`", action.name()));
        }
    }
    if !local
        && matches!(
            action,
            Action::Kill { .. }
                | Action::Pause { .. }
                | Action::Resume { .. }
                | Action::Restart { .. }
                | Action::Partition { .. }
                | Action::Heal
        )
    {
        return bad(
            k("action"),
            format!(
                "`{}` needs the processes and relays of a local target",
                action.name()
            ),
        );
    }
    Ok(Step {
        at,
        action,
        note: s.note,
    })
}

fn backend_sel(
    key: &str,
    backends: Option<Vec<String>>,
    zone: Option<String>,
) -> Result<BackendSel, Invalid> {
    match (backends, zone) {
        (Some(b), None) if !b.is_empty() => Ok(BackendSel::Names(b)),
        (None, Some(z)) => Ok(BackendSel::Zone(z)),
        (Some(_), Some(_)) => bad(
            format!("{key}zone"),
            "give either backends or zone, not both",
        ),
        _ => bad(format!("{key}backends"), "required (or zone)"),
    }
}
