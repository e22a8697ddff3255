//! `GET /admin/v1/outlook`: what the automation is about to do, per zone
//! (bad periods out of `min_periods`, dwell left, a one-line "next"), and
//! the failover target the leader's detector would pick for each zone
//! (`zonegate ctl status`, and `ctl failover --from Z` without `--to`).
//!
//! Read-only and derived from what the control plane already exposes: the
//! failover config, the leader's latest assessment (`failover_status`) and
//! the applied state's per-zone control facts. The target is the
//! detector's own choice (`zonegate_cluster::failover_target`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use zonegate_cluster::{
    failover_target, Automation, FailoverConfig, ZoneControl, ZoneHealth, ZoneId, ZoneStatus,
};

use crate::clock::unix_ms;
use crate::node::gateway::Gateway;

/// `GET /admin/v1/outlook`.
pub async fn outlook(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let Some(node) = &gw.cluster else {
        return Json(json!({"control_plane": "standalone", "zones": {}}));
    };
    let state = node.state_snapshot();
    let status = node.failover_status();
    let controls: BTreeMap<ZoneId, ZoneControl> = state
        .zones()
        .keys()
        .map(|z| (z.clone(), state.zone_control(z)))
        .collect();
    let input = Input {
        cfg: &node.failover_config(),
        health: &status.zones,
        zones: state.zones(),
        controls: &controls,
        automation: state.automation(),
        auto_failed_over: state.auto_failed_over().len(),
        now_ms: unix_ms(),
    };
    let mut v = assess(&input);
    if status.assessed_here {
        v["traffic"] = traffic(
            &status.zones,
            &status.zone_requests,
            millis(input.cfg.period),
        );
    }
    Json(v)
}

/// Where traffic went in the period the leader assessed last, from every
/// node's report: per zone the requests, requests/s, share of all requests
/// and the gateway error and timeout rates. Only the leader has it.
pub fn traffic(health: &[ZoneHealth], requests: &BTreeMap<ZoneId, u64>, period_ms: u64) -> Value {
    let total: u64 = requests.values().sum();
    let zones: serde_json::Map<String, Value> = requests
        .iter()
        .map(|(zone, n)| {
            let h = health.iter().find(|h| &h.zone == zone);
            let per_s = if period_ms == 0 {
                0.0
            } else {
                *n as f64 * 1000.0 / period_ms as f64
            };
            let share = if total == 0 {
                0.0
            } else {
                *n as f64 / total as f64
            };
            (
                zone.to_string(),
                json!({
                    "requests": n,
                    "requests_per_s": per_s,
                    "share": share,
                    "gw_error_rate": h.and_then(|h| h.gw_error_rate),
                    "timeout_rate": h.and_then(|h| h.timeout_rate),
                }),
            )
        })
        .collect();
    json!({"period_ms": period_ms, "zones": zones})
}

/// Everything [`assess`] reads; no clock, no I/O.
pub struct Input<'a> {
    pub cfg: &'a FailoverConfig,
    pub health: &'a [ZoneHealth],
    pub zones: &'a BTreeMap<ZoneId, ZoneStatus>,
    pub controls: &'a BTreeMap<ZoneId, ZoneControl>,
    pub automation: Automation,
    pub auto_failed_over: usize,
    pub now_ms: u64,
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The outlook as JSON: the detector's parameters, and per zone its score,
/// bad periods, dwell left, failover target and "next" line.
pub fn assess(i: &Input<'_>) -> Value {
    let cfg = i.cfg;
    let period_ms = millis(cfg.period);
    let dwell_ms = millis(cfg.dwell);
    let health = |z: &ZoneId| i.health.iter().find(|h| &h.zone == z);
    let target = |from: &ZoneId| failover_target(cfg, i.zones, i.health, from);
    let frozen = i.automation == Automation::Frozen;
    let at_limit = i.auto_failed_over >= cfg.max_auto_failed_over as usize;
    let mut zones = serde_json::Map::new();
    for (zone, st) in i.zones {
        let h = health(zone);
        let bad = h.map_or(0, |h| h.bad_periods);
        let control = i.controls.get(zone).cloned().unwrap_or_default();
        let dwell_left_ms = [control.last_auto_ms, control.last_operator_ms]
            .into_iter()
            .flatten()
            .map(|t| dwell_ms.saturating_sub(i.now_ms.saturating_sub(t)))
            .max()
            .unwrap_or(0);
        let to = target(zone);
        let next = next_line(&Next {
            zone,
            status: st,
            bad,
            min_periods: cfg.min_periods,
            period_ms,
            dwell_left_ms,
            target: to.as_ref(),
            enabled: cfg.enabled,
            frozen,
            at_limit,
            auto_failback: cfg.auto_failback,
            operator_failed_over: control.failed_over_by
                == Some(zonegate_cluster::Origin::Operator),
        });
        zones.insert(
            zone.to_string(),
            json!({
                "status": st.name(),
                "score": h.and_then(|h| h.score),
                "bad_periods": bad,
                "good_periods": h.map_or(0, |h| h.good_periods),
                "min_periods": cfg.min_periods,
                "dwell_left_ms": dwell_left_ms,
                "failover_target": to.as_ref().map(ZoneId::as_str),
                "next": next,
            }),
        );
    }
    json!({
        "automation": i.automation.name(),
        "enabled": cfg.enabled,
        "cutoff": cfg.cutoff,
        "min_periods": cfg.min_periods,
        "period_ms": period_ms,
        "dwell_ms": dwell_ms,
        "max_auto_failed_over": cfg.max_auto_failed_over,
        "auto_failed_over": i.auto_failed_over,
        "zones": zones,
    })
}

struct Next<'a> {
    zone: &'a ZoneId,
    status: &'a ZoneStatus,
    bad: u32,
    min_periods: u32,
    period_ms: u64,
    dwell_left_ms: u64,
    target: Option<&'a ZoneId>,
    enabled: bool,
    frozen: bool,
    at_limit: bool,
    auto_failback: bool,
    operator_failed_over: bool,
}

/// One line saying what the automation will do to this zone next.
fn next_line(n: &Next<'_>) -> String {
    let zone = n.zone;
    if !n.enabled {
        return "automatic failover off: operators only".into();
    }
    if n.frozen {
        return "frozen: operators only".into();
    }
    match n.status {
        ZoneStatus::Draining => "draining: no automatic decision".into(),
        ZoneStatus::FailedOver { target } => {
            if n.operator_failed_over || !n.auto_failback {
                format!("failed over to {target}: an operator fails it back (`ctl failback --zone {zone}`)")
            } else {
                format!("failed over to {target}: fails back automatically once healthy")
            }
        }
        ZoneStatus::Active if n.bad == 0 => "healthy: nothing planned".into(),
        ZoneStatus::Active => {
            let count = format!("{} of {} bad periods", n.bad, n.min_periods);
            let Some(to) = n.target else {
                return format!(
                    "{count}; no healthy zone to fail over to: would stay (fail static)"
                );
            };
            if n.at_limit {
                return format!("{count}; automatic failover limit reached: operators only");
            }
            let periods = u64::from(n.min_periods.saturating_sub(n.bad));
            let eta = (periods * n.period_ms).max(n.dwell_left_ms);
            let when = if eta == 0 {
                "at the next assessment".to_owned()
            } else {
                format!("in ~{}", human_ms(eta))
            };
            let dwell = if n.dwell_left_ms > periods * n.period_ms {
                format!(" (dwell {} left)", human_ms(n.dwell_left_ms))
            } else {
                String::new()
            };
            format!("{count}; will fail over to {to} {when}{dwell} unless it recovers")
        }
    }
}

/// A short human duration (`850ms`, `4s`, `2m10s`, `1h05m`), as `ctl`
/// prints them; a copy of `cli::ctl::human_ms`, since `admin` sits below
/// `cli` in the layering and must not import it.
fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(zone: &str, score: f64, bad: u32) -> ZoneHealth {
        ZoneHealth {
            zone: ZoneId::new(zone),
            score: Some(score),
            gw_error_rate: None,
            timeout_rate: None,
            gpu_health: None,
            bad_periods: bad,
            good_periods: 0,
            reporters: 1,
            silent: false,
            period_end_ms: Some(1_000),
        }
    }

    fn run(automation: Automation, controls: BTreeMap<ZoneId, ZoneControl>) -> Value {
        let cfg = FailoverConfig {
            period: std::time::Duration::from_secs(2),
            min_periods: 3,
            ..FailoverConfig::default()
        };
        let zones: BTreeMap<ZoneId, ZoneStatus> = ["az-a", "az-b", "az-c"]
            .iter()
            .map(|z| (ZoneId::new(z), ZoneStatus::Active))
            .collect();
        let h = [
            health("az-a", 0.1, 2),
            health("az-b", 0.9, 0),
            health("az-c", 0.8, 0),
        ];
        assess(&Input {
            cfg: &cfg,
            health: &h,
            zones: &zones,
            controls: &controls,
            automation,
            auto_failed_over: 0,
            now_ms: 100_000,
        })
    }

    #[test]
    fn traffic_gives_each_zone_its_rate_share_and_errors() {
        let (a, b) = (ZoneId::new("az-a"), ZoneId::new("az-b"));
        let mut h = zonegate_cluster::ZoneHealth {
            zone: a.clone(),
            score: Some(0.9),
            gw_error_rate: Some(0.25),
            timeout_rate: Some(0.0),
            gpu_health: Some(1.0),
            bad_periods: 0,
            good_periods: 3,
            reporters: 3,
            silent: false,
            period_end_ms: Some(2_000),
        };
        let mut hb = h.clone();
        hb.zone = b.clone();
        hb.gw_error_rate = None;
        h.timeout_rate = Some(0.5);
        let requests = BTreeMap::from([(a, 30), (b, 10)]);
        let v = traffic(&[h, hb], &requests, 2_000);
        assert_eq!(v["zones"]["az-a"]["requests_per_s"], 15.0);
        assert_eq!(v["zones"]["az-a"]["share"], 0.75);
        assert_eq!(v["zones"]["az-a"]["gw_error_rate"], 0.25);
        assert_eq!(v["zones"]["az-b"]["share"], 0.25);
        assert!(v["zones"]["az-b"]["gw_error_rate"].is_null());
        let none = traffic(&[], &BTreeMap::from([(ZoneId::new("az-a"), 0)]), 0);
        assert_eq!(none["zones"]["az-a"]["share"], 0.0);
    }

    #[test]
    fn failing_zone_says_when_and_where() {
        let v = run(Automation::Auto, BTreeMap::new());
        assert_eq!(v["zones"]["az-a"]["failover_target"], "az-b");
        assert_eq!(
            v["zones"]["az-a"]["next"],
            "2 of 3 bad periods; will fail over to az-b in ~2s unless it recovers"
        );
        assert_eq!(v["zones"]["az-b"]["failover_target"], "az-c");
        assert_eq!(v["zones"]["az-b"]["next"], "healthy: nothing planned");
    }

    #[test]
    fn frozen_and_dwell() {
        let v = run(Automation::Frozen, BTreeMap::new());
        assert_eq!(v["zones"]["az-a"]["next"], "frozen: operators only");
        let controls = BTreeMap::from([(
            ZoneId::new("az-a"),
            ZoneControl {
                last_operator_ms: Some(90_000),
                ..ZoneControl::default()
            },
        )]);
        let v = run(Automation::Auto, controls);
        // Default dwell 60 s, decided 10 s ago: 50 s left.
        assert_eq!(v["zones"]["az-a"]["dwell_left_ms"], 50_000);
        let next = v["zones"]["az-a"]["next"].as_str().unwrap_or_default();
        assert!(next.contains("in ~50s (dwell 50s left)"), "{next}");
    }
}
