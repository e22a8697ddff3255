//! Black-box tests of the multi-zone data plane: zone-pinned sessions (a
//! signed pin token brings a session home from any node), sticky backends
//! within the home zone, and cross-zone fallback for short requests only.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const ZONES: [&str; 3] = ["az-a", "az-b", "az-c"];

/// Three zones, two mock backends each, one gateway member per zone.
struct ThreeZones {
    nodes: Vec<Gateway>,
    mocks: HashMap<String, Mock>,
}

impl ThreeZones {
    async fn start() -> ThreeZones {
        let mut mocks = HashMap::new();
        let mut backends = String::new();
        for z in ZONES {
            for n in 1..=2 {
                let name = format!("{z}-{n}");
                let m = Mock::start(&name, z, &[MODEL]).await;
                backends.push_str(&m.backend_toml(&[MODEL]));
                mocks.insert(name, m);
            }
        }
        let members: Vec<MemberSpec> = ZONES
            .iter()
            .enumerate()
            .map(|(i, z)| MemberSpec::new(i as u64 + 1, z))
            .collect();
        let mut nodes = Vec::new();
        for m in &members {
            nodes.push(Gateway::start_member(m, &members, &backends).await);
        }
        ThreeZones { nodes, mocks }
    }

    fn node(&self, zone: &str) -> &Gateway {
        &self.nodes[ZONES.iter().position(|z| *z == zone).unwrap()]
    }
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_to_their_zone_and_backend_and_pins_travel_between_nodes() {
    let cluster = ThreeZones::start().await;
    let a = cluster.node("az-a");

    // One session, 30 requests: one zone, one backend, a pin token each time.
    let mut backend = None;
    let mut token = String::new();
    for _ in 0..30 {
        let resp = a
            .chat()
            .header("x-session-id", "chat-42")
            .json(&chat_body(8, false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-zonegate-zone"), "az-a");
        let b = header(&resp, "x-zonegate-backend");
        assert_eq!(
            backend.get_or_insert(b.clone()),
            &b,
            "the session moved backends"
        );
        token = header(&resp, "x-zonegate-pin");
        assert!(token.starts_with("v1:"), "a pin token is issued: {token:?}");
    }

    // Entering at az-b's node with the token: served at home, in az-a.
    let b_node = cluster.node("az-b");
    let resp = b_node
        .chat()
        .header("x-session-id", "chat-42")
        .header("x-zonegate-pin", &token)
        .json(&chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-zonegate-zone"),
        "az-a",
        "the pin brings the session home"
    );
    assert_eq!(
        Some(header(&resp, "x-zonegate-backend")),
        backend,
        "and to the same backend"
    );

    // Node az-b now remembers the pin too, even without the token.
    let resp = b_node
        .chat()
        .header("x-session-id", "chat-42")
        .json(&chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&resp, "x-zonegate-zone"), "az-a");

    // The `user` field is a session key too; a forged token is ignored.
    let forged = token.replace(":az-a:", ":az-c:");
    let body = json!({"model": MODEL, "max_tokens": 8, "user": "someone-new", "messages": []});
    let resp = b_node
        .chat()
        .header("x-zonegate-pin", forged)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a forged pin is never an error");
    assert_eq!(
        header(&resp, "x-zonegate-zone"),
        "az-b",
        "a forged pin is ignored"
    );

    // 100 sessions spread over both backends of the zone.
    let mut used = HashSet::new();
    for s in 0..100 {
        let resp = a
            .chat()
            .header("x-session-id", format!("session-{s}"))
            .json(&chat_body(4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(header(&resp, "x-zonegate-zone"), "az-a");
        used.insert(header(&resp, "x-zonegate-backend"));
    }
    assert_eq!(
        used,
        HashSet::from(["az-a-1".to_owned(), "az-a-2".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_home_zone_down_only_short_requests_cross_zones() {
    let mut cluster = ThreeZones::start().await;
    let a_admin = cluster.node("az-a").admin.clone();
    // Automation frozen: nothing but the fallback rules act here.
    let frozen = loop {
        let resp = client()
            .post(format!("{a_admin}/admin/v1/freeze"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"reason": "test"}))
            .send()
            .await
            .unwrap();
        if resp.status() != 503 {
            break resp.json::<Value>().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(frozen["committed"], true, "{frozen}");

    for name in ["az-a-1", "az-a-2"] {
        cluster.mocks.get_mut(name).unwrap().kill().await;
    }
    let a = cluster.node("az-a");
    for _ in 0..20 {
        let resp = a.chat().json(&chat_body(64, false)).send().await.unwrap();
        assert_eq!(
            resp.status(),
            200,
            "{}",
            resp.text().await.unwrap_or_default()
        );
        assert_ne!(header(&resp, "x-zonegate-zone"), "az-a");
        assert!(header(&resp, "x-zonegate-route").contains("fallback:cross-zone"));
    }
    let long =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "tell me everything"}]});
    let resp = a.chat().json(&long).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "zone_unavailable", "{v}");
    let metrics = a.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "zonegate_fallbacks_total",
            &["kind=\"cross_zone\"", "class=\"short\""]
        ) >= 20.0
    );
}
