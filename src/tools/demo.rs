//! `zonegate demo`: mock backends in two zones and one gateway node, all on
//! loopback, each a child process of this binary; Ctrl-C stops them all.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context};

use super::spawn::{self, child_command, concrete_addr, Spawned};
use crate::config::sha256_hex;

/// The demo's API key and admin token: fixed, so the README's tour can be
/// pasted as is. The demo listens on loopback only.
pub const DEMO_API_KEY: &str = "sk-zonegate-demo";
pub const DEMO_ADMIN_TOKEN: &str = "zonegate-demo-admin";
pub const DEMO_MODEL: &str = "qwen25-7b-instruct";
pub const DEMO_SMALL_MODEL: &str = "qwen25-3b-instruct";
/// A Claude-style model, served by an Anthropic-format mock in az-a.
pub const DEMO_CLAUDE_MODEL: &str = "claude-demo";
/// The key the Anthropic-format mock expects; the nodes read it from
/// [`DEMO_ANTHROPIC_KEY_ENV`] (a provider's key is never in the config).
pub const DEMO_ANTHROPIC_KEY: &str = "sk-ant-zonegate-demo";
pub const DEMO_ANTHROPIC_KEY_ENV: &str = "ZONEGATE_DEMO_ANTHROPIC_KEY";

pub struct DemoOptions {
    pub listen: String,
    pub admin_listen: String,
}

/// One demo gateway node: its id, zone and addresses.
pub struct DemoNode {
    pub id: u64,
    pub zone: String,
    pub listen: String,
    pub admin: String,
    pub raft: String,
}

/// The config of one demo node: every node knows every backend (in all
/// zones) and every member.
pub fn demo_config(
    node: &DemoNode,
    nodes: &[DemoNode],
    data_dir: &Path,
    backends: &[DemoBackend],
) -> String {
    let mut c = format!(
        r#"# Written by `zonegate demo`.
[node]
id = {id}
zone = "{zone}"
listen = "{listen}"
admin_listen = "{admin}"
data_dir = "{data}"

[[tenants]]
name = "demo"
key_sha256 = "{key}"
priority = "P0"
# Global across the three zones (a third each); `zonegate ctl quotas`.
quota = {{ rpm = 600, tpm = 600000, concurrency = 60 }}

[[admin.tokens]]
name = "demo-operator"
sha256 = "{token}"
role = "operator"

[[models]]
name = "{model}"
balance = "p2c"
fallback = ["{small}"]

[health]
interval = "1s"

# The demo's nodes talk over loopback; a real cluster uses [cluster.tls]
# (see SECURITY.md).
[cluster]
allow_plaintext = true
"#,
        id = node.id,
        zone = node.zone,
        listen = node.listen,
        admin = node.admin,
        data = data_dir.display(),
        key = sha256_hex(DEMO_API_KEY),
        token = sha256_hex(DEMO_ADMIN_TOKEN),
        model = DEMO_MODEL,
        small = DEMO_SMALL_MODEL,
    );
    for m in nodes {
        c.push_str(&format!(
            "\n[[cluster.members]]\nid = {}\nzone = \"{}\"\nraft = \"{}\"\nadmin = \"{}\"\nrole = \"voter\"\n",
            m.id, m.zone, m.raft, m.admin
        ));
    }
    for (name, zone, url) in backends {
        c.push_str(&format!(
            "\n[[backends]]\nname = \"{name}\"\nzone = \"{zone}\"\nurl = \"{url}\"\nmodels = [\"{DEMO_MODEL}\", \"{DEMO_SMALL_MODEL}\"]\nmetrics_path = \"/metrics\"\n"
        ));
    }
    c
}

/// The demo's Anthropic-format backend (in az-a) and its model: the key
/// is a reference to the nodes' environment.
fn provider_backend(url: &str) -> String {
    format!(
        "\n[[models]]\nname = \"{DEMO_CLAUDE_MODEL}\"\n\n[[backends]]\nname = \"claude-a1\"\n\
         zone = \"az-a\"\nurl = \"{url}\"\nmodels = [\"{DEMO_CLAUDE_MODEL}\"]\n\
         provider = \"anthropic\"\nmodel_names = {{ \"{DEMO_CLAUDE_MODEL}\" = \"claude-demo-mock\" }}\n\
         api_key = {{ env = \"{DEMO_ANTHROPIC_KEY_ENV}\" }}\n"
    )
}

/// Runs the demo until Ctrl-C.
pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this binary")?;
    let dir: PathBuf = std::env::temp_dir().join(format!("zonegate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = run_in(&exe, &dir, &opts).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

pub const ZONES: [&str; 3] = ["az-a", "az-b", "az-c"];

/// A demo backend: (name, zone, url).
pub type DemoBackend = (String, String, String);

/// Starts `per_zone` mock backends in each zone (named `qwen-a1`, …),
/// serving the demo's two models.
pub async fn spawn_mocks(
    exe: &Path,
    zones: &[&str],
    per_zone: usize,
) -> anyhow::Result<Vec<(DemoBackend, Spawned)>> {
    let mut out = Vec::new();
    for zone in zones {
        for n in 1..=per_zone {
            let name = format!("qwen-{}{n}", zone.trim_start_matches("az-"));
            let s = spawn::mock_backend(
                child_command(exe),
                &name,
                zone,
                &[DEMO_MODEL, DEMO_SMALL_MODEL],
                Duration::from_secs(20),
            )
            .await?;
            out.push(((name, (*zone).to_owned(), s.urls[0].clone()), s));
        }
    }
    Ok(out)
}

async fn run_in(exe: &Path, dir: &Path, opts: &DemoOptions) -> anyhow::Result<()> {
    let mut children = Vec::new();
    let mut pipes = Vec::new();
    let mut backends = Vec::new();
    for (backend, mock) in spawn_mocks(exe, &ZONES, 2).await? {
        backends.push(backend);
        pipes.push(mock.stdin);
        children.push(mock.child);
    }
    let (claude, claude_url) = {
        let key = [
            "--provider",
            "anthropic",
            "--expect-key",
            DEMO_ANTHROPIC_KEY,
        ];
        let (cmd, timeout) = (child_command(exe), Duration::from_secs(20));
        let s = spawn::mock_backend_with(
            cmd,
            "claude-a1",
            "az-a",
            &["claude-demo-mock"],
            &key,
            timeout,
        )
        .await?;
        let url = s.urls[0].clone();
        pipes.push(s.stdin);
        children.push(s.child);
        (provider_backend(&url), url)
    };
    let mut nodes = Vec::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let first = i == 0;
        nodes.push(DemoNode {
            id: i as u64 + 1,
            zone: (*zone).to_owned(),
            listen: if first {
                opts.listen.clone()
            } else {
                "127.0.0.1:0".into()
            },
            admin: concrete_addr(if first {
                &opts.admin_listen
            } else {
                "127.0.0.1:0"
            })?,
            raft: concrete_addr("127.0.0.1:0")?,
        });
    }
    let secret = zonegate_net::random::hex(16);
    let mut urls = Vec::new();
    for node in &nodes {
        let path = dir.join(format!("node-{}.toml", node.id));
        let data = dir.join(format!("data-{}", node.id));
        let config = demo_config(node, &nodes, &data, &backends) + &claude;
        std::fs::write(&path, config)?;
        let mut cmd = child_command(exe);
        cmd.env(DEMO_ANTHROPIC_KEY_ENV, DEMO_ANTHROPIC_KEY);
        let gw = spawn::serve(cmd, &path, Some(&secret), &[], Duration::from_secs(30)).await?;
        urls.push((gw.urls[0].clone(), gw.urls[1].clone()));
        pipes.push(gw.stdin);
        children.push(gw.child);
    }
    let (data, admin) = urls[0].clone();

    println!(
        "zonegate demo: a 3-zone cluster (one Raft voter per zone), 2 mock backends per zone, \
         and an Anthropic-format one in az-a"
    );
    for (node, (d, a)) in nodes.iter().zip(&urls) {
        println!(
            "  node {} ({}): data plane {d}  admin {a}",
            node.id, node.zone
        );
    }
    for (name, zone, url) in &backends {
        println!("  backend {name} ({zone}): {url}  (faults: POST {url}/mock/faults)");
    }
    println!(
        "  backend claude-a1 (az-a, Anthropic's API, key from ${DEMO_ANTHROPIC_KEY_ENV}): {claude_url}"
    );
    println!("data plane: {data}");
    println!("admin: {admin}");
    println!("api key: {DEMO_API_KEY}");
    println!("admin token: {DEMO_ADMIN_TOKEN}");
    println!();
    println!("try:");
    println!(
        "  curl -s {data}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' \\\n    \
         -H 'Content-Type: application/json' \\\n    \
         -d '{{\"model\":\"{DEMO_MODEL}\",\"max_tokens\":16,\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}' -i"
    );
    println!(
        "  curl -s {data}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' \\\n    \
         -H 'Content-Type: application/json' \\\n    \
         -d '{{\"model\":\"{DEMO_CLAUDE_MODEL}\",\"max_tokens\":16,\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'   # a Claude-style model, same API"
    );
    println!("  zonegate ctl --admin {admin} --token {DEMO_ADMIN_TOKEN} status");
    println!("  zonegate ctl --admin {admin} --token {DEMO_ADMIN_TOKEN} failover --from az-a --to az-b --reason drill");
    println!("  zonegate ctl --admin {admin} --token {DEMO_ADMIN_TOKEN} failback --zone az-a");
    println!("Ctrl-C stops everything.");

    // Stop on Ctrl-C, or as soon as any child dies on its own.
    let died = futures_util::future::select_all(children.iter_mut().map(|c| Box::pin(c.wait())));
    let outcome = tokio::select! {
        () = crate::node::lifecycle::shutdown_signal() => Ok(()),
        (status, idx, _) = died => Err(anyhow!("demo process #{idx} exited unexpectedly: {status:?}")),
    };
    drop(pipes);
    for mut c in children {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    println!("zonegate demo: stopped");
    outcome
}
