//! Raw shapes into a validated scenario: the target, the load, the
//! expectations and the safety rules (the steps in `step`).

use std::path::Path;

use super::raw::RawScenario;
use super::step::validate_step;
use super::*;

pub(super) fn validate(raw: RawScenario, path: &Path) -> Result<Scenario, Invalid> {
    let base = path.parent().unwrap_or(Path::new("."));
    let target = match raw.target.kind.as_str() {
        "local" => {
            let Some(topology) = raw.target.topology else {
                return bad("target.topology", "required for a local target");
            };
            for (k, set) in [
                ("target.admin", !raw.target.admin.is_empty()),
                ("target.data", !raw.target.data.is_empty()),
                ("target.backends", !raw.target.backends.is_empty()),
                ("target.token_env", raw.target.token_env.is_some()),
                ("target.api_key_env", raw.target.api_key_env.is_some()),
            ] {
                if set {
                    return bad(k, "only for a cluster target");
                }
            }
            Target::Local {
                topology: base.join(topology),
                node_config: raw.target.node_config.unwrap_or_default(),
            }
        }
        "cluster" => {
            if raw.target.admin.is_empty() {
                return bad("target.admin", "a cluster target needs its admin URLs");
            }
            if raw.target.data.is_empty() {
                return bad("target.data", "a cluster target needs data-plane URLs");
            }
            if raw.target.topology.is_some() {
                return bad("target.topology", "only for a local target");
            }
            if raw.target.node_config.is_some() {
                return bad("target.node_config", "only for a local target");
            }
            for (i, u) in raw.target.admin.iter().chain(&raw.target.data).enumerate() {
                if !u.starts_with("http://") && !u.starts_with("https://") {
                    let key = if i < raw.target.admin.len() {
                        format!("target.admin[{i}]")
                    } else {
                        format!("target.data[{}]", i - raw.target.admin.len())
                    };
                    return bad(key, format!("`{u}` is not an http(s) URL"));
                }
            }
            Target::Cluster {
                admin: raw.target.admin,
                data: raw.target.data,
                token_env: raw
                    .target
                    .token_env
                    .unwrap_or_else(|| "ZONEGATE_ADMIN_TOKEN".into()),
                api_key_env: raw
                    .target
                    .api_key_env
                    .unwrap_or_else(|| "ZONEGATE_API_KEY".into()),
                backends: raw.target.backends,
            }
        }
        other => {
            return bad(
                "target.kind",
                format!("`{other}` is not a target kind (local, cluster)"),
            )
        }
    };
    let local = matches!(target, Target::Local { .. });

    let l = raw.load;
    if !(l.rps > 0.0 && l.rps <= 100_000.0) {
        return bad("load.rps", format!("{} is not in (0, 100000]", l.rps));
    }
    let mix = match l.mix {
        None => Mix {
            short: 1.0,
            long: 0.0,
            stream: 0.0,
        },
        Some(m) => {
            for (k, v) in [("short", m.short), ("long", m.long), ("stream", m.stream)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return bad(format!("load.mix.{k}"), "must be a share >= 0");
                }
            }
            let sum = m.short + m.long + m.stream;
            if sum <= 0.0 {
                return bad("load.mix", "the shares add up to 0");
            }
            Mix {
                short: m.short / sum,
                long: m.long / sum,
                stream: m.stream / sum,
            }
        }
    };
    let mut load = Load {
        rps: l.rps,
        duration: duration("load.duration", &l.duration)?,
        warmup: match l.warmup {
            Some(w) => duration("load.warmup", &w)?,
            None => Duration::from_secs(3),
        },
        mix,
        sessions: l.sessions.unwrap_or(0),
        tenants: match l.tenants {
            Some(0) => return bad("load.tenants", "at least 1"),
            Some(n) if !local && n != 1 => {
                return bad("load.tenants", "a cluster target uses one API key")
            }
            Some(n) => n,
            None => 1,
        },
        concurrency: match l.concurrency {
            Some(0) => return bad("load.concurrency", "at least 1"),
            Some(n) => n,
            None => 256,
        },
        timeout: match l.timeout {
            Some(t) => duration("load.timeout", &t)?,
            None => Duration::from_secs(15),
        },
        entry_zones: l.entry_zones,
        model: l.model,
        short_max_tokens: l.short_max_tokens.unwrap_or(16),
        tenant_quotas: Vec::new(),
    };
    if !l.tenant_quotas.is_empty() && !local {
        return bad(
            "load.tenant_quotas",
            "only for a local target (the drill makes its tenants)",
        );
    }
    if l.tenant_quotas.len() > load.tenants as usize {
        return bad(
            "load.tenant_quotas",
            format!(
                "{} quotas for {} tenants (load.tenants)",
                l.tenant_quotas.len(),
                load.tenants
            ),
        );
    }
    for (i, t) in l.tenant_quotas.into_iter().enumerate() {
        load.tenant_quotas
            .push(tenant_quota(&format!("load.tenant_quotas[{i}]"), t)?);
    }
    if load.duration.is_zero() {
        return bad("load.duration", "must be longer than 0");
    }

    let mut steps = Vec::new();
    for (i, s) in raw.steps.into_iter().enumerate() {
        let step = validate_step(i, s, local)?;
        if let (Some(at), Some(prev)) = (step.at, steps.iter().rev().find_map(|p: &Step| p.at)) {
            if at < prev {
                return bad(
                    format!("steps[{i}].at"),
                    format!(
                        "{} is before the previous step's {}",
                        fmt_dur(at),
                        fmt_dur(prev)
                    ),
                );
            }
        }
        if let Some(at) = step.at {
            if at > load.duration {
                return bad(
                    format!("steps[{i}].at"),
                    format!(
                        "{} is after the load ends ({})",
                        fmt_dur(at),
                        fmt_dur(load.duration)
                    ),
                );
            }
        }
        steps.push(step);
    }

    let e = raw.expect;
    let expect = Expect {
        short_success: e
            .short_success
            .map(|v| fraction("expect.short_success", v))
            .transpose()?,
        long_success: e
            .long_success
            .map(|v| fraction("expect.long_success", v))
            .transpose()?,
        stream_success: e
            .stream_success
            .map(|v| fraction("expect.stream_success", v))
            .transpose()?,
        failover_committed_within: e
            .failover_committed_within
            .map(|s| duration("expect.failover_committed_within", &s))
            .transpose()?,
        no_failover: e.no_failover,
        max_leaders_per_term: match e.max_leaders_per_term {
            Some(0) => return bad("expect.max_leaders_per_term", "at least 1"),
            v => v,
        },
        term_unchanged: e.term_unchanged,
        no_lost_decisions: e.no_lost_decisions,
        converged_within: e
            .converged_within
            .map(|s| duration("expect.converged_within", &s))
            .transpose()?,
        p99_added_ms: match e.p99_added_ms {
            Some(v) if !(v >= 0.0 && v.is_finite()) => {
                return bad("expect.p99_added_ms", "must be >= 0")
            }
            v => v,
        },
        quota_cap_held: e.quota_cap_held,
        quota_stretched_within: e
            .quota_stretched_within
            .map(|s| duration("expect.quota_stretched_within", &s))
            .transpose()?,
    };
    let with_rpm = load.tenant_quotas.iter().any(|q| q.rpm.is_some());
    for (key, set) in [
        ("expect.quota_cap_held", expect.quota_cap_held == Some(true)),
        (
            "expect.quota_stretched_within",
            expect.quota_stretched_within.is_some(),
        ),
    ] {
        if set && !with_rpm {
            return bad(key, "needs a tenant with an rpm quota (load.tenant_quotas)");
        }
    }
    if expect.quota_stretched_within.is_some() && expect.no_failover == Some(true) {
        return bad(
            "expect.no_failover",
            "contradicts expect.quota_stretched_within (measured from a failover)",
        );
    }
    for (i, step) in steps.iter().enumerate() {
        if let Action::MoveClients { from, to } = &step.action {
            for (key, zone) in [("zone", from), ("to", to)] {
                if !load.entry_zones.is_empty() && !load.entry_zones.contains(zone) {
                    return bad(
                        format!("steps[{i}].{key}"),
                        format!("{zone} has no node in the clients' rotation (load.entry_zones)"),
                    );
                }
            }
        }
    }
    if expect.failover_committed_within.is_some() && expect.no_failover == Some(true) {
        return bad(
            "expect.no_failover",
            "contradicts expect.failover_committed_within",
        );
    }

    let s = raw.safety;
    let mut blocked = Vec::new();
    for (i, w) in s.blocked.iter().enumerate() {
        blocked.push(
            crate::window::Window::parse(w).map_err(|r| (format!("safety.blocked[{i}]"), r))?,
        );
    }
    let safety = Safety {
        blocked,
        abort_below: s
            .abort_below
            .map(|v| fraction("safety.abort_below", v))
            .transpose()?,
        abort_after: match s.abort_after {
            Some(d) => duration("safety.abort_after", &d)?,
            None => Duration::from_secs(5),
        },
        alert: match (s.alert_url, s.alert_query) {
            (Some(u), Some(q)) => Some((u, q)),
            (None, None) => None,
            (Some(_), None) => return bad("safety.alert_query", "required with alert_url"),
            (None, Some(_)) => return bad("safety.alert_url", "required with alert_query"),
        },
        capacity_check: s.capacity_check.unwrap_or(false),
    };

    let name = raw.name.unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "drill".into())
    });
    Ok(Scenario {
        name,
        description: raw.description.unwrap_or_default(),
        file: path.to_owned(),
        target,
        load,
        steps,
        expect,
        safety,
    })
}

/// A `load.tenant_quotas` entry: the keys of a node's `quota` table, each
/// a whole number of at least 1, at least one given.
fn tenant_quota(key: &str, t: toml::Table) -> Result<TenantQuota, Invalid> {
    if t.is_empty() {
        return bad(key, "empty: give rpm, tpm or concurrency");
    }
    let mut q = TenantQuota::default();
    for (k, v) in t {
        let slot = match k.as_str() {
            "rpm" => &mut q.rpm,
            "tpm" => &mut q.tpm,
            "concurrency" => &mut q.concurrency,
            _ => {
                return bad(
                    format!("{key}.{k}"),
                    "not a quota key (rpm, tpm, concurrency)",
                )
            }
        };
        match v.as_integer() {
            Some(n) if n >= 1 => *slot = Some(n as u64),
            _ => {
                return bad(
                    format!("{key}.{k}"),
                    format!("{v} is not a whole number >= 1"),
                )
            }
        }
    }
    Ok(q)
}
