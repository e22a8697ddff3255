//! Preparing the target: a local cluster started from its topology, or an
//! existing cluster read through its admin API and mock backends.

use std::path::Path;

use anyhow::anyhow;
use serde_json::Value;

use super::{Drill, MockInfo, NodeInfo};
use crate::local::{LocalCluster, Topology, DRILL_ADMIN_TOKEN};
use crate::observe::Admin;
use crate::scenario::{Scenario, Target};

impl<'a> Drill<'a> {
    pub(super) async fn prepare(sc: &'a Scenario, exe: &Path) -> anyhow::Result<Drill<'a>> {
        match &sc.target {
            Target::Local {
                topology,
                node_config,
            } => {
                let topo = Topology::read(topology)?;
                let model = match &sc.load.model {
                    Some(m) => m.clone(),
                    None => topo
                        .models
                        .first()
                        .cloned()
                        .ok_or_else(|| anyhow!("the topology's backends serve no model"))?,
                };
                println!(
                    "starting a local cluster: {} nodes, {} mock backends",
                    topo.members.len(),
                    topo.backends.len()
                );
                let local = LocalCluster::start(
                    exe,
                    &topo,
                    node_config,
                    sc.load.tenants,
                    &sc.load.tenant_quotas,
                )
                .await?;
                let nodes = local
                    .nodes
                    .iter()
                    .map(|n| NodeInfo {
                        id: n.id,
                        zone: n.zone.clone(),
                        admin: n.admin_url.clone(),
                        data: n.data_url.clone(),
                    })
                    .collect();
                let mocks = local
                    .mocks
                    .iter()
                    .map(|m| MockInfo {
                        name: m.name.clone(),
                        zone: m.zone.clone(),
                        url: m.url.clone(),
                        baseline: Value::Null,
                    })
                    .collect();
                for n in &local.nodes {
                    println!(
                        "  node {} ({}): data {} admin {}",
                        n.id, n.zone, n.data_url, n.admin_url
                    );
                }
                for m in &local.mocks {
                    println!("  backend {} ({}): {}", m.name, m.zone, m.url);
                }
                Ok(Drill {
                    sc,
                    exe: exe.to_owned(),
                    api_keys: local.api_keys.clone(),
                    local: Some(local),
                    nodes,
                    mocks,
                    admin: Admin::new(DRILL_ADMIN_TOKEN.to_owned()),
                    model,
                })
            }
            Target::Cluster {
                admin,
                data,
                token_env,
                api_key_env,
                backends,
            } => {
                let token = std::env::var(token_env).map_err(|_| {
                    anyhow!("the admin token is read from ${token_env}, which is not set")
                })?;
                let key = std::env::var(api_key_env).map_err(|_| {
                    anyhow!("the API key is read from ${api_key_env}, which is not set")
                })?;
                let model = sc
                    .load
                    .model
                    .clone()
                    .ok_or_else(|| anyhow!("load.model: required for a cluster target"))?;
                let api = Admin::new(token);
                let mut nodes = Vec::new();
                for (i, url) in admin.iter().enumerate() {
                    let url = url.trim_end_matches('/').to_owned();
                    let v = api
                        .get(&format!("{url}/admin/v1/cluster?scope=local"))
                        .await
                        .ok_or_else(|| {
                            anyhow!("{url}: the admin API did not answer (URL, token?)")
                        })?;
                    nodes.push(NodeInfo {
                        id: v["node_id"].as_u64().unwrap_or(i as u64 + 1),
                        zone: v["zone"].as_str().unwrap_or_default().to_owned(),
                        admin: url,
                        data: data
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| data[i % data.len()].clone())
                            .trim_end_matches('/')
                            .to_owned(),
                    });
                }
                let mut mocks = Vec::new();
                for (name, url) in backends {
                    let url = url.trim_end_matches('/').to_owned();
                    let stats = api.get(&format!("{url}/mock/stats")).await.ok_or_else(|| {
                        anyhow!("backend {name} at {url}: /mock/stats did not answer")
                    })?;
                    mocks.push(MockInfo {
                        name: name.clone(),
                        zone: stats["zone"].as_str().unwrap_or_default().to_owned(),
                        url,
                        baseline: Value::Null,
                    });
                }
                Ok(Drill {
                    sc,
                    exe: exe.to_owned(),
                    local: None,
                    nodes,
                    mocks,
                    admin: api,
                    api_keys: vec![key],
                    model,
                })
            }
        }
    }
}
