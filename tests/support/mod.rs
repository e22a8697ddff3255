//! Helpers for black-box tests: the real `zonegate` binary on 127.0.0.1
//! port 0, mock backends as child processes, and polling with deadlines.
//! Every child is killed when its handle drops (and, started with
//! `--exit-with-parent`, exits if the test process dies first).

#![allow(dead_code)]

pub mod load;
pub mod tls;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use zonegate::config::sha256_hex;
use zonegate::tools::spawn::{self, Spawned};

pub const API_KEY: &str = "test-key-deptA";
pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const VIEWER_TOKEN: &str = "test-viewer-token";
pub const CLUSTER_SECRET: &str = "test-cluster-secret";
pub const MODEL: &str = "qwen25-7b-instruct";

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zonegate"))
}

/// A command running the binary; its children log warnings unless
/// `RUST_LOG` says otherwise.
fn command() -> Command {
    spawn::child_command(&bin())
}

/// The path of `name` on PATH; when it is missing, `None` (the check is
/// skipped, loudly), or a panic where `.ci/run` requires every tool.
pub fn tool(name: &str) -> Option<PathBuf> {
    // .ci/run installs Python tools into a venv under target/.
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/ci-venv/bin")
        .join(name);
    let found = std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        })
        .or_else(|| venv.is_file().then_some(venv));
    if found.is_none() {
        assert!(
            std::env::var("ZONEGATE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "`{name}` is not installed but ZONEGATE_REQUIRE_TOOLS=1: run the install lines of .ci/run"
        );
        eprintln!("SKIPPED: `{name}` is not installed (.ci/run installs it)");
    }
    found
}

/// A mock backend child process.
pub struct Mock {
    pub name: String,
    pub zone: String,
    pub url: String,
    proc: Option<Spawned>,
}

impl Mock {
    pub async fn start(name: &str, zone: &str, models: &[&str]) -> Mock {
        Self::start_args(name, zone, models, &[]).await
    }

    /// A mock with extra `mock-backend` arguments (`--provider azure`,
    /// `--expect-key K`).
    pub async fn start_args(name: &str, zone: &str, models: &[&str], args: &[&str]) -> Mock {
        let timeout = Duration::from_secs(30);
        let proc = spawn::mock_backend_with(command(), name, zone, models, args, timeout)
            .await
            .expect("mock backend starts");
        Mock {
            name: name.into(),
            zone: zone.into(),
            url: proc.urls[0].clone(),
            proc: Some(proc),
        }
    }

    /// Applies a fault patch (`POST /mock/faults`).
    pub async fn faults(&self, patch: Value) {
        let resp = client()
            .post(format!("{}/mock/faults", self.url))
            .json(&patch)
            .send()
            .await
            .expect("mock reachable");
        assert!(
            resp.status().is_success(),
            "fault patch rejected: {}",
            resp.text().await.unwrap_or_default()
        );
    }

    pub async fn stats(&self) -> Value {
        get_json(&format!("{}/mock/stats", self.url), None).await
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let _ = p.child.kill().await;
        }
    }

    /// The `[[backends]]` entry for this mock.
    pub fn backend_toml(&self, models: &[&str]) -> String {
        let models: Vec<String> = models.iter().map(|m| format!("\"{m}\"")).collect();
        format!(
            "[[backends]]\nname = \"{}\"\nzone = \"{}\"\nurl = \"{}\"\nmodels = [{}]\nmetrics_path = \"/metrics\"\n\n",
            self.name,
            self.zone,
            self.url,
            models.join(", ")
        )
    }
}

/// A gateway node child process with its config in a temp dir.
pub struct NodeProcess {
    pub data: String,
    pub admin: String,
    pub dir: tempfile::TempDir,
    proc: Spawned,
}

/// The `[node]`, tenant and admin-token part of a test config.
pub fn base_toml(zone: &str, data_dir: &std::path::Path, node_extra: &str) -> String {
    format!(
        r#"[node]
id = 1
zone = "{zone}"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "{data}"
{node_extra}

{tenant}[[admin.tokens]]
name = "ops"
sha256 = "{token}"
role = "operator"

[[admin.tokens]]
name = "watcher"
sha256 = "{viewer}"
role = "viewer"

"#,
        data = data_dir.display(),
        tenant = tenant_toml("deptA", API_KEY, "P0", ""),
        token = sha256_hex(ADMIN_TOKEN),
        viewer = sha256_hex(VIEWER_TOKEN),
    )
}

/// A `[[tenants]]` entry: its name, API key (stored as its digest),
/// priority and `quota` line (e.g. `quota = { rpm = 6 }`; empty for none).
pub fn tenant_toml(name: &str, key: &str, priority: &str, quota: &str) -> String {
    format!(
        "[[tenants]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\npriority = \"{priority}\"\n{quota}\n\n",
        sha256_hex(key)
    )
}

/// One member of a test cluster: concrete loopback addresses picked before
/// any node starts, since every member's config lists all of them.
#[derive(Clone, Debug)]
pub struct MemberSpec {
    pub id: u64,
    pub zone: String,
    pub admin: String,
    pub raft: String,
    /// `voter`, `learner` or `witness`.
    pub role: &'static str,
}

impl MemberSpec {
    pub fn new(id: u64, zone: &str) -> Self {
        let addr = || zonegate::tools::spawn::concrete_addr("127.0.0.1:0").expect("a free port");
        MemberSpec {
            id,
            zone: zone.into(),
            admin: addr(),
            raft: addr(),
            role: "voter",
        }
    }

    /// One voter per zone of `ZONES`, ids 1 to 3 in that order.
    pub fn one_per_zone() -> Vec<MemberSpec> {
        ZONES
            .iter()
            .enumerate()
            .map(|(i, z)| MemberSpec::new(i as u64 + 1, z))
            .collect()
    }

    pub fn with_role(mut self, role: &'static str) -> Self {
        self.role = role;
        self
    }
}

/// Writes member `me`'s config (`data_dir` under `dir`) to
/// `dir/gateway.toml` and returns its path.
pub fn write_member_config(
    dir: &std::path::Path,
    me: &MemberSpec,
    members: &[MemberSpec],
    rest: &str,
) -> PathBuf {
    let base = base_toml(&me.zone, &dir.join("data"), "")
        .replace("id = 1\n", &format!("id = {}\n", me.id))
        .replace(
            "admin_listen = \"127.0.0.1:0\"",
            &format!("admin_listen = \"{}\"", me.admin),
        );
    let config = format!("{base}{}{}", members_toml(members), plaintext_cluster(rest));
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

/// `rest` with `[cluster] allow_plaintext = true`: test clusters talk
/// over loopback without TLS (the TLS tests configure `[cluster.tls]`
/// themselves).
pub fn plaintext_cluster(rest: &str) -> String {
    if rest.contains("[cluster.tls]") {
        rest.to_owned()
    } else if rest.contains("[cluster]\n") {
        rest.replacen("[cluster]\n", "[cluster]\nallow_plaintext = true\n", 1)
    } else {
        format!("{rest}\n[cluster]\nallow_plaintext = true\n")
    }
}

pub fn members_toml(members: &[MemberSpec]) -> String {
    members
        .iter()
        .map(|m| {
            format!(
                "[[cluster.members]]\nid = {}\nzone = \"{}\"\nraft = \"{}\"\nadmin = \"{}\"\nrole = \"{}\"\n\n",
                m.id, m.zone, m.raft, m.admin, m.role
            )
        })
        .collect()
}

impl NodeProcess {
    /// Starts `zonegate serve` with the base config plus `rest` (backends,
    /// models, sections).
    pub async fn start(zone: &str, rest: &str) -> NodeProcess {
        Self::start_with(zone, "", rest).await
    }

    /// Like [`NodeProcess::start`], with extra keys for the `[node]` table.
    pub async fn start_with(zone: &str, node_extra: &str, rest: &str) -> NodeProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = format!(
            "{}{rest}",
            base_toml(zone, &dir.path().join("data"), node_extra)
        );
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write config");
        Self::serve(command(), dir, &path, None, &[]).await
    }

    /// Like [`NodeProcess::start`], with `env` set for the node and its
    /// log (stderr) written to `dir/stderr.log`.
    pub async fn start_env_logging(zone: &str, rest: &str, env: &[(&str, &str)]) -> NodeProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = format!("{}{rest}", base_toml(zone, &dir.path().join("data"), ""));
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write config");
        let log = std::fs::File::create(dir.path().join("stderr.log")).expect("log file");
        let mut cmd = command();
        cmd.envs(env.iter().copied());
        cmd.stderr(log);
        Self::serve(cmd, dir, &path, None, &[]).await
    }

    /// `zonegate serve --config <config> <args>…` from `cmd` (with
    /// `secret` as the cluster secret), until it announces its data and
    /// admin addresses; `dir` holds its config and data.
    async fn serve(
        cmd: Command,
        dir: tempfile::TempDir,
        config: &std::path::Path,
        secret: Option<&str>,
        args: &[&str],
    ) -> NodeProcess {
        let proc = spawn::serve(cmd, config, secret, args, Duration::from_secs(30))
            .await
            .expect("gateway starts");
        NodeProcess {
            data: proc.urls[0].clone(),
            admin: proc.urls[1].clone(),
            dir,
            proc,
        }
    }

    /// Starts cluster member `me` of `members`, with `rest` (backends…).
    pub async fn start_member(me: &MemberSpec, members: &[MemberSpec], rest: &str) -> NodeProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_member_in(dir, me, members, rest).await
    }

    /// Starts member `me` with its config and `data_dir` under `dir`; a
    /// directory kept from [`NodeProcess::kill_keeping_data`] restarts it.
    pub async fn start_member_in(
        dir: tempfile::TempDir,
        me: &MemberSpec,
        members: &[MemberSpec],
        rest: &str,
    ) -> NodeProcess {
        Self::start_member_with(dir, me, members, rest, &[]).await
    }

    /// Like [`NodeProcess::start_member_in`], with extra `serve` arguments
    /// (e.g. `--rejoin`).
    pub async fn start_member_with(
        dir: tempfile::TempDir,
        me: &MemberSpec,
        members: &[MemberSpec],
        rest: &str,
        args: &[&str],
    ) -> NodeProcess {
        Self::start_member_secret(dir, me, members, rest, args, CLUSTER_SECRET).await
    }

    /// Starts member `me` with its stderr (the log) written to
    /// `dir/stderr.log`.
    pub async fn start_member_logging(
        dir: tempfile::TempDir,
        me: &MemberSpec,
        members: &[MemberSpec],
        rest: &str,
    ) -> NodeProcess {
        let path = write_member_config(dir.path(), me, members, rest);
        let log = std::fs::File::create(dir.path().join("stderr.log")).expect("log file");
        let mut cmd = command();
        cmd.stderr(log);
        Self::serve(cmd, dir, &path, Some(CLUSTER_SECRET), &[]).await
    }

    /// Like [`NodeProcess::start_member_with`], with `secret` as
    /// `ZONEGATE_CLUSTER_SECRET` (a rotation's `new,old`).
    pub async fn start_member_secret(
        dir: tempfile::TempDir,
        me: &MemberSpec,
        members: &[MemberSpec],
        rest: &str,
        args: &[&str],
        secret: &str,
    ) -> NodeProcess {
        let path = write_member_config(dir.path(), me, members, rest);
        Self::serve(command(), dir, &path, Some(secret), args).await
    }

    /// Starts `zonegate serve` with exactly `config`, written to
    /// `dir/gateway.toml` (the cluster secret set, for configs with
    /// members).
    pub async fn start_config(dir: tempfile::TempDir, config: &str) -> NodeProcess {
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write config");
        Self::serve(command(), dir, &path, Some(CLUSTER_SECRET), &[]).await
    }

    /// kill -9, and wait for the process to be gone.
    pub async fn kill(mut self) {
        let _ = self.proc.child.kill().await;
    }

    /// kill -9, keeping the node's directory (config and `data_dir`).
    pub async fn kill_keeping_data(mut self) -> tempfile::TempDir {
        let _ = self.proc.child.kill().await;
        self.dir
    }

    pub fn chat(&self) -> reqwest::RequestBuilder {
        client()
            .post(format!("{}/v1/chat/completions", self.data))
            .bearer_auth(API_KEY)
    }

    pub async fn metrics(&self) -> String {
        client()
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .expect("admin reachable")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn admin_get(&self, path: &str) -> Value {
        get_json(&format!("{}{path}", self.admin), Some(ADMIN_TOKEN)).await
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.child.id()
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

pub async fn get_json(url: &str, token: Option<&str>) -> Value {
    let mut req = client().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

pub fn chat_body(max_tokens: u64, stream: bool) -> Value {
    serde_json::json!({
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

/// A Raft vote sent to `raft` unsigned (with the old cleartext-secret
/// header `x-zonegate-cluster-secret: <secret>` when given); returns the
/// status.
pub async fn unsigned_raft_vote(raft: &str, secret: Option<&str>) -> u16 {
    let mut req = client().post(format!("http://{raft}/raft/v1/vote"));
    if let Some(secret) = secret {
        req = req.header("x-zonegate-cluster-secret", secret);
    }
    req.body("x")
        .send()
        .await
        .expect("the Raft port answers")
        .status()
        .as_u16()
}

/// Polls `check` every 100 ms until it returns true or `deadline` passes;
/// panics with `what` on timeout. Generous deadlines keep a busy 2-core
/// machine from failing a correct build.
pub async fn eventually<F, Fut>(deadline: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= end {
            panic!("timed out after {deadline:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sum of a Prometheus counter's samples whose label set contains all of
/// `labels` (e.g. `outcome="ok"`).
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The zones of the multi-process cluster tests.
pub const ZONES: [&str; 3] = ["az-a", "az-b", "az-c"];

/// Three gateway processes, one Raft voter per zone (ids 1–3 in `ZONES`
/// order), each with `mocks_per_zone` mock backends named `<zone>-<n>`.
pub struct TestCluster {
    pub members: Vec<MemberSpec>,
    /// What every member's config holds besides its own `[node]` and the
    /// members: the mocks' `[[backends]]` and `extra` (a member restarted
    /// by a test starts from it again).
    pub rest: String,
    /// `None` once a test killed that node.
    pub nodes: Vec<Option<NodeProcess>>,
    pub mocks: std::collections::HashMap<String, Mock>,
}

impl TestCluster {
    /// `extra` is appended to every node's config (e.g. a `[failover]` table).
    pub async fn start(mocks_per_zone: usize, extra: &str) -> TestCluster {
        let mut mocks = std::collections::HashMap::new();
        let mut rest = String::new();
        for z in ZONES {
            for n in 1..=mocks_per_zone {
                let name = format!("{z}-{n}");
                let m = Mock::start(&name, z, &[MODEL]).await;
                rest.push_str(&m.backend_toml(&[MODEL]));
                mocks.insert(name, m);
            }
        }
        rest.push_str(extra);
        let members = MemberSpec::one_per_zone();
        let mut nodes = Vec::new();
        for m in &members {
            nodes.push(Some(NodeProcess::start_member(m, &members, &rest).await));
        }
        TestCluster {
            members,
            rest,
            nodes,
            mocks,
        }
    }

    pub fn node(&self, id: u64) -> &NodeProcess {
        self.nodes[id as usize - 1]
            .as_ref()
            .expect("node is running")
    }

    pub fn in_zone(&self, zone: &str) -> &NodeProcess {
        let i = ZONES.iter().position(|z| *z == zone).expect("a test zone");
        self.node(i as u64 + 1)
    }

    pub fn running(&self) -> impl Iterator<Item = &NodeProcess> {
        self.nodes.iter().flatten()
    }

    /// Polls until every running node names the same leader; returns it.
    pub async fn leader(&self) -> u64 {
        let admins: Vec<String> = self.running().map(|g| g.admin.clone()).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut leaders = Vec::new();
            for admin in &admins {
                let v = get_json(
                    &format!("{admin}/admin/v1/cluster?scope=local"),
                    Some(ADMIN_TOKEN),
                )
                .await;
                leaders.push(v["leader"].as_u64());
            }
            if let Some(Some(l)) = leaders.first() {
                if leaders.iter().all(|x| *x == Some(*l)) && self.nodes[*l as usize - 1].is_some() {
                    // A leader proposes only once a quorum acknowledged it
                    // in its term.
                    let v = get_json(
                        &format!("{}/admin/v1/cluster?scope=local", self.node(*l).admin),
                        Some(ADMIN_TOKEN),
                    )
                    .await;
                    if v["millis_since_quorum_ack"].is_u64() {
                        return *l;
                    }
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no agreed leader: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls until every running node has applied `version`.
    pub async fn all_at(&self, version: u64) {
        let admins: Vec<String> = self.running().map(|g| g.admin.clone()).collect();
        eventually(
            Duration::from_secs(20),
            &format!("every node at version {version}"),
            || {
                let admins = admins.clone();
                async move {
                    for admin in admins {
                        let v = get_json(
                            &format!("{admin}/admin/v1/cluster?scope=local"),
                            Some(ADMIN_TOKEN),
                        )
                        .await;
                        if v["decision_version"] != version {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await;
    }
}

/// `zonegate ctl --admin <admin> --token ADMIN_TOKEN` without a terminal
/// (stdin closed, `NO_COLOR` unset, no `ZONEGATE_ADMIN*` of the caller's):
/// add the verb and run it.
pub fn ctl_command(admin: &str) -> Command {
    let mut cmd = spawn::ctl_command(&bin(), admin, ADMIN_TOKEN);
    cmd.stdin(std::process::Stdio::null())
        .env_remove("NO_COLOR");
    cmd
}

/// Runs `zonegate ctl --admin URL --token T ARGS…` without a terminal;
/// returns (exit code, stdout, stderr).
pub async fn ctl(admin: &str, args: &[&str]) -> (i32, String, String) {
    let out = ctl_command(admin)
        .args(args)
        .output()
        .await
        .expect("ctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ctl ARGS…`, which must exit 0; returns its stdout.
pub async fn ctl_ok(admin: &str, args: &[&str]) -> String {
    let (code, out, err) = ctl(admin, args).await;
    assert_eq!(code, 0, "ctl {args:?} failed: {err}\n{out}");
    out
}

/// `ctl --json ARGS…` for a write, which must exit 0; a `no_leader`
/// refusal (no leader with a quorum for a moment, as on a loaded host:
/// "nothing was changed; retry shortly") is retried for up to 60 s, as
/// an operator would.
pub async fn ctl_json_led(admin: &str, args: &[&str]) -> Value {
    let args = [&["--json"], args].concat();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out, err) = ctl(admin, &args).await;
        if code == 0 {
            return serde_json::from_str(out.trim())
                .unwrap_or_else(|e| panic!("ctl {args:?}: no JSON ({e}): {out}"));
        }
        assert!(
            err.contains("no_leader") && tokio::time::Instant::now() < deadline,
            "ctl {args:?} failed: {err}\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `ctl --json ARGS…`, which must exit 0; returns the JSON it printed.
pub async fn ctl_json(admin: &str, args: &[&str]) -> Value {
    let out = ctl_ok(admin, &[&["--json"], args].concat()).await;
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("ctl {args:?}: no JSON ({e}): {out}"))
}

/// `zonegate demo` on 127.0.0.1 port 0 (killed on drop), and what it
/// printed: the az-a node's data-plane and admin URLs, the API key, the
/// admin token and every backend's URL.
pub struct Demo {
    pub child: tokio::process::Child,
    pub data: String,
    pub admin: String,
    pub api_key: String,
    pub admin_token: String,
    pub backends: Vec<String>,
}

impl Demo {
    /// Starts the demo with `RUST_LOG=log` and waits for its banner.
    pub async fn start(log: &str) -> Demo {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(bin())
            .args([
                "demo",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", log)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the demo starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let read = async {
            let (mut data, mut admin, mut key, mut token) = (None, None, None, None);
            let mut backends = Vec::new();
            while let Some(line) = lines.next_line().await.expect("demo output") {
                let value = |p: &str| line.strip_prefix(p).map(|s| s.trim().to_owned());
                data = data.or(value("data plane:"));
                admin = admin.or(value("admin:"));
                key = key.or(value("api key:"));
                token = token.or(value("admin token:"));
                // `  backend qwen-a1 (az-a): http://…  (faults: …)`
                if line.trim_start().starts_with("backend ") {
                    backends.extend(
                        line.split("): ")
                            .nth(1)
                            .and_then(|rest| rest.split_whitespace().next())
                            .map(str::to_owned),
                    );
                }
                if line.starts_with("Ctrl-C") {
                    break;
                }
            }
            let missing = "the demo prints its data plane, admin, api key and admin token";
            Demo {
                data: data.expect(missing),
                admin: admin.expect(missing),
                api_key: key.expect(missing),
                admin_token: token.expect(missing),
                backends,
                child,
            }
        };
        let demo = tokio::time::timeout(Duration::from_secs(90), read)
            .await
            .expect("the demo prints its URLs within 90 s");
        // The rest of its output, read so it never blocks on the pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        demo
    }
}
