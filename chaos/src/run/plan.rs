//! The plan `zonegate drill --dry-run` prints: the target, the load, the
//! steps, the expectations, the restore and the safety rules.

use crate::scenario::{fmt_dur, Scenario, Target};

/// The plan `--dry-run` prints.
pub fn plan(s: &Scenario) -> String {
    let mut out = format!("drill `{}`", s.name);
    if !s.description.is_empty() {
        out.push_str(&format!(": {}", s.description));
    }
    out.push('\n');
    match &s.target {
        Target::Local {
            topology,
            node_config,
        } => {
            out.push_str(&format!(
                "target: local cluster from {} (started by the drill, Raft through relays)\n",
                topology.display()
            ));
            if !node_config.is_empty() {
                out.push_str(&format!(
                    "  merged into every node's config: {}\n",
                    toml::to_string(node_config)
                        .unwrap_or_default()
                        .replace('\n', " ")
                ));
            }
        }
        Target::Cluster {
            admin,
            data,
            backends,
            ..
        } => {
            out.push_str(&format!(
                "target: existing cluster, admin {}, data plane {}, {} mock backends\n",
                admin.join(", "),
                data.join(", "),
                backends.len()
            ));
        }
    }
    let l = &s.load;
    out.push_str(&format!(
        "load: {} req/s for {} after a {} warm-up (short {:.0}%, long {:.0}%, stream {:.0}%), {} sessions, {} tenants, at most {} in flight\n",
        l.rps,
        fmt_dur(l.duration),
        fmt_dur(l.warmup),
        l.mix.short * 100.0,
        l.mix.long * 100.0,
        l.mix.stream * 100.0,
        l.sessions,
        l.tenants,
        l.concurrency
    ));
    for (i, q) in l.tenant_quotas.iter().enumerate() {
        out.push_str(&format!(
            "  tenant drill-{}: quota {}\n",
            i + 1,
            toml::to_string(&q.to_table())
                .unwrap_or_default()
                .trim_end()
                .replace('\n', ", ")
        ));
    }
    out.push_str("steps:\n");
    for (i, st) in s.steps.iter().enumerate() {
        out.push_str(&format!(
            "  {i}. {} {}\n",
            st.at
                .map(|a| format!("at {}:", fmt_dur(a)))
                .unwrap_or_else(|| "then:".into()),
            st.action.describe()
        ));
    }
    out.push_str("expect:\n");
    let e = &s.expect;
    let mut any = false;
    let mut line = |t: String| {
        any = true;
        out.push_str(&format!("  {t}\n"));
    };
    if let Some(v) = e.short_success {
        line(format!("short_success >= {v}"));
    }
    if let Some(v) = e.long_success {
        line(format!("long_success >= {v}"));
    }
    if let Some(v) = e.stream_success {
        line(format!("stream_success >= {v}"));
    }
    if let Some(v) = e.failover_committed_within {
        line(format!("failover_committed_within {}", fmt_dur(v)));
    }
    if let Some(v) = e.no_failover {
        line(format!("no_failover = {v}"));
    }
    if let Some(v) = e.max_leaders_per_term {
        line(format!("max_leaders_per_term = {v}"));
    }
    if let Some(v) = e.term_unchanged {
        line(format!("term_unchanged = {v}"));
    }
    if let Some(v) = e.no_lost_decisions {
        line(format!("no_lost_decisions = {v}"));
    }
    if let Some(v) = e.converged_within {
        line(format!("converged_within {}", fmt_dur(v)));
    }
    if let Some(v) = e.p99_added_ms {
        line(format!("p99_added_ms <= {v}"));
    }
    if let Some(v) = e.quota_cap_held {
        line(format!("quota_cap_held = {v}"));
    }
    if let Some(v) = e.quota_stretched_within {
        line(format!("quota_stretched_within {}", fmt_dur(v)));
    }
    if !any {
        out.push_str("  (none; only that every step runs)\n");
    }
    out.push_str("restore: every mock backend's faults back to their values at the start, partitions healed, paused nodes resumed, killed nodes started; also on Ctrl-C and on abort\n");
    let sf = &s.safety;
    if !sf.blocked.is_empty() {
        let w: Vec<&str> = sf.blocked.iter().map(|w| w.text.as_str()).collect();
        out.push_str(&format!("blocked windows: {}\n", w.join("; ")));
    }
    if let Some(b) = sf.abort_below {
        out.push_str(&format!(
            "abort when short-request success < {b} for {}\n",
            fmt_dur(sf.abort_after)
        ));
    }
    if let Some((u, q)) = &sf.alert {
        out.push_str(&format!(
            "abort when the alert query `{q}` at {u} returns a series\n"
        ));
    }
    if sf.capacity_check {
        out.push_str("capacity pre-check: in the warm-up's last second, everything in flight must fit in the capacity units of the zones the steps leave serving, else stop (exit 2)\n");
    }
    out
}
