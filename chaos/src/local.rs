//! The local target: a cluster the drill starts itself from a topology
//! folder (e.g. `config/local-3az/`): a mock backend per configured
//! backend, one `zonegate serve` per member, every member's Raft address
//! pointing at a relay the drill controls. All are child processes of
//! this binary started with `--exit-with-parent` and killed on drop.

use crate::spawn::{self, Spawned};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use sha2::{Digest, Sha256};
use tokio::process::Command;

use crate::relay::Relays;
use crate::scenario::TenantQuota;

/// The admin token the drill gives itself on local clusters.
pub const DRILL_ADMIN_TOKEN: &str = "zonegate-drill-operator";

/// A loopback address with a free port below the ephemeral range (see
/// `spawn::concrete_addr`).
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(crate::spawn::concrete_addr("127.0.0.1:0")?.parse()?)
}

fn child_command(exe: &Path) -> Command {
    spawn::child_command_logging(exe, "error,openraft=off")
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// What a topology folder describes: its members and backends, and each
/// member's own config file.
#[derive(Clone, Debug)]
pub struct Topology {
    /// id → (zone, role, its config table).
    pub members: BTreeMap<u64, (String, String, toml::Table)>,
    /// (name, zone, models) of every backend.
    pub backends: Vec<(String, String, Vec<String>)>,
    /// Logical models, in the order the configs name them.
    pub models: Vec<String>,
}

fn get<'a>(t: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let (first, rest) = path.split_first()?;
    let v = t.get(*first)?;
    if rest.is_empty() {
        Some(v)
    } else {
        get(v.as_table()?, rest)
    }
}

impl Topology {
    /// Reads every `*.toml` of `dir`; each must be one member's config.
    pub fn read(dir: &Path) -> anyhow::Result<Topology> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("topology {}: cannot read the folder", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let mut members = BTreeMap::new();
        let mut list: Option<Vec<toml::Value>> = None;
        let mut backends = Vec::new();
        let mut models = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("{}: cannot read", f.display()))?;
            let t: toml::Table =
                toml::from_str(&text).with_context(|| format!("{}: not TOML", f.display()))?;
            let id = get(&t, &["node", "id"])
                .and_then(toml::Value::as_integer)
                .ok_or_else(|| anyhow!("{}: node.id: missing", f.display()))?
                as u64;
            let zone = get(&t, &["node", "zone"])
                .and_then(toml::Value::as_str)
                .ok_or_else(|| anyhow!("{}: node.zone: missing", f.display()))?
                .to_owned();
            let mlist = get(&t, &["cluster", "members"])
                .and_then(toml::Value::as_array)
                .ok_or_else(|| {
                    anyhow!("{}: cluster.members: a drill needs a cluster", f.display())
                })?;
            let role = mlist
                .iter()
                .find(|m| m.get("id").and_then(toml::Value::as_integer) == Some(id as i64))
                .and_then(|m| m.get("role").and_then(toml::Value::as_str))
                .unwrap_or("voter")
                .to_owned();
            if list.is_none() {
                list = Some(mlist.clone());
                for b in t
                    .get("backends")
                    .and_then(toml::Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = b
                        .get("name")
                        .and_then(toml::Value::as_str)
                        .unwrap_or_default();
                    let zone = b
                        .get("zone")
                        .and_then(toml::Value::as_str)
                        .unwrap_or_default();
                    let ms: Vec<String> = b
                        .get("models")
                        .and_then(toml::Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|m| m.as_str().map(str::to_owned))
                        .collect();
                    for m in &ms {
                        if !models.contains(m) {
                            models.push(m.clone());
                        }
                    }
                    backends.push((name.to_owned(), zone.to_owned(), ms));
                }
            }
            if members.insert(id, (zone, role, t)).is_some() {
                bail!("{}: node.id {id} is in two files", f.display());
            }
        }
        let Some(list) = list else {
            bail!("topology {}: no *.toml node configs", dir.display());
        };
        for m in &list {
            let id = m.get("id").and_then(toml::Value::as_integer).unwrap_or(0) as u64;
            if !members.contains_key(&id) {
                bail!("topology {}: member {id} has no config file", dir.display());
            }
        }
        if backends.is_empty() {
            bail!("topology {}: no [[backends]]", dir.display());
        }
        Ok(Topology {
            members,
            backends,
            models,
        })
    }
}

/// Deep-merges `over` into `base` (tables merge, everything else replaces).
pub fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Running,
    Paused,
    Killed,
}

/// One member process.
pub struct LocalNode {
    pub id: u64,
    pub zone: String,
    pub data_url: String,
    pub admin_url: String,
    config: PathBuf,
    proc: Option<Spawned>,
    pub state: NodeState,
}

impl LocalNode {
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(|p| p.child.id())
    }
}

/// One mock backend process.
pub struct LocalMock {
    pub name: String,
    pub zone: String,
    pub url: String,
    _proc: Spawned,
}

/// A running local cluster.
pub struct LocalCluster {
    exe: PathBuf,
    secret: String,
    pub nodes: Vec<LocalNode>,
    pub mocks: Vec<LocalMock>,
    pub relays: Relays,
    pub api_keys: Vec<String>,
    pub models: Vec<String>,
    // Last: removed after the processes are gone.
    _dir: tempfile::TempDir,
}

async fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    // `kill(1)` rather than libc: the workspace forbids unsafe code.
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .await
        .context("cannot run kill(1)")?;
    if !status.success() {
        bail!("kill -{sig} {pid} failed: {status}");
    }
    Ok(())
}

impl LocalCluster {
    /// Starts the mocks, the relays and every member of `topology`, with
    /// `node_config` merged into each member's config and `tenants` API
    /// keys of the drill's own, tenant `i` with `quotas[i]` when given.
    pub async fn start(
        exe: &Path,
        topology: &Topology,
        node_config: &toml::Table,
        tenants: u32,
        quotas: &[TenantQuota],
    ) -> anyhow::Result<LocalCluster> {
        let dir = tempfile::Builder::new()
            .prefix("zonegate-drill-")
            .tempdir()?;
        let mut mocks = Vec::new();
        for (name, zone, models) in &topology.backends {
            let p = spawn::mock_backend(
                child_command(exe),
                name,
                zone,
                models,
                Duration::from_secs(30),
            )
            .await?;
            mocks.push(LocalMock {
                name: name.clone(),
                zone: zone.clone(),
                url: p.urls[0].clone(),
                _proc: p,
            });
        }
        // Addresses are fixed before any member starts: each lists all.
        let mut raft_real = BTreeMap::new();
        let mut admin = BTreeMap::new();
        let mut data = BTreeMap::new();
        for &id in topology.members.keys() {
            raft_real.insert(id, free_addr()?);
            admin.insert(id, free_addr()?);
            data.insert(id, free_addr()?);
        }
        let relays = Relays::start(&raft_real)
            .await
            .context("cannot bind the Raft relays")?;
        let nonce = format!("{:016x}", fastrand::u64(..));
        let api_keys: Vec<String> = (1..=tenants)
            .map(|i| format!("sk-drill-{i}-{nonce}"))
            .collect();
        let secret = format!("{:032x}", fastrand::u128(..));
        let mut nodes = Vec::new();
        for (&id, (zone, _role, table)) in &topology.members {
            let mut t = table.clone();
            let node = t
                .entry("node")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| anyhow!("node {id}: [node] is not a table"))?;
            node.insert("listen".into(), data[&id].to_string().into());
            node.insert("admin_listen".into(), admin[&id].to_string().into());
            node.insert("raft_listen".into(), raft_real[&id].to_string().into());
            node.insert(
                "data_dir".into(),
                dir.path()
                    .join(format!("data-{id}"))
                    .display()
                    .to_string()
                    .into(),
            );
            if let Some(toml::Value::Array(ms)) =
                t.get_mut("cluster").and_then(|c| c.get_mut("members"))
            {
                for m in ms.iter_mut().filter_map(toml::Value::as_table_mut) {
                    let mid = m.get("id").and_then(toml::Value::as_integer).unwrap_or(0) as u64;
                    if let (Some(r), Some(a)) = (relays.addrs.get(&mid), admin.get(&mid)) {
                        m.insert("raft".into(), r.to_string().into());
                        m.insert("admin".into(), a.to_string().into());
                    }
                }
            }
            if let Some(toml::Value::Array(bs)) = t.get_mut("backends") {
                for b in bs.iter_mut().filter_map(toml::Value::as_table_mut) {
                    let name = b
                        .get("name")
                        .and_then(toml::Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    if let Some(m) = mocks.iter().find(|m| m.name == name) {
                        b.insert("url".into(), m.url.clone().into());
                    }
                }
            }
            let tenants_arr = t
                .entry("tenants")
                .or_insert_with(|| toml::Value::Array(Vec::new()));
            if let toml::Value::Array(a) = tenants_arr {
                for (i, key) in api_keys.iter().enumerate() {
                    let mut tenant = toml::Table::new();
                    tenant.insert("name".into(), format!("drill-{}", i + 1).into());
                    tenant.insert("key_sha256".into(), sha256_hex(key).into());
                    tenant.insert("priority".into(), "P0".into());
                    if let Some(q) = quotas.get(i) {
                        tenant.insert("quota".into(), toml::Value::Table(q.to_table()));
                    }
                    a.push(toml::Value::Table(tenant));
                }
            }
            let admin_t = t
                .entry("admin")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(admin_t) = admin_t.as_table_mut() {
                let tokens = admin_t
                    .entry("tokens")
                    .or_insert_with(|| toml::Value::Array(Vec::new()));
                if let toml::Value::Array(a) = tokens {
                    let mut tok = toml::Table::new();
                    tok.insert("name".into(), "drill".into());
                    tok.insert("sha256".into(), sha256_hex(DRILL_ADMIN_TOKEN).into());
                    tok.insert("role".into(), "operator".into());
                    a.push(toml::Value::Table(tok));
                }
            }
            merge(&mut t, node_config);
            let path = dir.path().join(format!("node-{id}.toml"));
            std::fs::write(&path, toml::to_string(&t)?)?;
            nodes.push(LocalNode {
                id,
                zone: zone.clone(),
                data_url: format!("http://{}", data[&id]),
                admin_url: format!("http://{}", admin[&id]),
                config: path,
                proc: None,
                state: NodeState::Killed,
            });
        }
        let mut cluster = LocalCluster {
            exe: exe.to_owned(),
            secret,
            nodes,
            mocks,
            relays,
            api_keys,
            models: topology.models.clone(),
            _dir: dir,
        };
        for i in 0..cluster.nodes.len() {
            cluster.spawn_node(i).await?;
        }
        Ok(cluster)
    }

    async fn spawn_node(&mut self, i: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[i];
        let p = spawn::serve(
            child_command(&self.exe),
            &node.config,
            Some(&self.secret),
            &[],
            Duration::from_secs(60),
        )
        .await
        .with_context(|| format!("node {}", node.id))?;
        node.proc = Some(p);
        node.state = NodeState::Running;
        Ok(())
    }

    pub fn index(&self, id: u64) -> anyhow::Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| anyhow!("no node {id} in the topology"))
    }

    /// kill -9.
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let i = self.index(id)?;
        let node = &mut self.nodes[i];
        if let Some(mut p) = node.proc.take() {
            if node.state == NodeState::Paused {
                // SIGKILL works on a stopped process; resume is not needed.
            }
            p.child.start_kill()?;
            let _ = p.child.wait().await;
        }
        node.state = NodeState::Killed;
        Ok(())
    }

    pub async fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        let i = self.index(id)?;
        let pid = self.nodes[i]
            .pid()
            .ok_or_else(|| anyhow!("node {id} is not running"))?;
        signal(pid, "STOP").await?;
        self.nodes[i].state = NodeState::Paused;
        Ok(())
    }

    pub async fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        let i = self.index(id)?;
        let pid = self.nodes[i]
            .pid()
            .ok_or_else(|| anyhow!("node {id} is not running"))?;
        signal(pid, "CONT").await?;
        self.nodes[i].state = NodeState::Running;
        Ok(())
    }

    /// Stops `id` gracefully (SIGTERM, SIGKILL after 10 s) if it runs, then
    /// starts it again on the same config and data.
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let i = self.index(id)?;
        if self.nodes[i].state == NodeState::Paused {
            self.resume(id).await?;
        }
        if let Some(mut p) = self.nodes[i].proc.take() {
            if let Some(pid) = p.child.id() {
                let _ = signal(pid, "TERM").await;
            }
            if tokio::time::timeout(Duration::from_secs(10), p.child.wait())
                .await
                .is_err()
            {
                let _ = p.child.start_kill();
                let _ = p.child.wait().await;
            }
        }
        self.nodes[i].state = NodeState::Killed;
        self.spawn_node(i).await
    }

    /// Puts every process back to running: resumes paused nodes and
    /// starts killed ones. Returns what it did.
    pub async fn restore_nodes(&mut self) -> Vec<String> {
        let mut done = Vec::new();
        for i in 0..self.nodes.len() {
            let id = self.nodes[i].id;
            match self.nodes[i].state {
                NodeState::Paused => match self.resume(id).await {
                    Ok(()) => done.push(format!("resumed node {id}")),
                    Err(e) => done.push(format!("could not resume node {id}: {e:#}")),
                },
                NodeState::Killed => match self.spawn_node(i).await {
                    Ok(()) => done.push(format!("started node {id} again")),
                    Err(e) => done.push(format!("could not start node {id}: {e:#}")),
                },
                NodeState::Running => {}
            }
        }
        done
    }

    /// Whether each node's process is alive (not exited): id → alive.
    pub fn alive(&mut self) -> BTreeMap<u64, bool> {
        self.nodes
            .iter_mut()
            .map(|n| {
                let alive = n
                    .proc
                    .as_mut()
                    .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)));
                (n.id, alive)
            })
            .collect()
    }

    /// Stops everything: resumes paused processes (so they can die) and
    /// kills every child.
    pub async fn shutdown(mut self) {
        for n in &mut self.nodes {
            if let Some(mut p) = n.proc.take() {
                if n.state == NodeState::Paused {
                    if let Some(pid) = p.child.id() {
                        let _ = signal(pid, "CONT").await;
                    }
                }
                let _ = p.child.start_kill();
                let _ = p.child.wait().await;
            }
        }
        for m in &mut self.mocks {
            let _ = m._proc.child.start_kill();
            let _ = m._proc.child.wait().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_topology_reads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/local-3az");
        let t = Topology::read(&dir).unwrap();
        assert_eq!(t.members.len(), 3);
        assert_eq!(t.members[&2].0, "az-b");
        assert_eq!(t.backends.len(), 6);
        assert_eq!(t.models, vec!["qwen25-7b-instruct".to_owned()]);
    }

    #[test]
    fn merge_is_deep() {
        let mut base: toml::Table =
            toml::from_str("[failover]\nperiod = \"2s\"\ncutoff = 0.4\n").unwrap();
        let over: toml::Table =
            toml::from_str("[failover]\nperiod = \"1s\"\n[health]\ninterval = \"1s\"\n").unwrap();
        merge(&mut base, &over);
        assert_eq!(base["failover"]["period"].as_str(), Some("1s"));
        assert_eq!(base["failover"]["cutoff"].as_float(), Some(0.4));
        assert_eq!(base["health"]["interval"].as_str(), Some("1s"));
    }
}
