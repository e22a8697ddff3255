//! Black-box test of budgets across zones (issue 46, item 3): three nodes
//! in three zones, one tenant with a daily budget, load 70/20/10 over the
//! zones. The leader splits the budget over the nodes by spend in its
//! rebalances; spending stops within 2 % of the budget cluster-wide (the
//! sum of every answered request's cost), then every node answers 429
//! `budget_exceeded` with `Retry-After` to midnight UTC. The leader is
//! killed (and restarted) mid-run: the spend re-granted stays within the
//! documented bound. A tenant with `on_budget = "cheapest"` goes to the
//! cheaper model instead. A shadow's copies are priced at their target
//! backend's price and counted apart, never charged to the budget.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::*;

const CAPPED_KEY: &str = "test-key-capped";
const FRUGAL_KEY: &str = "test-key-frugal";
const SMALL: &str = "qwen-small";
/// Output tokens per request (the mock answers exactly this many) at 1000
/// units per million output tokens: 0.008 units a request, prompt free.
const MAX_TOKENS: u64 = 8;
const COST: f64 = 0.008;
/// 300 requests' worth.
const BUDGET: f64 = 2.4;
/// Requests per second over all nodes, split 70/20/10.
const RATE: f64 = 30.0;
const SHARES: [f64; 3] = [0.7, 0.2, 0.1];
/// The leader's rebalance interval (and the report period).
const INTERVAL_S: f64 = 0.5;

fn rest(mocks: &[Mock]) -> String {
    let mut rest = String::new();
    for m in mocks {
        rest.push_str(&m.backend_toml(&[MODEL, SMALL]));
    }
    rest.push_str(&format!(
        r#"
[[models]]
name = "{MODEL}"
fallback = ["{SMALL}"]
price = {{ input_per_mtok = 0.0, output_per_mtok = 1000.0 }}

[[models]]
name = "{SMALL}"
price = {{ input_per_mtok = 0.0, output_per_mtok = 10.0 }}

[[tenants]]
name = "capped"
key_sha256 = "{capped}"
budget = {{ per_day = {BUDGET} }}

[[tenants]]
name = "frugal"
key_sha256 = "{frugal}"
budget = {{ per_day = 0.02 }}
on_budget = "cheapest"

[failover]
period = "500ms"

[quotas]
rebalance_interval = "500ms"
"#,
        capped = zonegate::config::sha256_hex(CAPPED_KEY),
        frugal = zonegate::config::sha256_hex(FRUGAL_KEY),
    ));
    rest
}

/// Open-loop load to each node's current address at its share of
/// [`RATE`]; counts the answers with 200 per node.
struct Load {
    urls: Arc<Mutex<Vec<String>>>,
    ok: Arc<Mutex<[u64; 3]>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(urls: Vec<String>) -> Load {
        let urls = Arc::new(Mutex::new(urls));
        let ok = Arc::new(Mutex::new([0u64; 3]));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..3)
            .map(|i| {
                let (urls, ok, stop) = (Arc::clone(&urls), Arc::clone(&ok), Arc::clone(&stop));
                tokio::spawn(async move {
                    let every = Duration::from_secs_f64(1.0 / (RATE * SHARES[i]));
                    let mut tick = tokio::time::interval(every);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let c = client();
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let url = format!("{}/v1/chat/completions", urls.lock().unwrap()[i]);
                        let (c, ok) = (c.clone(), Arc::clone(&ok));
                        tokio::spawn(async move {
                            let r = c
                                .post(url)
                                .bearer_auth(CAPPED_KEY)
                                .json(&chat_body(MAX_TOKENS, false))
                                .send()
                                .await;
                            if let Ok(r) = r {
                                if r.status() == 200 && r.bytes().await.is_ok() {
                                    ok.lock().unwrap()[i] += 1;
                                }
                            }
                        });
                    }
                })
            })
            .collect();
        Load {
            urls,
            ok,
            stop,
            tasks,
        }
    }

    /// What the answered requests cost, in units.
    fn spent(&self) -> f64 {
        self.ok.lock().unwrap().iter().sum::<u64>() as f64 * COST
    }

    async fn stop(self) -> [u64; 3] {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        // Let the last answers arrive.
        tokio::time::sleep(Duration::from_secs(2)).await;
        *self.ok.lock().unwrap()
    }
}

/// The cluster-wide budget line of "capped" on `admin`: (granted,
/// recorded spent), in units.
async fn line(admin: &str) -> (f64, f64) {
    let v = get_json(
        &format!("{admin}/admin/v1/spend?tenant=capped"),
        Some(ADMIN_TOKEN),
    )
    .await;
    let p = &v["budgets"][0]["periods"][0];
    (
        p["granted"].as_f64().unwrap_or(0.0),
        p["recorded_spent"].as_f64().unwrap_or(0.0),
    )
}

/// Seconds until the next midnight UTC.
fn to_midnight() -> u64 {
    86_400 - zonegate::clock::unix_s() % 86_400
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_budget_holds_across_zones_through_a_leader_kill() {
    let members: Vec<MemberSpec> = ZONES
        .iter()
        .enumerate()
        .map(|(i, z)| MemberSpec::new(i as u64 + 1, z))
        .collect();
    let mut mocks = Vec::new();
    for z in ZONES {
        mocks.push(Mock::start(&format!("{z}-1"), z, &[MODEL, SMALL]).await);
    }
    let rest = rest(&mocks);
    let mut nodes: Vec<Option<NodeProcess>> = Vec::new();
    for m in &members {
        nodes.push(Some(NodeProcess::start_member(m, &members, &rest).await));
    }
    let node = |nodes: &[Option<NodeProcess>], i: usize| -> String {
        nodes[i].as_ref().unwrap().admin.clone()
    };
    let leader_of = |admin: String| async move {
        get_json(&format!("{admin}/admin/v1/cluster"), Some(ADMIN_TOKEN)).await["leader"].as_u64()
    };
    let a0 = node(&nodes, 0);
    eventually(Duration::from_secs(60), "a leader", || {
        let a0 = a0.clone();
        async move { leader_of(a0).await.is_some() }
    })
    .await;

    let load = Load::start(
        nodes
            .iter()
            .map(|n| n.as_ref().unwrap().data.clone())
            .collect(),
    );
    // Mid-run, kill the leader and start it again on its data.
    eventually(Duration::from_secs(60), "40 % of the budget spent", || {
        let s = load.spent();
        async move { s >= 0.4 * BUDGET }
    })
    .await;
    let leader = leader_of(node(&nodes, 0)).await.unwrap();
    let li = (leader - 1) as usize;
    let (granted, recorded) = line(&node(&nodes, li)).await;
    let dir = nodes[li].take().unwrap().kill_keeping_data().await;
    let restarted = NodeProcess::start_member_in(dir, &members[li], &members, &rest).await;
    load.urls.lock().unwrap()[li] = restarted.data.clone();
    nodes[li] = Some(restarted);

    // Until spending stops: 3 s without a new answered request.
    let mut last = (load.spent(), tokio::time::Instant::now());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(75);
    while last.1.elapsed() < Duration::from_secs(3) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "spending did not stop: {} of {BUDGET}",
            load.spent()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = load.spent();
        if now > last.0 {
            last = (now, tokio::time::Instant::now());
        }
    }
    let per_node = load.stop().await;
    let spent = per_node.iter().sum::<u64>() as f64 * COST;
    // The documented bound of what a restart re-grants: the unspent rest
    // of the node's grant at the last rebalance, at most its floor share
    // or twice its spend in one rebalance interval.
    let floor = 0.01 * BUDGET / 3.0;
    let bound = floor.max(2.0 * RATE * SHARES[li] * COST * INTERVAL_S);
    eprintln!(
        "spent {spent:.3} of {BUDGET} per node {per_node:?}; leader {leader} killed with \
         {:.3} granted and {:.3} recorded; re-grant bound {bound:.3}",
        granted, recorded
    );
    assert!(
        spent >= 0.98 * BUDGET,
        "spending stopped at {spent} of {BUDGET}: more than 2 % short"
    );
    assert!(
        spent <= BUDGET + bound + 3.0 * COST,
        "spent {spent} of {BUDGET}: more than the restart's re-grant bound {bound}"
    );

    // Over budget on every node: 429 budget_exceeded, Retry-After to the
    // end of the UTC day, once the whole budget is granted.
    for (i, n) in nodes.iter().enumerate() {
        let data = n.as_ref().unwrap().data.clone();
        let seen = Arc::new(Mutex::new(None));
        eventually(Duration::from_secs(20), "429 to midnight", || {
            let (data, seen) = (data.clone(), Arc::clone(&seen));
            async move {
                let r = client()
                    .post(format!("{data}/v1/chat/completions"))
                    .bearer_auth(CAPPED_KEY)
                    .json(&chat_body(MAX_TOKENS, false))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let after: u64 = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(0);
                let body: Value = r.json().await.unwrap_or_default();
                *seen.lock().unwrap() = Some((status, after, body.clone()));
                status == 429
                    && body["error"]["code"] == "budget_exceeded"
                    && after.abs_diff(to_midnight()) <= 60
            }
        })
        .await;
        eprintln!("node {}: {:?}", i + 1, seen.lock().unwrap());
    }

    // The cheapest model instead, for a tenant that asks for it: its
    // budget (0.02) holds two requests of the dear model at most.
    let data = nodes[0].as_ref().unwrap().data.clone();
    let mut routes = Vec::new();
    for _ in 0..6 {
        let r = client()
            .post(format!("{data}/v1/chat/completions"))
            .bearer_auth(FRUGAL_KEY)
            .json(&chat_body(MAX_TOKENS, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "over budget, it is routed, not refused");
        routes.push(
            r.headers()
                .get("x-zonegate-route")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert!(
        routes.last().unwrap().contains("budget:cheapest"),
        "{routes:?}"
    );
    let metrics = nodes[0].as_ref().unwrap().metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "zonegate_spend_total",
            &["tenant=\"frugal\"", &format!("model=\"{SMALL}\"")]
        ) > 0.0,
        "the cheap model's spend is counted"
    );
    assert!(
        metric_sum(
            &metrics,
            "zonegate_model_answers_total",
            &["link=\"budget\""]
        ) > 0.0
    );
    // ctl spend shows the node's spend per tenant and model.
    let (code, out, err) = ctl(
        &nodes[0].as_ref().unwrap().admin,
        &["spend", "--since", "1h"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("frugal") && out.contains(SMALL), "{out}");
    for n in nodes.into_iter().flatten() {
        n.kill().await;
    }
}

/// The shadow's target model: its backend charges 3000 per million output
/// tokens (an override of the model's 2000), so a copy costs 0.024.
const NEW: &str = "qwen3-8b-instruct";
const COPY_COST: f64 = 0.024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_copy_is_priced_apart_and_never_charged_to_the_budget() {
    let primary = Mock::start("prim-1", "az-a", &[MODEL]).await;
    let target = Mock::start("cand-1", "az-a", &[NEW]).await;
    // 12 client answers' worth (0.096) and less than a 13th; the 12
    // copies (0.288) would exhaust it three times over.
    let rest = format!(
        r#"{}{}
[[models]]
name = "{MODEL}"
price = {{ input_per_mtok = 0.0, output_per_mtok = 1000.0 }}

[[models]]
name = "{NEW}"
price = {{ input_per_mtok = 0.0, output_per_mtok = 2000.0 }}

[[tenants]]
name = "capped"
key_sha256 = "{}"
budget = {{ per_day = 0.1 }}

[[shadows]]
name = "sh"
model = "{MODEL}"
to = "{NEW}"
percent = 100.0
"#,
        primary.backend_toml(&[MODEL]),
        target.backend_toml(&[NEW]).replacen(
            "metrics_path",
            "price = { input_per_mtok = 0.0, output_per_mtok = 3000.0 }\nmetrics_path",
            1
        ),
        zonegate::config::sha256_hex(CAPPED_KEY),
    );
    let node = NodeProcess::start("az-a", &rest).await;
    let c = client();
    let ask = || {
        c.post(format!("{}/v1/chat/completions", node.data))
            .bearer_auth(CAPPED_KEY)
            .json(&chat_body(MAX_TOKENS, false))
            .send()
    };
    let compared = |n: u64| {
        let node = &node;
        async move {
            let v = node.admin_get("/admin/v1/shadows/sh").await;
            v["compared"] == n && v["ok"] == n
        }
    };
    for round in 1..=2u64 {
        for _ in 0..6 {
            let r = ask().await.unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        }
        // Every copy so far is answered and priced before the next
        // requests: had the budget been charged for them, it would refuse.
        eventually(Duration::from_secs(30), "the copies are compared", || {
            compared(6 * round)
        })
        .await;
    }
    let r = ask().await.unwrap();
    assert_eq!(r.status(), 429, "the 13th answer is over the budget");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "budget_exceeded", "{v}");
    let shadows = node.admin_get("/admin/v1/shadows").await;
    assert_eq!(
        shadows["shadows"][0]["sent"], 12,
        "a request refused for its budget sends no copy: {shadows}"
    );

    let close = |got: f64, want: f64| (got - want).abs() < 1e-9;
    let metrics = node.metrics().await;
    let client_spend = metric_sum(&metrics, "zonegate_spend_total", &["tenant=\"capped\""]);
    let shadow_spend = metric_sum(
        &metrics,
        "zonegate_shadow_spend_total",
        &[
            "shadow=\"sh\"",
            &format!("model=\"{NEW}\""),
            "zone=\"az-a\"",
        ],
    );
    assert!(close(client_spend, 12.0 * COST), "{client_spend}");
    assert!(close(shadow_spend, 12.0 * COPY_COST), "{shadow_spend}");
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_spend_total",
            &[&format!("model=\"{NEW}\"")]
        ),
        0.0,
        "a copy is not a tenant's spend"
    );
    assert!(
        close(
            shadows["shadows"][0]["spend"].as_f64().unwrap(),
            12.0 * COPY_COST
        ),
        "{shadows}"
    );
    let spend = node.admin_get("/admin/v1/spend?since=1h").await;
    assert_eq!(spend["node_spend"].as_array().unwrap().len(), 1, "{spend}");
    assert!(
        close(
            spend["node_spend"][0]["spend"].as_f64().unwrap(),
            12.0 * COST
        ),
        "{spend}"
    );
    let sh = &spend["shadow_spend"][0];
    assert_eq!(sh["shadow"], "sh", "{spend}");
    assert_eq!(sh["models"][0]["model"], NEW, "{spend}");
    assert!(
        close(sh["spend"].as_f64().unwrap(), 12.0 * COPY_COST),
        "{spend}"
    );
    let out = ctl_ok(&node.admin, &["spend", "--since", "1h"]).await;
    assert!(
        out.contains("shadow copies on this node") && out.contains("0.288000 USD"),
        "{out}"
    );
    let out = ctl_ok(&node.admin, &["shadows"]).await;
    assert!(out.contains("SPEND") && out.contains("0.288000"), "{out}");
    node.kill().await;
}
