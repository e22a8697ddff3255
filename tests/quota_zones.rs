//! Black-box test of one global quota across zones (issue 41, item 2):
//! three nodes in three zones, clients at twice the limit split 70/20/10
//! over the zones; the leader rebalances the quota across zones by demand,
//! so the cluster admits the limit, not the hot zone's third of it. Then
//! `ctl decisions` shows the operator's zone decisions by default and the
//! rebalances only with `--all` (issue 42, item 6).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::load::OpenLoop;
use support::*;

const KEY: &str = "test-key-zoned";
const RPM: u64 = 600;
const WARM_UP: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_secs(30);

/// The tenant under test: a global 600 rpm, `zone_share` left out (equal
/// thirds: the starting split).
fn tenant() -> String {
    tenant_toml("zoned", KEY, "P1", &format!("quota = {{ rpm = {RPM} }}"))
}

/// This tenant's rpm allocation per node, from `/admin/v1/quotas`.
fn rpm_by_node(q: &Value) -> Vec<(u64, u64)> {
    let Some(t) = q["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["tenant"] == "zoned"))
    else {
        return Vec::new();
    };
    let mut out: Vec<(u64, u64)> = t["zones"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|z| z["nodes"].as_array().into_iter().flatten())
        .map(|n| {
            (
                n["node"].as_u64().unwrap_or(0),
                n["limits"]["rpm"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

fn kinds(v: &Value) -> Vec<String> {
    v["decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_quota_is_admitted_whole_when_demand_is_uneven_across_zones() {
    let members = MemberSpec::one_per_zone();
    let mut mocks = Vec::new();
    let mut rest = String::new();
    for z in ZONES {
        let m = Mock::start(&format!("{z}-1"), z, &[MODEL]).await;
        rest.push_str(&m.backend_toml(&[MODEL]));
        mocks.push(m);
    }
    rest.push_str(&tenant());
    // The table follows demand to within 2 % of the quota (the default
    // 10 % hysteresis may keep an early table whose two cooler zones tie:
    // `[(1, 390), (2, 105), (3, 105)]` held for 60 s in CI, twice).
    rest.push_str(
        "[failover]\nperiod = \"1s\"\n\n[quotas]\nrebalance_interval = \"1s\"\ndrift_threshold = 0.02\n",
    );
    let mut nodes = Vec::new();
    for m in &members {
        nodes.push(NodeProcess::start_member(m, &members, &rest).await);
    }
    let admin = nodes[0].admin.clone();
    eventually(Duration::from_secs(60), "a leader", || {
        let admin = admin.clone();
        async move {
            get_json(&format!("{admin}/admin/v1/cluster"), Some(ADMIN_TOKEN)).await["leader"]
                .is_u64()
        }
    })
    .await;

    // Twice the limit, 70/20/10 over the zones (one node each).
    let started = Instant::now();
    let data: Vec<&str> = nodes.iter().map(|n| n.data.as_str()).collect();
    let load = OpenLoop::uneven(KEY, &data, RPM);
    tokio::time::sleep(WARM_UP).await;
    // The leader's table follows demand across zones: the hot zone's node
    // holds more than its third. (Waited for, beyond the warm-up, only on
    // a machine too busy to have got there in 10 s.)
    // Each table seen is printed once (the test's output shows on a
    // failure only): a run that never got there says where it stood.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    eventually(
        Duration::from_secs(60),
        "an allocation that follows demand across zones",
        || {
            let (admin, seen) = (admin.clone(), seen.clone());
            async move {
                let q = get_json(&format!("{admin}/admin/v1/quotas"), Some(ADMIN_TOKEN)).await;
                let rpm = rpm_by_node(&q);
                let mut last = seen.lock().unwrap();
                if *last != rpm {
                    eprintln!("{:?} rpm by node: {rpm:?}", started.elapsed());
                    *last = rpm.clone();
                }
                rpm.len() == 3 && rpm[0].1 > RPM / 2 && rpm[0].1 > rpm[1].1 && rpm[1].1 > rpm[2].1
            }
        },
    )
    .await;
    let warm_up = started.elapsed();
    eprintln!("warm-up {warm_up:?}");
    let t = load.measure(WINDOW).await;
    let per_node = t.assert_limit_held(RPM, WINDOW);
    assert!(
        per_node[0] > per_node[1] && per_node[1] > per_node[2] && per_node[2] > 0,
        "the split follows demand: {per_node:?}"
    );

    // 42.6: the rebalances are in `--all`, not in the default listing.
    let zone_only = ctl_json(&admin, &["decisions"]).await;
    assert!(
        !kinds(&zone_only).iter().any(|k| k == "quota_rebalance"),
        "{zone_only}"
    );
    let all = ctl_json(&admin, &["decisions", "--all"]).await;
    assert!(kinds(&all).iter().any(|k| k == "quota_rebalance"), "{all}");
    // An operator's failover, then rebalances after it (the groups
    // changed): the default listing leads with the failover, `--all` with
    // a rebalance newer than it.
    let (code, out, err) = ctl(
        &admin,
        &[
            "failover",
            "--from",
            "az-c",
            "--to",
            "az-a",
            "--reason",
            "quota_zones",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    eventually(
        Duration::from_secs(30),
        "a rebalance after the failover",
        || {
            let admin = admin.clone();
            async move {
                let all = ctl_json(&admin, &["decisions", "--all", "--limit", "100"]).await;
                let newest = &all["decisions"][0];
                let failover = all["decisions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|d| d["kind"] == "failover");
                newest["kind"] == "quota_rebalance"
                    && failover.is_some_and(|f| newest["version"].as_u64() > f["version"].as_u64())
            }
        },
    )
    .await;
    let shown = ctl_json(&admin, &["decisions"]).await;
    assert_eq!(
        kinds(&shown).first().map(String::as_str),
        Some("failover"),
        "{shown}"
    );
    assert!(
        !kinds(&shown).iter().any(|k| k == "quota_rebalance"),
        "{shown}"
    );
    // The human table says the same.
    let (code, table, err) = ctl(&admin, &["decisions"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains("failover") && !table.contains("quota_rebalance"),
        "{table}"
    );
    let (code, table, err) = ctl(&admin, &["decisions", "--all"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains("failover") && table.contains("quota_rebalance"),
        "{table}"
    );
}
