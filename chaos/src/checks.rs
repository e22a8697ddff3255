//! The expectations of a scenario, judged against what the drill
//! recorded. Pure: everything comes in as values.

use std::collections::BTreeMap;

use crate::history::{self, Ack, Held, Tick};
use crate::load::{Class, Sample};
use crate::observe::Seen;
use crate::report::{quantile, Check, StepRecord};
use crate::scenario::{fmt_dur, Expect};

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
                pass,
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
            pass,
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
            pass: failovers.is_empty(),
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
            pass: violations.is_empty(),
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
            pass,
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
            pass,
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
            pass,
        });
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
        pass: failed.is_empty(),
    });
    out
}
