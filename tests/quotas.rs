//! Black-box tests of quotas: OpenAI's 429 and rate-limit headers, a
//! tenant's burst, unknown models counted (one label, against rpm), token
//! charges corrected by a stream's usage, three nodes sharing one tenant's
//! limit by demand, a failover with a P0 and a P2 tenant (overflow,
//! shedding, failback), and the priority wait for a zone's units.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const BULK_KEY: &str = "test-key-bulk";
const SCORED_KEY: &str = "test-key-scored";

/// The base config (tenant deptA, P0, with `deptA_quota` lines), as
/// member `me` of `members` when there are any, plus `rest`.
fn config(
    dir: &std::path::Path,
    zone: &str,
    me: Option<(&MemberSpec, &[MemberSpec])>,
    dept_a_quota: &str,
    rest: &str,
) -> String {
    let mut base = base_toml(zone, &dir.join("data"), "").replacen(
        "priority = \"P0\"\n",
        &format!("priority = \"P0\"\n{dept_a_quota}\n"),
        1,
    );
    if let Some((me, members)) = me {
        base = base
            .replace("id = 1\n", &format!("id = {}\n", me.id))
            .replace(
                "admin_listen = \"127.0.0.1:0\"",
                &format!("admin_listen = \"{}\"", me.admin),
            );
        base.push_str(&members_toml(members));
        // Test clusters talk over loopback without TLS.
        return format!("{base}{}", plaintext_cluster(rest));
    }
    format!("{base}{rest}")
}

async fn start(
    zone: &str,
    me: Option<(&MemberSpec, &[MemberSpec])>,
    quota: &str,
    rest: &str,
) -> NodeProcess {
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), zone, me, quota, rest);
    NodeProcess::start_config(dir, &text).await
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn post(node: &NodeProcess, key: &str, body: &Value) -> reqwest::RequestBuilder {
    client()
        .post(format!("{}/v1/chat/completions", node.data))
        .bearer_auth(key)
        .json(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_quota_is_a_429_in_openai_shape_with_rate_limit_headers() {
    let mock = Mock::start("a1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}",
        mock.backend_toml(&[MODEL]),
        tenant_toml("bulk", BULK_KEY, "P2", "")
    );
    // 6 requests a minute: one every 10 s, a burst of one.
    let node = start("az-a", None, "quota = { rpm = 6 }", &rest).await;

    let ok = node.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(header(&ok, "x-ratelimit-limit-requests"), Some("6"));
    assert!(header(&ok, "x-ratelimit-remaining-requests").is_some());
    assert!(header(&ok, "x-ratelimit-reset-requests").is_some());
    // Only the limited unit has headers.
    assert_eq!(header(&ok, "x-ratelimit-limit-tokens"), None);

    let limited = node.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(limited.status(), 429);
    let retry_after: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    assert_eq!(header(&limited, "x-ratelimit-limit-requests"), Some("6"));
    assert_eq!(
        header(&limited, "x-ratelimit-remaining-requests"),
        Some("0")
    );
    let reset = header(&limited, "x-ratelimit-reset-requests")
        .unwrap()
        .to_owned();
    assert!(reset.ends_with('s'), "{reset}");
    let v: Value = limited.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "requests", "{v}");
    assert!(v["error"]["param"].is_null(), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Rate limit reached for deptA"),
        "{v}"
    );

    // A tenant without a quota is never limited and gets no headers.
    for _ in 0..3 {
        let free = post(&node, BULK_KEY, &chat_body(8, false))
            .send()
            .await
            .unwrap();
        assert_eq!(free.status(), 200);
        assert_eq!(header(&free, "x-ratelimit-limit-requests"), None);
    }
    let m = node.metrics().await;
    assert_eq!(
        metric_sum(&m, "zonegate_quota_admitted_total", &["tenant=\"deptA\""]),
        1.0
    );
    assert_eq!(
        metric_sum(
            &m,
            "zonegate_quota_rejected_total",
            &["tenant=\"deptA\"", "reason=\"rpm\""]
        ),
        1.0
    );
    // Every response of the limited tenant carries its limits.
    let models = client()
        .get(format!("{}/v1/models", node.data))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&models, "x-ratelimit-limit-requests"), Some("6"));

    // `zonegate ctl quotas`, as on-call reads it.
    let (code, text, _) = ctl(&node.admin, &["quotas"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("TENANT") && text.contains("deptA"), "{text}");
    assert!(text.contains("rpm=1"), "the rejection is counted: {text}");
    assert!(text.contains("unlimited"), "bulk has no quota: {text}");

    let q = node.admin_get("/admin/v1/quotas").await;
    assert_eq!(q["tenants"][0]["tenant"], "deptA");
    assert_eq!(q["tenants"][0]["zones"][0]["nodes"][0]["limits"]["rpm"], 6);
    assert_eq!(q["tenants"][0]["usage"]["rejected_total"]["rpm"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answers_usage_corrects_the_token_bucket() {
    let mock = Mock::start("a1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}{}",
        mock.backend_toml(&[MODEL]),
        tenant_toml("bulk", BULK_KEY, "P0", "quota = { tpm = 6000 }"),
        tenant_toml("scored", SCORED_KEY, "P0", "quota = { tpm = 6000 }")
    );
    // 6000 tokens a minute: 100 a second, five seconds (500) of burst.
    let node = start("az-a", None, "quota = { tpm = 6000 }", &rest).await;
    // Asks for 4000 tokens (charged at admission: ~40 s of this node's
    // allocation); the mock answers 64, and says so in a last usage
    // chunk only when asked to.
    let stream = |usage: bool| {
        let mut body = chat_body(4000, true);
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };

    let with_usage = node.chat().json(&stream(true)).send().await.unwrap();
    assert_eq!(with_usage.status(), 200);
    let text = with_usage.text().await.unwrap();
    assert!(text.contains("\"completion_tokens\":64"), "{text}");
    // Corrected to 72 tokens: the next request is admitted at once.
    let next = node.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(next.status(), 200, "{:?}", next.text().await);

    // A stream that cannot be continued (log probabilities asked for) is
    // relayed unread, but its usage chunk still corrects the charge.
    let mut scored = stream(true);
    scored["logprobs"] = json!(true);
    let resp = post(&node, SCORED_KEY, &scored).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await.unwrap();
    let next = post(&node, SCORED_KEY, &chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200, "{:?}", next.text().await);

    // Without usage, the charge is corrected only to what the bytes
    // delivered suggest (an event stream's framing weighs ~40 times its
    // text), so the tenant waits most of the estimate out.
    let without = post(&node, BULK_KEY, &stream(false)).send().await.unwrap();
    assert_eq!(without.status(), 200);
    let _ = without.text().await.unwrap();
    let next = post(&node, BULK_KEY, &chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 429);
    assert_eq!(header(&next, "x-ratelimit-limit-tokens"), Some("6000"));
    let reset = header(&next, "x-ratelimit-reset-tokens")
        .unwrap()
        .to_owned();
    let v: Value = next.json().await.unwrap();
    assert_eq!(v["error"]["type"], "tokens", "{v}");
    assert!(reset.ends_with('s') && !reset.ends_with("ms"), "{reset}");

    let m = node.metrics().await;
    assert_eq!(
        metric_sum(
            &m,
            "zonegate_tokens_total",
            &["tenant=\"deptA\"", "kind=\"completion\""]
        ),
        64.0 + 8.0,
        "the stream's 64 and the next answer's 8"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_within_the_configured_burst_is_admitted_and_remaining_is_the_minutes() {
    let mock = Mock::start("a1", "az-a", &[MODEL]).await;
    // 6 requests a minute (one every 10 s) and 200,000 tokens; a burst of
    // 30 s admits four requests at once (0, 10, 20, 30 s ahead), and the
    // next one only after 10 s.
    let node = start(
        "az-a",
        None,
        "quota = { rpm = 6, tpm = 200000, burst = \"30s\" }",
        &mock.backend_toml(&[MODEL]),
    )
    .await;
    for i in 1..=4u64 {
        let ok = node.chat().json(&chat_body(8, false)).send().await.unwrap();
        assert_eq!(ok.status(), 200, "request {i} of the burst");
        // What is left of the minute at this node's allocation, as
        // OpenAI's clients read it, not what is left of the burst.
        let left = 6 - i;
        assert_eq!(
            header(&ok, "x-ratelimit-remaining-requests"),
            Some(left.to_string().as_str())
        );
        let tokens: u64 = header(&ok, "x-ratelimit-remaining-tokens")
            .unwrap()
            .parse()
            .unwrap();
        // Each request is charged ~40 tokens (prompt bytes / 4 + 8) and
        // the answers' usage corrects it.
        assert!(
            (200_000 - 100 * i..200_000).contains(&tokens),
            "remaining tokens {tokens} after {i} small requests"
        );
        let reset = header(&ok, "x-ratelimit-reset-requests").unwrap();
        assert!(reset.ends_with('s'), "{reset}");
    }
    let limited = node.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(limited.status(), 429, "past the burst");
    assert_eq!(
        header(&limited, "x-ratelimit-remaining-requests"),
        Some("0")
    );
    let retry_after: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    let q = node.admin_get("/admin/v1/quotas").await;
    assert_eq!(q["tenants"][0]["burst_ms"], 30_000, "{q}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_gets_one_label_and_counts_against_rpm() {
    let mock = Mock::start("a1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}",
        mock.backend_toml(&[MODEL]),
        tenant_toml("bulk", BULK_KEY, "P2", "")
    );
    // One request a burst (6 a minute, 5 s of burst).
    let node = start("az-a", None, "quota = { rpm = 6 }", &rest).await;
    let unknown = |n: usize| {
        let mut body = chat_body(8, false);
        body["model"] = json!(format!("no-such-model-{n}-{}", "x".repeat(64 << 10)));
        body
    };
    let resp = node.chat().json(&unknown(0)).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.len() < 1024,
        "the name is cut: {} bytes",
        message.len()
    );
    // The 404 took the tenant's one request: the next is refused.
    let next = node.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(next.status(), 429, "{:?}", next.text().await);
    // A tenant without a quota: a name per request, one series.
    for n in 1..=5 {
        let resp = post(&node, BULK_KEY, &unknown(n)).send().await.unwrap();
        assert_eq!(resp.status(), 404);
    }
    let m = node.metrics().await;
    assert!(!m.contains("no-such-model"), "a client's name in /metrics");
    assert!(m.len() < 1 << 20, "/metrics is {} bytes", m.len());
    for (tenant, n) in [("deptA", 1.0), ("bulk", 5.0)] {
        let labels = [
            &format!("tenant=\"{tenant}\"") as &str,
            "model=\"(unknown)\"",
            "outcome=\"model_not_found\"",
        ];
        assert_eq!(
            metric_sum(&m, "zonegate_requests_total", &labels),
            n,
            "{tenant}"
        );
    }
    let series = m
        .lines()
        .filter(|l| l.starts_with("zonegate_requests_total{") && l.contains("model_not_found"))
        .count();
    assert_eq!(series, 2, "one series per tenant");
}

/// Three members, one zone: `(id, rate per second)` of load per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_limit_by_demand_and_admit_it_within_five_percent() {
    const RPM: u64 = 600;
    const WINDOW: Duration = Duration::from_secs(30);
    let members: Vec<MemberSpec> = (1..=3).map(|id| MemberSpec::new(id, "az-a")).collect();
    let mut mocks = Vec::new();
    let mut rest = String::new();
    for i in 1..=3 {
        let m = Mock::start(&format!("a{i}"), "az-a", &[MODEL]).await;
        rest.push_str(&m.backend_toml(&[MODEL]));
        mocks.push(m);
    }
    rest.push_str(
        "[failover]\nperiod = \"1s\"\n\n[quotas]\nrebalance_interval = \"1s\"\ndrift_threshold = 0.05\n",
    );
    let quota = format!("quota = {{ rpm = {RPM} }}");
    let mut nodes = Vec::new();
    for m in &members {
        nodes.push(start("az-a", Some((m, &members)), &quota, &rest).await);
    }
    // Twice the limit, 70/20/10 over the nodes.
    let data: Vec<&str> = nodes.iter().map(|n| n.data.as_str()).collect();
    let load = support::load::OpenLoop::uneven(API_KEY, &data, RPM);
    // The leader splits the zone's allocation by demand: wait for a table
    // that gives node 1 (70 %) the most and node 3 (10 %) the least.
    let admin = nodes[0].admin.clone();
    eventually(
        Duration::from_secs(60),
        "a demand-weighted allocation",
        || {
            let admin = admin.clone();
            async move {
                let q = get_json(&format!("{admin}/admin/v1/quotas"), Some(ADMIN_TOKEN)).await;
                let rpm = |n: usize| {
                    q["tenants"][0]["zones"][0]["nodes"][n]["limits"]["rpm"]
                        .as_u64()
                        .unwrap_or(0)
                };
                rpm(0) > rpm(1) && rpm(1) > rpm(2) && rpm(2) > 0
            }
        },
    )
    .await;
    // Let the buckets settle into the new allocations, then measure.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = load.measure(WINDOW).await;
    let per_node = t.assert_limit_held(RPM, WINDOW);
    assert!(
        per_node.iter().all(|n| *n > 0),
        "every node admits: {per_node:?}"
    );
    // The split follows demand.
    assert!(
        per_node[0] > per_node[1] && per_node[1] > per_node[2],
        "{per_node:?}"
    );
    // The rebalances are decisions in the history.
    let d = nodes[0]
        .admin_get("/admin/v1/decisions?limit=50&all=true")
        .await;
    assert!(
        d["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["kind"] == "quota_rebalance"),
        "{d}"
    );
}

/// What the clients saw: (key, phase, status, error code).
type Outcomes = Arc<Mutex<Vec<(&'static str, usize, u16, String)>>>;

/// One closed-loop client: sends one request at a time until `stop`,
/// recording (phase, status, error code).
fn client_loop(
    url: String,
    key: &'static str,
    phase: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    out: Outcomes,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let c = client();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let p = phase.load(std::sync::atomic::Ordering::Relaxed);
            let (status, code) = match c
                .post(&url)
                .bearer_auth(key)
                .json(&chat_body(8, false))
                .send()
                .await
            {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let code = if status == 200 {
                        String::new()
                    } else {
                        r.json::<Value>()
                            .await
                            .ok()
                            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                            .unwrap_or_default()
                    };
                    (status, code)
                }
                Err(_) => (0, "transport".into()),
            };
            out.lock().unwrap().push((key, p, status, code));
            if status != 200 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_overflows_into_the_target_p0_keeps_its_rate_and_p2_is_shed_first() {
    let members = MemberSpec::one_per_zone();
    let mut mocks = Vec::new();
    let mut rest = String::new();
    for z in ZONES {
        let m = Mock::start(&format!("{z}-1"), z, &[MODEL]).await;
        // Each answer takes 200 ms, so requests are in flight and use
        // capacity units; six units per zone.
        m.faults(json!({"latency_ms": 200})).await;
        rest.push_str(&m.backend_toml(&[MODEL]).replace(
            "metrics_path = \"/metrics\"\n",
            "metrics_path = \"/metrics\"\ncapacity = 6\n",
        ));
        mocks.push(m);
    }
    rest.push_str(&tenant_toml(
        "bulk",
        BULK_KEY,
        "P2",
        "quota = { rpm = 60000 }",
    ));
    rest.push_str("[failover]\nperiod = \"1s\"\n\n[quotas]\nrebalance_interval = \"1s\"\n");
    let mut nodes = Vec::new();
    for m in &members {
        nodes.push(
            start(
                m.zone.as_str(),
                Some((m, &members)),
                "quota = { rpm = 60000 }",
                &rest,
            )
            .await,
        );
    }
    let phase = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let out: Outcomes = Arc::default();
    let mut loops = Vec::new();
    // Nodes in az-a and az-b each carry one P0 client and two P2 clients.
    for node in &nodes[..2] {
        let url = format!("{}/v1/chat/completions", node.data);
        for key in [API_KEY, BULK_KEY, BULK_KEY] {
            loops.push(client_loop(
                url.clone(),
                key,
                Arc::clone(&phase),
                Arc::clone(&stop),
                Arc::clone(&out),
            ));
        }
    }
    let global_holds = |q: &Value| {
        for t in q["tenants"].as_array().unwrap() {
            let global = t["global"]["rpm"].as_u64().unwrap();
            let sum: u64 = t["zones"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|z| z["nodes"].as_array().unwrap().iter())
                .map(|n| n["limits"]["rpm"].as_u64().unwrap())
                .sum();
            assert!(
                sum <= global,
                "allocations sum {sum} > global {global}: {q}"
            );
        }
    };
    let own_rpm = |q: &Value, node: u64| -> u64 {
        q["tenants"][0]["zones"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|z| z["nodes"].as_array().unwrap().iter())
            .find(|n| n["node"] == node)
            .map(|n| n["limits"]["rpm"].as_u64().unwrap())
            .unwrap()
    };
    // Before: every zone serves itself.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = nodes[0].admin_get("/admin/v1/quotas").await;
    global_holds(&before);
    let a_before = own_rpm(&before, 1);

    // The dry run names the overflow the failover would cause, for every
    // tenant with a quota, as of the version it would apply as.
    let dry: Value = client()
        .post(format!("{}/admin/v1/failover", nodes[0].admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"from": "az-a", "to": "az-b", "reason": "quota test", "dry_run": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let version = dry["preview"]["version"].as_u64().unwrap();
    let overflows = dry["quota_overflow"]
        .as_array()
        .unwrap_or_else(|| panic!("no quota_overflow in the dry run: {dry}"));
    for (tenant, priority) in [("deptA", "P0"), ("bulk", "P2")] {
        let want = json!({
            "tenant": tenant, "from": "az-a", "to": "az-b", "priority": priority,
            "line": format!(
                "cross_zone overflow tenant={tenant} from=az-a to=az-b mode=soft_limit priority={priority} version={version}"
            ),
        });
        assert!(overflows.contains(&want), "{want} in {overflows:?}");
    }
    assert_eq!(overflows.len(), 2, "{overflows:?}");

    phase.store(1, std::sync::atomic::Ordering::Relaxed);
    let resp = client()
        .post(format!("{}/admin/v1/failover", nodes[0].admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"from": "az-a", "to": "az-b", "reason": "quota test"}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);
    // Every node sees az-a's allocation move into az-b (soft_limit).
    for node in &nodes {
        let admin = node.admin.clone();
        eventually(
            Duration::from_secs(20),
            "az-b in soft_limit on every node",
            || {
                let admin = admin.clone();
                async move {
                    let q = get_json(&format!("{admin}/admin/v1/quotas"), Some(ADMIN_TOKEN)).await;
                    q["tenants"][0]["zones"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|z| {
                            z["zone"] == "az-b"
                                && z["mode"] == "soft_limit"
                                && z["overflow_from"][0] == "az-a"
                        })
                }
            },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let during = nodes[1].admin_get("/admin/v1/quotas").await;
    global_holds(&during);
    let history = nodes[0]
        .admin_get("/admin/v1/decisions?limit=50&all=true")
        .await;
    let lines = history.to_string();
    assert!(
        lines.contains(
            "cross_zone overflow tenant=deptA from=az-a to=az-b mode=soft_limit priority=P0"
        ),
        "the overflow line in the decision history: {history}"
    );

    phase.store(2, std::sync::atomic::Ordering::Relaxed);
    let resp = client()
        .post(format!("{}/admin/v1/failback", nodes[0].admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"zone": "az-a", "reason": "quota test"}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);
    // Every node back on the previous table (each applies the failback in
    // its own time).
    for node in &nodes {
        let admin = node.admin.clone();
        // Generous: a follower under a loaded machine's scheduler applies
        // the failback and the next rebalance seconds after the leader.
        eventually(
            Duration::from_secs(60),
            "az-a's allocation restored on every node",
            || {
                let admin = admin.clone();
                async move {
                    let q = get_json(&format!("{admin}/admin/v1/quotas"), Some(ADMIN_TOKEN)).await;
                    // The leader splits the quota by demand at every
                    // rebalance, so az-a's node gets its part back, not
                    // necessarily the very number it had: at least half
                    // of it (its clients' demand is what it was before).
                    q["tenants"][0]["overflow"]
                        .as_array()
                        .is_some_and(|o| o.is_empty())
                        && own_rpm(&q, 1) * 2 >= a_before
                }
            },
        )
        .await;
    }
    phase.store(3, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = nodes[0].admin_get("/admin/v1/quotas").await;
    global_holds(&after);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loops {
        let _ = l.await;
    }

    let out = out.lock().unwrap().clone();
    let count = |key: &str, phase: Option<usize>, pred: &dyn Fn(u16, &str) -> bool| {
        out.iter()
            .filter(|(k, p, s, c)| *k == key && phase.is_none_or(|want| *p == want) && pred(*s, c))
            .count()
    };
    let p0_total = count(API_KEY, None, &|_, _| true);
    let p0_ok = count(API_KEY, None, &|s, _| s == 200);
    let shed = |s: u16, c: &str| s == 429 && c == "capacity_exceeded";
    eprintln!(
        "P0 {p0_ok}/{p0_total} ok; P2 shed per phase: {:?}, P2 ok per phase: {:?}",
        (0..4)
            .map(|p| count(BULK_KEY, Some(p), &shed))
            .collect::<Vec<_>>(),
        (0..4)
            .map(|p| count(BULK_KEY, Some(p), &|s, _| s == 200))
            .collect::<Vec<_>>(),
    );
    assert!(p0_total > 50, "P0 sent {p0_total}");
    assert!(
        p0_ok as f64 >= 0.99 * p0_total as f64,
        "P0 success {p0_ok}/{p0_total}"
    );
    assert_eq!(count(API_KEY, None, &shed), 0, "P0 is never shed");
    // Before the failover each zone carries its own: nothing is shed.
    assert_eq!(count(BULK_KEY, Some(0), &shed), 0, "no shedding before");
    // az-b's units are now shared with az-a's node: P2 goes first.
    assert!(
        count(BULK_KEY, Some(1), &shed) > 0,
        "P2 shed during the failover"
    );
    // After the failback: nothing is shed again.
    assert_eq!(
        count(BULK_KEY, Some(3), &shed),
        0,
        "no shedding after the failback"
    );
    drop(mocks);
}

/// A request short of zone capacity waits for a unit instead of being
/// refused, and a P0 request that finds the queue full takes the place of
/// the P2 waiter: one unit, a backend taking 600 ms an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_of_capacity_a_request_waits_for_a_unit_and_p0_waits_first() {
    let mock = Mock::start("a1", "az-a", &[MODEL]).await;
    mock.faults(json!({"latency_ms": 600})).await;
    let rest = format!(
        "{}{}[quotas]\np0_reserve = 0.0\nqueue_timeout = \"30s\"\n",
        mock.backend_toml(&[MODEL]).replace(
            "metrics_path = \"/metrics\"\n",
            "metrics_path = \"/metrics\"\ncapacity = 1\n",
        ),
        tenant_toml("bulk", BULK_KEY, "P2", ""),
    );
    let node = Arc::new(start("az-a", None, "", &rest).await);
    let send = |key: &'static str| {
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            let resp = post(&node, key, &chat_body(8, false)).send().await.unwrap();
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap();
            (status, v["error"]["code"].as_str().unwrap_or("").to_owned())
        })
    };
    let held_by_p2 = |z: &Value| z["used_units_by_priority"]["P2"] == 1;
    let one_waits = |z: &Value| z["waiting"] == 1;

    // P2 holds the unit; a second P2 waits (it would be a 503 at once
    // without the queue), and is served when the unit comes back.
    let holder = send(BULK_KEY);
    until_capacity(&node, "the unit held", held_by_p2).await;
    let patient = send(BULK_KEY);
    until_capacity(&node, "a waiter", one_waits).await;
    assert_eq!(holder.await.unwrap().0, 200);
    assert_eq!(patient.await.unwrap().0, 200);

    // Again, but now a P0 arrives while the P2 waits: the queue (one
    // request per unit) is full, so the P2 gives way at once and the P0
    // is served when the unit comes back.
    let holder = send(BULK_KEY);
    until_capacity(&node, "the unit held", held_by_p2).await;
    let displaced = send(BULK_KEY);
    until_capacity(&node, "a waiter", one_waits).await;
    let p0 = send(API_KEY);
    let (status, code) = displaced.await.unwrap();
    assert_eq!((status, code.as_str()), (503, "capacity_exceeded"));
    assert_eq!(holder.await.unwrap().0, 200);
    assert_eq!(p0.await.unwrap().0, 200);

    let metrics = node.metrics().await;
    for line in [
        "zonegate_zone_queued_total{outcome=\"granted\",zone=\"az-a\"} 2",
        "zonegate_zone_queued_total{outcome=\"displaced\",zone=\"az-a\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

/// Polls `/admin/v1/quotas` until `check` holds for its first zone's capacity.
async fn until_capacity(node: &NodeProcess, what: &str, check: impl Fn(&Value) -> bool) {
    let check = &check;
    eventually(Duration::from_secs(20), what, || async move {
        let q = node.admin_get("/admin/v1/quotas").await;
        check(&q["capacity"][0])
    })
    .await;
}
