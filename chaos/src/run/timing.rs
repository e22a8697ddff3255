//! When each decision was detected, committed, applied everywhere and
//! moved traffic, from the step that caused it.

use std::collections::BTreeMap;

use crate::history::{self, Ack};
use crate::load;
use crate::observe::Seen;
use crate::report::DecisionTiming;

/// Detect → commit → applied everywhere → traffic moved for one decision,
/// measured from the fault (automatic decisions) or the `ctl` command
/// (operators') that came last before it.
#[allow(clippy::too_many_arguments)]
pub(super) fn timing(
    s: &Seen,
    markers: &[(i64, String, bool)],
    acks: &[Ack],
    ticks: &[history::Tick],
    nodes: &[u64],
    samples: &[load::Sample],
    zone_of: &BTreeMap<u64, String>,
    t0_unix: u64,
) -> DecisionTiming {
    let proposed_ms = s.at_ms as i64 - t0_unix as i64;
    let want_ctl = s.origin != "automatic";
    // An operator's decision is timed from the ctl step whose answer
    // named its version; failing that, from the last step of its kind.
    let acked = acks
        .iter()
        .find(|a| a.version == s.version && a.source.starts_with("ctl step "))
        .map(|a| format!("{} (ctl)", a.source.trim_start_matches("ctl ")));
    let since = acked
        .and_then(|label| markers.iter().find(|(_, l, _)| *l == label).cloned())
        .or_else(|| {
            markers
                .iter()
                .rev()
                .find(|(t, _, is_ctl)| *t <= s.first_seen_ms && *is_ctl == want_ctl)
                .cloned()
        });
    let applied = history::applied_everywhere(ticks, s.version, s.first_seen_ms, nodes);
    // Traffic moved: the first answer routed with this version that
    // entered the zone the decision moved and went where it says (out of
    // the zone after a failover, into it after a failback).
    let first_answer = |zone: &str, away: bool| {
        samples
            .iter()
            .filter(|x| {
                x.ok && x.version.is_some_and(|v| v >= s.version)
                    && zone_of.get(&x.entry).is_some_and(|z| z == zone)
                    && x.zone.as_deref().is_some_and(|z| (z != zone) == away)
            })
            .map(|x| x.t_ms + x.latency_ms as i64)
            .min()
    };
    let moved = match (&s.kind[..], &s.decision) {
        ("failover", d) => first_answer(d["failover"]["from"].as_str().unwrap_or_default(), true),
        ("failback", d) => first_answer(d["failback"]["zone"].as_str().unwrap_or_default(), false),
        _ => None,
    };
    let rel = |t: Option<i64>| match (&since, t) {
        (Some((m, _, _)), Some(t)) => Some(t - m),
        _ => None,
    };
    DecisionTiming {
        version: s.version,
        kind: s.kind.clone(),
        origin: s.origin.clone(),
        zones: s.zones.clone(),
        actor: s.actor.clone(),
        reason: s.reason.clone(),
        proposed_ms,
        first_seen_ms: s.first_seen_ms,
        applied_everywhere_ms: applied,
        traffic_moved_ms: moved,
        since: since
            .as_ref()
            .map(|(t, what, _)| format!("{what} at {:.1}s", *t as f64 / 1000.0)),
        detect_ms: if want_ctl {
            None
        } else {
            rel(Some(proposed_ms))
        },
        commit_ms: rel(Some(s.first_seen_ms)),
        apply_ms: rel(applied),
        traffic_ms: rel(moved),
    }
}
