//! The dashboard in a real browser: headless Chromium (installed by
//! `.ci/run`) loads `/dashboard` from a three-zone cluster of real
//! processes, driven over the DevTools protocol. Without a token it shows
//! the sign-in form (and the API answers 401); with one it renders three
//! zones, the leader, backend scores and the spend row; an operator fails
//! a zone over through the dry run and the confirm step.

mod support;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(p) = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        }) {
            return Some(p);
        }
    }
    assert!(
        std::env::var("ZONEGATE_REQUIRE_TOOLS").as_deref() != Ok("1"),
        "chromium is not installed but ZONEGATE_REQUIRE_TOOLS=1: run the install lines of .ci/run"
    );
    eprintln!("SKIPPED: chromium is not installed (.ci/run installs it)");
    None
}

/// A headless Chromium child (killed on drop) and one page's DevTools
/// connection.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    fn start(binary: &PathBuf) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let child = Command::new(binary)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=412,915",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium starts");
        // Chromium writes its DevTools port here once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u16>().ok()))
            {
                break port;
            }
            assert!(Instant::now() < deadline, "chromium did not open DevTools");
            std::thread::sleep(Duration::from_millis(100));
        };
        let ws_url = loop {
            let targets = http_get_json(port, "/json/list");
            if let Some(url) = targets.as_ref().and_then(|t| {
                t.as_array()?.iter().find(|t| t["type"] == "page")?["webSocketDebuggerUrl"]
                    .as_str()
                    .map(str::to_owned)
            }) {
                break url;
            }
            assert!(Instant::now() < deadline, "chromium has no page target");
            std::thread::sleep(Duration::from_millis(100));
        };
        let (ws, _) = tungstenite::connect(ws_url.as_str()).expect("DevTools websocket");
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("read timeout");
        }
        Browser {
            child,
            _profile: profile,
            ws,
            next_id: 1,
        }
    }

    /// Sends one DevTools command and waits for its answer (events in
    /// between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(msg)).expect("send to DevTools");
        loop {
            let msg = match self.ws.read() {
                Ok(m) => m,
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => {
                    panic!("DevTools did not answer {method}")
                }
                Err(e) => panic!("DevTools connection: {e}"),
            };
            let Ok(text) = msg.into_text() else { continue };
            let v: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates `expr` in the page and returns its (JSON) value.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r["exceptionDetails"].is_null(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is truthy; returns the last value. An
    /// exception (the page still loading after a navigation) counts as
    /// not yet.
    fn wait_for(&mut self, what: &str, expr: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.call(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
            );
            let v = if r["exceptionDetails"].is_null() {
                r["result"]["value"].clone()
            } else {
                Value::Null
            };
            if v.as_bool() == Some(true) || (!v.is_null() && v.as_bool().is_none()) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what} ({v})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A GET on the DevTools HTTP endpoint (called inside `block_in_place`).
fn http_get_json(port: u16, path: &str) -> Option<Value> {
    tokio::runtime::Handle::current().block_on(async {
        client()
            .get(format!("http://127.0.0.1:{port}{path}"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()
    })
}

const SUMMARY: &str = r#"(() => {
  const q = (s) => document.querySelector(s);
  const visible = (s) => !!q(s) && !q(s).hidden;
  return {
    login: visible('#login'),
    app: visible('#app'),
    actions: visible('#actions'),
    zones: [...document.querySelectorAll('#zones [data-zone]')].map((z) => ({
      zone: z.dataset.zone, status: z.querySelector('.status').textContent,
      score: z.querySelector('.score').textContent })),
    leader: q('#leader').textContent,
    version: q('#version').textContent,
    scores: [...document.querySelectorAll('#backends [data-backend]')].map((r) => ({
      backend: r.dataset.backend, score: r.querySelector('.score').textContent,
      spark: !!r.querySelector('svg.spark polyline') })),
    nodes: document.querySelectorAll('#nodes tbody tr').length,
    url: location.href,
    stored: localStorage.getItem('zonegate.admin-token'),
  };
})()"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium_shows_zones_leader_scores_and_fails_over_with_confirm() {
    let Some(binary) = chromium() else { return };
    // A tenant with a quota, so the failover's dry run names its overflow.
    let limited = tenant_toml("limited", "limited-key", "P1", "quota = { rpm = 600 }");
    // A price, so an answer shows in the spend row (8 output tokens at
    // 1000 a million: 0.008).
    let priced = format!(
        "{limited}[[models]]\nname = \"{MODEL}\"\nprice = {{ input_per_mtok = 0.0, output_per_mtok = 1000.0 }}\n\n"
    );
    let cluster = TestCluster::start(1, &priced).await;
    let leader = cluster.leader().await;
    let admin = cluster.node(1).admin.clone();

    // The API refuses requests without a token.
    let resp = client()
        .get(format!("{admin}/admin/v1/cluster"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // One answer on node 1, whose page is looked at: its spend row.
    let r = cluster
        .node(1)
        .chat()
        .json(&chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let mut browser = tokio::task::block_in_place(|| Browser::start(&binary));
    let page = format!("{admin}/dashboard");
    let version = tokio::task::block_in_place(|| {
        browser.call("Page.enable", json!({}));
        browser.navigate(&page);
        browser.wait_for(
            "the sign-in form without a token",
            "!!document.querySelector('#login') && !document.querySelector('#login').hidden",
        );
        let s = browser.eval(SUMMARY);
        assert_eq!(s["app"], false, "{s}");
        assert_eq!(
            s["zones"].as_array().unwrap().len(),
            0,
            "no data before sign-in: {s}"
        );

        // A wrong token stays on the form with an error.
        browser.eval(
            "document.querySelector('#token').value = 'wrong'; \
             document.querySelector('#login-form').requestSubmit(); true",
        );
        browser.wait_for(
            "the refusal",
            "document.querySelector('#login-error').textContent.includes('refused')",
        );

        // A viewer sees everything and no actions.
        browser.eval(&format!(
            "document.querySelector('#token').value = '{VIEWER_TOKEN}'; \
             document.querySelector('#login-form').requestSubmit(); true"
        ));
        let s = browser.wait_for(
            "three zones, the leader and backend scores",
            &format!(
                "(() => {{ const s = {SUMMARY}; return s.app && s.zones.length === 3 && \
                 s.leader.startsWith('node ') && s.nodes === 3 && \
                 s.scores.length === 3 && s.scores.every((b) => /^[0-9.]+$/.test(b.score)) ? s : null; }})()"
            ),
        );
        let zones: Vec<&str> = s["zones"]
            .as_array()
            .unwrap()
            .iter()
            .map(|z| z["zone"].as_str().unwrap())
            .collect();
        assert_eq!(zones, ZONES, "{s}");
        assert!(
            s["leader"]
                .as_str()
                .unwrap()
                .starts_with(&format!("node {leader}")),
            "{s}"
        );
        assert_eq!(s["actions"], false, "viewers get no actions: {s}");
        assert!(
            !s["url"].as_str().unwrap().contains(VIEWER_TOKEN),
            "token never in the URL: {s}"
        );
        assert_eq!(s["stored"], VIEWER_TOKEN, "{s}");
        // The traffic policy tables: no rule or shadow, the tenant with any model.
        browser.wait_for(
            "the policy tables",
            "document.querySelector('#rules tbody').textContent.includes('no rules') && \
             document.querySelector('#shadows tbody').textContent.includes('no shadows') && \
             document.querySelector('#tenants tbody').textContent.includes('deptA')",
        );
        // The spend row: deptA's answer on this node, priced.
        let spend = browser.wait_for(
            "deptA's spend on node 1",
            &format!(
                "(() => {{ const r = [...document.querySelectorAll('#spend tbody tr')].map((tr) => \
                 [...tr.cells].map((c) => c.textContent)).find((c) => c[0] === 'node 1' && c[1] === 'deptA'); \
                 return r && r[2] === '{MODEL}' && r; }})()"
            ),
        );
        assert_eq!(spend[3], "0.008000 USD", "{spend}");
        // After a reload the stored token signs in again, and trend lines draw.
        browser.navigate(&page);
        browser.wait_for(
            "signed in from local storage, with sparklines",
            &format!("(() => {{ const s = {SUMMARY}; return s.app && s.scores.length === 3 && s.scores.every((b) => b.spark); }})()"),
        );

        // ZONEGATE_DASHBOARD_SCREENSHOT=FILE.png keeps a picture of the
        // page at phone size, for a person to look at.
        if let Ok(path) = std::env::var("ZONEGATE_DASHBOARD_SCREENSHOT") {
            use base64::Engine as _;
            let shot = browser.call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true}),
            );
            let png = base64::engine::general_purpose::STANDARD
                .decode(shot["data"].as_str().unwrap())
                .unwrap();
            std::fs::write(path, png).unwrap();
        }

        // An operator fails az-a over: dry run, confirm, committed.
        browser.eval("document.querySelector('#logout').click(); true");
        browser.wait_for("signed out", "!document.querySelector('#login').hidden");
        browser.eval(&format!(
            "document.querySelector('#token').value = '{ADMIN_TOKEN}'; \
             document.querySelector('#login-form').requestSubmit(); true"
        ));
        browser.wait_for(
            "operator actions with zones to choose",
            "!document.querySelector('#actions').hidden && document.querySelector('#fo-from').options.length === 3",
        );
        browser.eval(
            "document.querySelector('#fo-from').value = 'az-a'; \
             document.querySelector('#fo-to').value = 'az-b'; \
             document.querySelector('#fo-reason').value = 'dashboard test'; \
             document.querySelector('#failover-form').requestSubmit(); true",
        );
        let confirm = browser.wait_for(
            "the confirm step",
            "!document.querySelector('#confirm').hidden && document.querySelector('#confirm-text').textContent",
        );
        assert!(
            confirm.as_str().unwrap().contains("az-a → az-b"),
            "{confirm}"
        );
        assert!(
            confirm
                .as_str()
                .unwrap()
                .contains("Quota overflow: limited (P1) az-a → az-b."),
            "{confirm}"
        );
        // Nothing decided before confirming (the leader's quota
        // rebalances may move the version meanwhile; the zone stays).
        let before = browser.eval(SUMMARY);
        assert!(
            !before["zones"][0]["status"]
                .as_str()
                .unwrap()
                .contains("az-b"),
            "nothing decided before confirming: {before}"
        );
        browser.eval("document.querySelector('#confirm-yes').click(); true");
        let committed = browser.wait_for(
            "the committed failover",
            &format!("(() => {{ const s = {SUMMARY}; const r = document.querySelector('#action-result').textContent; return r.startsWith('Committed: decision version ') && s.zones[0].status.includes('az-b') && r; }})()"),
        );
        committed
            .as_str()
            .unwrap()
            .trim_start_matches("Committed: decision version ")
            .parse::<u64>()
            .unwrap()
    });
    cluster.all_at(version).await;
    drop(browser);
}
