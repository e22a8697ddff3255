//! `GET /admin/v1/quotas`: per tenant and zone, the global limit, the zone
//! share, the burst, the allocation per node (with overflow after a
//! failover), this node's usage and what is left of its minute, and the
//! decision version the allocations were computed from; plus this node's
//! share of each zone's capacity units.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use zonegate_cluster::Limits;

use crate::clock::now_ns;
use crate::node::gateway::Gateway;

/// The reasons of `zonegate_quota_rejected_total`, in display order.
const REASONS: &[&str] = &[
    "rpm",
    "tpm",
    "concurrency",
    "model_rpm",
    "model_tpm",
    "shed_p2",
    "shed_p1",
    "capacity_full",
];

pub async fn quotas(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let view = gw.view.borrow().clone();
    gw.quotas.load().refresh(&view);
    Json(report(&gw))
}

/// The answer, from the allocations last computed (see `Quotas::refresh`).
pub fn report(gw: &Gateway) -> Value {
    let q = gw.quotas.load();
    let table = q.table.load();
    let now = now_ns();
    let tenants: Vec<Value> = q
        .tenants
        .iter()
        .zip(table.tenants.iter())
        .enumerate()
        .map(|(index, (t, (allocs, overflows)))| {
            let mut zones: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
            for a in allocs {
                zones.entry(a.zone.as_str()).or_default().push(json!({
                    "node": a.node,
                    "limits": limits(&a.limits, &t.quota.global),
                }));
            }
            let zones: Vec<Value> = zones
                .into_iter()
                .map(|(zone, nodes)| {
                    let from: Vec<&str> = overflows
                        .iter()
                        .filter(|o| o.to.as_str() == zone)
                        .map(|o| o.from.as_str())
                        .collect();
                    json!({
                        "zone": zone,
                        "share": t.quota.shares.get(&zonegate_cluster::ZoneId::new(zone)).copied().unwrap_or(0.0),
                        "mode": if from.is_empty() { "normal" } else { "soft_limit" },
                        "overflow_from": from,
                        "nodes": nodes,
                    })
                })
                .collect();
            let rejected: serde_json::Map<String, Value> = REASONS
                .iter()
                .map(|r| {
                    let n = gw
                        .metrics
                        .quota_rejected
                        .with_label_values(&[t.quota.tenant.as_str(), r])
                        .get();
                    ((*r).to_owned(), json!(n))
                })
                .filter(|(_, n)| n.as_u64() != Some(0))
                .collect();
            let since_of = |o: &zonegate_cluster::quota::Overflow| {
                table
                    .overflow_since
                    .get(&(index, o.from.clone()))
                    .copied()
                    .unwrap_or(table.decision_version)
            };
            let remaining = |b: &crate::dataplane::quota::Gcra| {
                b.state(now).map(|(limit, remaining, reset_ns)| {
                    json!({"limit": limit, "remaining": remaining, "reset_ms": reset_ns / 1_000_000})
                })
            };
            json!({
                "tenant": t.quota.tenant,
                "priority": t.quota.priority.name(),
                "limited": t.limited(),
                // How much of a minute's allocation may go at once.
                "burst_ms": t.rpm.tolerance() / 1_000_000,
                "global": t.quota.global,
                "zone_share": t.quota.shares,
                "zones": zones,
                "overflow": overflows.iter().map(|o| json!({
                    "from": o.from,
                    "to": o.to,
                    "mode": "soft_limit",
                    "moved": o.moved,
                    "since_version": since_of(o),
                "line": o.line(since_of(o)),
                })).collect::<Vec<_>>(),
                "usage": {
                    "node": gw.cfg().node.id,
                    "in_flight": t.concurrency.used(),
                    "admitted_total": gw.metrics.quota_admitted.with_label_values(&[&t.quota.tenant]).get(),
                    "rejected_total": rejected,
                    "requests": remaining(&t.rpm),
                    "tokens": remaining(&t.tpm),
                },
            })
        })
        .collect();
    let capacity: Vec<Value> = q
        .zones
        .iter()
        .map(|(zone, c)| {
            let held = c.held();
            json!({
                "zone": zone,
                "total_units": c.total,
                "node_share_units": c.share.load(std::sync::atomic::Ordering::Relaxed),
                "used_units": held.total(),
                "used_units_by_priority": {"P0": held.p0, "P1": held.p1, "P2": held.p2},
                "waiting": c.waiting(),
            })
        })
        .collect();
    json!({
        "node": gw.cfg().node.id,
        "zone": gw.cfg().node.zone,
        "decision_version": table.decision_version,
        "settings": {
            "long_request_units": gw.cfg().quotas.long_request_units,
            "p0_reserve": gw.cfg().quotas.p0_reserve,
            "queue_timeout_ms": gw.cfg().quotas.queue_timeout.as_millis() as u64,
            "rebalance_interval_ms": gw.cfg().quotas.rebalance_interval.as_millis() as u64,
            "drift_threshold": gw.cfg().quotas.drift_threshold,
            "node_floor": gw.cfg().quotas.node_floor,
        },
        "tenants": tenants,
        "capacity": capacity,
    })
}

/// A node's allocation, with `null` for the units the tenant does not
/// limit at all.
fn limits(l: &Limits, global: &Limits) -> Value {
    if global.is_unlimited() {
        return json!(null);
    }
    json!(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::telemetry::metrics::Metrics;
    use tokio::sync::watch;
    use zonegate_cluster::{ClusterView, ZoneId, ZoneStatus};

    #[test]
    fn the_report_shows_shares_allocations_and_overflow() {
        let text = r#"
            [node]
            id = 1
            zone = "az-a"
            listen = "127.0.0.1:0"
            admin_listen = "127.0.0.1:0"
            data_dir = "d"

            [[tenants]]
            name = "deptA"
            key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
            priority = "P0"
            quota = { rpm = 600 }
            zone_share = { az-a = 0.75, az-b = 0.25 }

            [[backends]]
            name = "a1"
            zone = "az-a"
            url = "http://127.0.0.1:8000"
            models = ["m"]

            [[backends]]
            name = "b1"
            zone = "az-b"
            url = "http://127.0.0.1:8001"
            models = ["m"]
        "#;
        let cfg = Arc::new(Config::parse("t.toml", text).unwrap());
        let (a, b) = (ZoneId::new("az-a"), ZoneId::new("az-b"));
        let mut view = ClusterView::initial([&a, &b]);
        let (tx, rx) = watch::channel(Arc::new(view.clone()));
        let gw = Gateway::new(
            cfg,
            rx,
            None,
            zonegate_net::sign::KeyRing::random(zonegate_net::sign::Purpose::Pin),
            Metrics::new(),
        );
        let r = report(&gw);
        assert_eq!(r["tenants"][0]["global"]["rpm"], 600);
        assert_eq!(
            r["tenants"][0]["zones"][0]["nodes"][0]["limits"]["rpm"],
            450
        );
        assert_eq!(r["tenants"][0]["zones"][0]["mode"], "normal");
        view.decision_version = 3;
        view.zones
            .insert(b.clone(), ZoneStatus::FailedOver { target: a.clone() });
        tx.send_replace(Arc::new(view.clone()));
        gw.quotas.load().refresh(&view);
        let r = report(&gw);
        let zone = &r["tenants"][0]["zones"][0];
        assert_eq!(zone["zone"], "az-a");
        assert_eq!(zone["mode"], "soft_limit");
        assert_eq!(zone["overflow_from"][0], "az-b");
        assert_eq!(zone["nodes"][0]["limits"]["rpm"], 600);
        assert_eq!(r["decision_version"], 3);
        assert_eq!(
            r["tenants"][0]["overflow"][0]["line"],
            "cross_zone overflow tenant=deptA from=az-b to=az-a mode=soft_limit priority=P0 version=3"
        );
    }
}
