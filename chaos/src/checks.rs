//! The expectations of a scenario, judged against what the drill
//! recorded. Pure: everything comes in as values.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{self, Ack, Held, Tick};
use crate::load::{Class, Sample};
use crate::observe::Seen;
use crate::report::{quantile, Check, StepRecord};
use crate::scenario::{fmt_dur, Expect, TenantQuota};

/// What the checks read.
pub struct Inputs<'a> {
    pub expect: &'a Expect,
    pub samples: &'a [Sample],
    /// The load's span from t = 0, ms.
    pub load_end_ms: i64,
    pub ticks: &'a [Tick],
    /// Decisions committed during the drill (newer than its start).
    pub decisions: &'a [Seen],
    /// When the first fault was injected (or, in a drill without faults,
    /// the first `ctl` command ran), ms from t = 0, and which of the two.
    pub clock_start: Option<(i64, &'a str)>,
    /// When every fault had been restored.
    pub restored_ms: Option<i64>,
    /// Drill tenant `i + 1`'s quota (`load.tenant_quotas`).
    pub tenant_quotas: &'a [TenantQuota],
    /// Requests per minute the load offered each tenant.
    pub offered_rpm: f64,
    pub acks: &'a [Ack],
    pub finals: &'a BTreeMap<u64, Vec<Held>>,
    pub nodes: &'a [u64],
    pub steps: &'a [StepRecord],
}

fn pct(v: f64) -> String {
    format!("{:.3}%", v * 100.0)
}

fn success(samples: &[Sample], class: Class, end: i64) -> (u64, u64) {
    let mut total = 0;
    let mut ok = 0;
    for s in samples
        .iter()
        .filter(|s| s.class == class && s.t_ms >= 0 && s.t_ms < end)
    {
        total += 1;
        ok += u64::from(s.ok);
    }
    (ok, total)
}

/// Judges every expectation that is set, plus "every step ran".
pub fn evaluate(i: &Inputs<'_>) -> Vec<Check> {
    let e = i.expect;
    let mut out = Vec::new();
    for (name, want, class) in [
        ("short_success", e.short_success, Class::Short),
        ("long_success", e.long_success, Class::Long),
        ("stream_success", e.stream_success, Class::Stream),
    ] {
        if let Some(want) = want {
            let (ok, total) = success(i.samples, class, i.load_end_ms);
            let (pass, measured) = if total == 0 {
                (false, "no such requests were sent".to_owned())
            } else {
                let got = ok as f64 / total as f64;
                (
                    got >= want,
                    format!("{} ({ok} of {total}, {} failed)", pct(got), total - ok),
                )
            };
            out.push(Check {
                name: name.into(),
                expected: format!(">= {}", pct(want)),
                measured,
                pass: Some(pass),
            });
        }
    }
    if let Some(within) = e.failover_committed_within {
        let first = i
            .decisions
            .iter()
            .filter(|d| d.kind == "failover")
            .min_by_key(|d| d.first_seen_ms);
        let (pass, measured) = match (i.clock_start, first) {
            (None, _) => (false, "no fault or ctl step ran".to_owned()),
            (Some(_), None) => (false, "no failover was committed".to_owned()),
            (Some((f, what)), Some(d)) => {
                let took = d.first_seen_ms - f;
                (
                    took >= 0 && took as u128 <= within.as_millis(),
                    format!(
                        "{:.2}s ({what} at {:.1}s, version {} seen at {:.1}s, polled every 200 ms)",
                        took as f64 / 1000.0,
                        f as f64 / 1000.0,
                        d.version,
                        d.first_seen_ms as f64 / 1000.0
                    ),
                )
            }
        };
        out.push(Check {
            name: "failover_committed_within".into(),
            expected: format!("<= {}", fmt_dur(within)),
            measured,
            pass: Some(pass),
        });
    }
    if let Some(true) = e.no_failover {
        let failovers: Vec<String> = i
            .decisions
            .iter()
            .filter(|d| d.kind == "failover")
            .map(|d| format!("v{} {} ({})", d.version, d.decision, d.origin))
            .collect();
        out.push(Check {
            name: "no_failover".into(),
            expected: "no failover decision".into(),
            measured: if failovers.is_empty() {
                "none".into()
            } else {
                failovers.join("; ")
            },
            pass: Some(failovers.is_empty()),
        });
    }
    if let Some(max) = e.max_leaders_per_term {
        let violations = history::leader_violations(i.ticks, max as usize);
        let most = history::max_leaders_per_term(i.ticks);
        let terms = history::leaders_by_term(i.ticks).len();
        out.push(Check {
            name: "max_leaders_per_term".into(),
            expected: format!("<= {max}"),
            measured: if violations.is_empty() {
                format!("{most} (over {terms} terms seen)")
            } else {
                violations
                    .iter()
                    .map(|v| format!("term {}: leaders {:?}", v.term, v.leaders))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
            pass: Some(violations.is_empty()),
        });
    }
    if let Some(true) = e.term_unchanged {
        let terms = history::terms_seen(i.ticks);
        let measured = match terms.len() {
            0 => "no node answered".to_owned(),
            1 => format!(
                "term {} throughout",
                terms.keys().next().copied().unwrap_or(0)
            ),
            _ => terms
                .iter()
                .map(|(term, (t, node))| {
                    format!(
                        "term {term} (first on node {node} at {:.1}s)",
                        *t as f64 / 1000.0
                    )
                })
                .collect::<Vec<_>>()
                .join(" → "),
        };
        out.push(Check {
            name: "term_unchanged".into(),
            expected: "one term from start to end".into(),
            measured,
            pass: Some(terms.len() == 1),
        });
    }
    if let Some(true) = e.no_lost_decisions {
        let lost = history::lost_decisions(i.acks, i.finals);
        let missing_nodes: Vec<u64> = i
            .nodes
            .iter()
            .copied()
            .filter(|n| !i.finals.contains_key(n))
            .collect();
        let pass = lost.is_empty() && missing_nodes.is_empty();
        out.push(Check {
            name: "no_lost_decisions".into(),
            expected: "every acknowledged decision on every node".into(),
            measured: if pass {
                format!(
                    "{} acknowledged, all present on {} nodes",
                    i.acks.len(),
                    i.finals.len()
                )
            } else {
                let mut parts: Vec<String> = lost
                    .iter()
                    .map(|l| format!("v{} {} on node {}: {}", l.version, l.kind, l.node, l.why))
                    .collect();
                for n in missing_nodes {
                    parts.push(format!("node {n}'s history could not be read"));
                }
                parts.join("; ")
            },
            pass: Some(pass),
        });
    }
    if let Some(within) = e.converged_within {
        let (pass, measured) = match i.restored_ms {
            None => (false, "faults were never restored".to_owned()),
            Some(r) => match history::converged_at(i.ticks, r, i.nodes) {
                Some((t, v)) => (
                    (t - r) as u128 <= within.as_millis(),
                    format!(
                        "{:.2}s after restore, all {} nodes at version {v}",
                        (t - r) as f64 / 1000.0,
                        i.nodes.len()
                    ),
                ),
                None => (
                    false,
                    "never: the nodes did not agree on one version".to_owned(),
                ),
            },
        };
        out.push(Check {
            name: "converged_within".into(),
            expected: format!("<= {}", fmt_dur(within)),
            measured,
            pass: Some(pass),
        });
    }
    if let Some(max) = e.p99_added_ms {
        let mut base: Vec<f32> = i
            .samples
            .iter()
            .filter(|s| s.class == Class::Short && s.ok && s.t_ms < 0)
            .map(|s| s.latency_ms)
            .collect();
        let mut during: Vec<f32> = i
            .samples
            .iter()
            .filter(|s| s.class == Class::Short && s.ok && s.t_ms >= 0 && s.t_ms < i.load_end_ms)
            .map(|s| s.latency_ms)
            .collect();
        let (pass, measured) = match (quantile(&mut base, 0.99), quantile(&mut during, 0.99)) {
            (Some(b), Some(d)) => (
                d - b <= max,
                format!(
                    "{:.1} ms (p99 {d:.1} ms vs {b:.1} ms in the warm-up)",
                    d - b
                ),
            ),
            _ => (
                false,
                "no successful short requests in the warm-up or the drill".to_owned(),
            ),
        };
        out.push(Check {
            name: "p99_added_ms".into(),
            expected: format!("<= {max} ms"),
            measured,
            pass: Some(pass),
        });
    }
    if let Some(true) = e.quota_cap_held {
        out.push(quota_cap_held(i));
    }
    if let Some(within) = e.quota_stretched_within {
        out.push(quota_stretched_within(i, within));
    }
    let failed: Vec<String> = i
        .steps
        .iter()
        .filter(|s| !s.ok)
        .map(|s| format!("step {} ({}): {}", s.index, s.action, s.detail))
        .collect();
    out.push(Check {
        name: "steps".into(),
        expected: "every step ran as planned".into(),
        measured: if failed.is_empty() {
            format!("{} of {} ran", i.steps.len(), i.steps.len())
        } else {
            failed.join("; ")
        },
        pass: Some(failed.is_empty()),
    });
    out
}

/// HTTP status of a quota refusal.
const THROTTLED: u16 = 429;

/// Drill tenants with an rpm quota: (index, rpm).
fn rpm_tenants<'a>(i: &'a Inputs<'_>) -> impl Iterator<Item = (usize, u64)> + 'a {
    i.tenant_quotas
        .iter()
        .enumerate()
        .filter_map(|(t, q)| q.rpm.map(|rpm| (t, rpm)))
}

/// The burst a drill tenant's buckets allow: zonegate's default
/// `quota.burst` (the drill's `tenant_quotas` set none).
const BURST_MS: u64 = 5_000;

/// Every rpm quota held over the load: the requests a tenant had admitted
/// (answered, and not with a 429) are at most its rate over the load's
/// span plus the burst its buckets allow: five seconds of the rate, and
/// one request per node (a bucket admits while at most the burst ahead).
fn quota_cap_held(i: &Inputs<'_>) -> Check {
    let span_ms = i.load_end_ms.max(0) as u64;
    let mut pass = true;
    let mut parts = Vec::new();
    for (t, rpm) in rpm_tenants(i) {
        let (mut sent, mut admitted) = (0u64, 0u64);
        for s in i
            .samples
            .iter()
            .filter(|s| s.tenant as usize == t && s.t_ms >= 0 && s.t_ms < i.load_end_ms)
        {
            sent += 1;
            admitted += u64::from(s.status != 0 && s.status != THROTTLED);
        }
        // Saturating: a quota is the operator's number, however large.
        let allowed = rpm
            .saturating_mul(span_ms + BURST_MS)
            .div_ceil(60_000)
            .saturating_add(i.nodes.len() as u64);
        pass &= admitted <= allowed;
        parts.push(format!(
            "drill-{}: {admitted} admitted of {sent} sent in {:.1}s (quota {rpm} rpm: at most {allowed} with the burst)",
            t + 1,
            span_ms as f64 / 1000.0
        ));
    }
    Check {
        name: "quota_cap_held".into(),
        expected: "admitted <= rpm quota × (load + 5 s) + 1 per node".into(),
        measured: parts.join("; "),
        pass: Some(pass),
    }
}

/// The receiving zone's quota stretched: a tenant offered less than its
/// rpm quota is never throttled before the first failover is seen
/// committed, and no more than `within` after it; the load must run at
/// least `within` past the failover for that to be shown.
fn quota_stretched_within(i: &Inputs<'_>, within: std::time::Duration) -> Check {
    let name = "quota_stretched_within".to_owned();
    let expected = format!("<= {} after the failover", fmt_dur(within));
    let under: Vec<usize> = rpm_tenants(i)
        .filter(|(_, rpm)| i.offered_rpm < *rpm as f64)
        .map(|(t, _)| t)
        .collect();
    let commit = i
        .decisions
        .iter()
        .filter(|d| d.kind == "failover")
        .map(|d| d.first_seen_ms)
        .min();
    let (pass, measured) = match commit {
        _ if under.is_empty() => (
            false,
            format!(
                "no tenant is offered less than its rpm quota ({:.0} rpm each)",
                i.offered_rpm
            ),
        ),
        None => (false, "no failover was committed".to_owned()),
        Some(c) => {
            let within_ms = within.as_millis() as i64;
            let mine: Vec<&Sample> = i
                .samples
                .iter()
                .filter(|s| {
                    under.contains(&(s.tenant as usize)) && s.t_ms >= 0 && s.t_ms < i.load_end_ms
                })
                .collect();
            let before = mine
                .iter()
                .filter(|s| s.t_ms < c && s.status == THROTTLED)
                .count();
            let after: Vec<i64> = mine
                .iter()
                .filter(|s| s.t_ms >= c && s.status == THROTTLED)
                .map(|s| s.t_ms)
                .collect();
            let sent_after = mine.iter().filter(|s| s.t_ms >= c).count();
            let took = after.iter().max().map_or(0, |last| last - c);
            let tenants: Vec<String> = under.iter().map(|t| format!("drill-{}", t + 1)).collect();
            let observed = i.load_end_ms - c >= within_ms;
            let pass = before == 0 && took <= within_ms && observed;
            let mut m = format!(
                "{:.2}s ({}: {} of {sent_after} throttled after the failover seen at {:.1}s, {before} before it)",
                took as f64 / 1000.0,
                tenants.join(", "),
                after.len(),
                c as f64 / 1000.0,
            );
            if !observed {
                m.push_str(&format!(
                    "; the load ended {:.1}s after the failover, too soon to show it",
                    (i.load_end_ms - c) as f64 / 1000.0
                ));
            }
            (pass, m)
        }
    };
    Check {
        name,
        expected,
        measured,
        pass: Some(pass),
    }
}

/// One zone's capacity units as the nodes report them (`/admin/v1/quotas`):
/// the zone's declared total and the units in flight to it across every
/// node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneUnits {
    pub total: u64,
    pub used: u64,
}

/// The capacity pre-check (`safety.capacity_check`): everything in flight,
/// in every zone, must fit in the capacity units of the zones the drill
/// leaves serving once the zones in `out` are taken out. Says why not.
pub fn capacity_precheck(
    zones: &BTreeMap<String, ZoneUnits>,
    out: &BTreeSet<String>,
) -> Result<String, String> {
    if out.is_empty() {
        return Ok("the scenario takes no zone out of service: nothing to check".into());
    }
    if let Some(z) = out.iter().find(|z| !zones.contains_key(*z)) {
        return Err(format!("{z} is not a zone the nodes report"));
    }
    let left: Vec<(&String, &ZoneUnits)> =
        zones.iter().filter(|(z, _)| !out.contains(*z)).collect();
    let names = |l: &[(&String, &ZoneUnits)]| {
        l.iter()
            .map(|(z, _)| z.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if left.is_empty() {
        return Err("no zone would be left serving".into());
    }
    let undeclared: Vec<(&String, &ZoneUnits)> =
        left.iter().copied().filter(|(_, u)| u.total == 0).collect();
    if !undeclared.is_empty() {
        return Err(format!(
            "{} declare no capacity units ([[backends]] capacity): the check cannot tell",
            names(&undeclared)
        ));
    }
    let in_flight: u64 = zones.values().map(|u| u.used).sum();
    let room: u64 = left.iter().map(|(_, u)| u.total).sum();
    if in_flight > room {
        Err(format!(
            "{in_flight} units in flight, but {} left serving hold {room}",
            names(&left)
        ))
    } else {
        Ok(format!(
            "{in_flight} units in flight fit in the {room} of {} left serving",
            names(&left)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(t_ms: i64, tenant: u32, status: u16) -> Sample {
        Sample {
            t_ms,
            class: Class::Short,
            entry: 1,
            tenant,
            ok: status == 200,
            status,
            latency_ms: 1.0,
            zone: None,
            version: None,
        }
    }

    fn failover(first_seen_ms: i64) -> Seen {
        Seen {
            version: 1,
            kind: "failover".into(),
            decision: serde_json::Value::Null,
            zones: vec!["az-a".into(), "az-b".into()],
            origin: "manual".into(),
            actor: "drill".into(),
            reason: String::new(),
            at_ms: 0,
            first_seen_ms,
            seen_on: 1,
        }
    }

    /// The checks of `expect` over `samples` of a 30 s load, three nodes,
    /// tenants `quotas`, each offered `offered_rpm`, a failover seen at
    /// `failover_ms` (when given); only the quota checks, by name.
    fn judge(
        expect: &Expect,
        samples: &[Sample],
        quotas: &[TenantQuota],
        offered_rpm: f64,
        failover_ms: Option<i64>,
    ) -> Vec<Check> {
        let decisions: Vec<Seen> = failover_ms.into_iter().map(failover).collect();
        let finals = BTreeMap::new();
        evaluate(&Inputs {
            expect,
            samples,
            load_end_ms: 30_000,
            ticks: &[],
            decisions: &decisions,
            clock_start: None,
            restored_ms: None,
            tenant_quotas: quotas,
            offered_rpm,
            acks: &[],
            finals: &finals,
            nodes: &[1, 2, 3],
            steps: &[],
        })
        .into_iter()
        .filter(|c| c.name.starts_with("quota_"))
        .collect()
    }

    /// Everything in flight must fit in the zones left serving; a zone
    /// left serving without declared capacity cannot be judged.
    #[test]
    fn the_capacity_precheck_fits_what_is_in_flight_into_the_zones_left() {
        let units = |list: &[(&str, u64, u64)]| -> BTreeMap<String, ZoneUnits> {
            list.iter()
                .map(|(z, total, used)| {
                    (
                        z.to_string(),
                        ZoneUnits {
                            total: *total,
                            used: *used,
                        },
                    )
                })
                .collect()
        };
        let out =
            |list: &[&str]| -> BTreeSet<String> { list.iter().map(|z| z.to_string()).collect() };
        let zones = units(&[("az-a", 10, 6), ("az-b", 10, 4), ("az-c", 10, 5)]);
        assert_eq!(
            capacity_precheck(&zones, &out(&["az-a"])),
            Ok("15 units in flight fit in the 20 of az-b, az-c left serving".into())
        );
        assert_eq!(
            capacity_precheck(&zones, &out(&["az-a", "az-b"])),
            Err("15 units in flight, but az-c left serving hold 10".into())
        );
        assert!(capacity_precheck(&zones, &out(&[]))
            .unwrap()
            .contains("nothing to check"));
        assert_eq!(
            capacity_precheck(&zones, &out(&["az-a", "az-b", "az-c"])),
            Err("no zone would be left serving".into())
        );
        assert_eq!(
            capacity_precheck(&zones, &out(&["az-x"])),
            Err("az-x is not a zone the nodes report".into())
        );
        let undeclared = units(&[("az-a", 10, 1), ("az-b", 0, 0), ("az-c", 10, 0)]);
        let e = capacity_precheck(&undeclared, &out(&["az-a"])).unwrap_err();
        assert!(e.starts_with("az-b declare no capacity units"), "{e}");
        // The failed zone's own capacity does not count, declared or not.
        let failed_undeclared = units(&[("az-a", 0, 3), ("az-b", 5, 1)]);
        assert!(capacity_precheck(&failed_undeclared, &out(&["az-a"])).is_ok());
    }

    fn rpm(rpm: u64) -> TenantQuota {
        TenantQuota {
            rpm: Some(rpm),
            ..TenantQuota::default()
        }
    }

    /// 600 rpm over 30 s is 300, plus five seconds (50) and one per node
    /// (3): 353 admitted pass, 354 do not; refusals, unanswered requests
    /// and other tenants do not count.
    #[test]
    fn the_cap_allows_the_rate_over_the_load_plus_the_burst() {
        let expect = Expect {
            quota_cap_held: Some(true),
            ..Expect::default()
        };
        let quotas = [TenantQuota::default(), rpm(600)];
        let mut samples: Vec<Sample> = (0..353).map(|k| sample(k * 84, 1, 200)).collect();
        samples.extend((0..500).map(|k| sample(k * 50, 1, 429)));
        samples.extend((0..50).map(|k| sample(k * 50, 1, 0)));
        samples.extend((0..900).map(|k| sample(k * 30, 0, 200)));
        // Warm-up and after the load: not judged.
        samples.extend((0..100).map(|k| sample(-1 - k, 1, 200)));
        samples.push(sample(30_000, 1, 200));
        let c = judge(&expect, &samples, &quotas, 1800.0, None);
        assert_eq!(c.len(), 1);
        assert!(c[0].passed(), "{}", c[0].measured);
        assert!(
            c[0].measured.contains("drill-2: 353 admitted of 903 sent"),
            "{}",
            c[0].measured
        );
        assert!(c[0].measured.contains("at most 353"), "{}", c[0].measured);
        samples.push(sample(29_999, 1, 200));
        let c = judge(&expect, &samples, &quotas, 1800.0, None);
        assert!(!c[0].passed(), "{}", c[0].measured);
        // A quota too large to multiply out is not a panic: nothing is over it.
        let c = judge(
            &expect,
            &samples,
            &[TenantQuota::default(), rpm(u64::MAX / 2)],
            1800.0,
            None,
        );
        assert!(c[0].passed(), "{}", c[0].measured);
    }

    /// Throttling of a tenant under its quota: after the failover for at
    /// most the budget, never before it, and the load must outlast the
    /// budget; a tenant over its quota is not judged.
    #[test]
    fn the_stretch_is_timed_from_the_failover_for_tenants_under_their_quota() {
        let expect = Expect {
            quota_stretched_within: Some(Duration::from_secs(5)),
            ..Expect::default()
        };
        // drill-1 under its quota (1,800 of 3,000 rpm), drill-2 over (600).
        let quotas = [rpm(3000), rpm(600)];
        let mut samples: Vec<Sample> = (0..600).map(|k| sample(k * 50, 0, 200)).collect();
        samples.extend((0..600).map(|k| sample(k * 50, 1, 429)));
        let stretch = |samples: &[Sample], failover: Option<i64>| {
            let c = judge(&expect, samples, &quotas, 1800.0, failover);
            assert_eq!(c.len(), 1);
            (c[0].passed(), c[0].measured.clone())
        };
        let (pass, m) = stretch(&samples, Some(10_000));
        assert!(
            pass && m.starts_with("0.00s (drill-1: 0 of 400 throttled"),
            "{m}"
        );
        // Throttled for 4.5 s after the failover: within 5 s.
        samples.push(sample(14_500, 0, 429));
        let (pass, m) = stretch(&samples, Some(10_000));
        assert!(pass && m.starts_with("4.50s (drill-1: 1 of 401"), "{m}");
        // ... but not 6 s.
        samples.push(sample(16_000, 0, 429));
        let (pass, m) = stretch(&samples, Some(10_000));
        assert!(!pass && m.starts_with("6.00s"), "{m}");
        samples.pop();
        // Throttled before the failover: the quota did not hold at all.
        samples.push(sample(9_000, 0, 429));
        let (pass, m) = stretch(&samples, Some(10_000));
        assert!(!pass && m.contains(", 1 before it"), "{m}");
        samples.pop();
        // No failover, or one too late to watch for 5 s.
        let (pass, m) = stretch(&samples, None);
        assert!(!pass && m == "no failover was committed", "{m}");
        let (pass, m) = stretch(&samples, Some(26_000));
        assert!(!pass && m.contains("too soon to show it"), "{m}");
        // Every tenant over its quota: nothing to judge.
        let c = judge(&expect, &samples, &[rpm(600)], 1800.0, Some(10_000));
        assert!(!c[0].passed() && c[0].measured.starts_with("no tenant is offered less"));
    }
}
