//! Validation of `[node]` and `[admin]`: this node's own ports, threads
//! and admin API.

use std::time::Duration;

use zonegate_cluster::ZoneId;

use super::bounds;
use super::raw::*;
use super::Validator;
use super::*;

/// More data-plane threads than this is a typo, not a machine.
const MAX_DATA_PLANE_THREADS: u64 = 1024;

impl Validator<'_> {
    pub(super) fn node(&self, raw: RawNode) -> Result<NodeConfig, ConfigError> {
        if raw.zone.trim().is_empty() {
            return Err(self.err("node.zone", "must not be empty"));
        }
        let max_body_bytes = self.int(
            "node.max_body_bytes",
            Some(raw.max_body_bytes),
            0,
            bounds::BODY_BYTES,
        )?;
        let raft_listen = match raw.raft_listen.as_deref() {
            Some(s) => Some(self.addr("node.raft_listen", s)?),
            None => None,
        };
        let data_plane_threads = match raw.data_plane_threads {
            None => None,
            Some(n @ 1..=MAX_DATA_PLANE_THREADS) => Some(n as usize),
            Some(_) => {
                return Err(self.err(
                    "node.data_plane_threads",
                    format!(
                    "must be between 1 and {MAX_DATA_PLANE_THREADS} (or left out: one per core)"
                ),
                ))
            }
        };
        let data_plane_scheduling = match raw.data_plane_scheduling.as_deref() {
            None | Some("batch") => Scheduling::Batch,
            Some("normal") => Scheduling::Normal,
            Some(other) => {
                return Err(self.err(
                    "node.data_plane_scheduling",
                    format!("must be \"batch\" or \"normal\", not {other:?}"),
                ))
            }
        };
        Ok(NodeConfig {
            id: raw.id,
            zone: ZoneId::new(raw.zone.trim()),
            listen: self.addr("node.listen", &raw.listen)?,
            admin_listen: self.addr("node.admin_listen", &raw.admin_listen)?,
            data_dir: raw.data_dir,
            raft_listen,
            max_body_bytes: usize::try_from(max_body_bytes)
                .map_err(|_| self.err("node.max_body_bytes", "too large for this machine"))?,
            data_plane_threads,
            data_plane_scheduling,
            drain_grace: self.duration(
                "node.drain_grace",
                raw.drain_grace.as_deref(),
                Duration::from_secs(5),
                bounds::DRAIN_TIME,
            )?,
            drain_timeout: self.duration(
                "node.drain_timeout",
                raw.drain_timeout.as_deref(),
                Duration::from_secs(30),
                bounds::DRAIN_TIME,
            )?,
            tls: self.tls("node", raw.tls, false)?,
            limits: self.limits("node", raw.limits)?,
        })
    }

    pub(super) fn admin(&self, raw: RawAdmin) -> Result<AdminConfig, ConfigError> {
        let tokens = raw
            .tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                Ok(AdminToken {
                    hash: self.sha256(&format!("admin.tokens[{i}].sha256"), &t.sha256)?,
                    allow_from: self
                        .networks(&format!("admin.tokens[{i}].allow_from"), &t.allow_from)?,
                    name: t.name,
                    role: t.role,
                })
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok(AdminConfig {
            tokens,
            tls: self.tls("admin", raw.tls, false)?,
            limits: self.limits("admin", raw.limits)?,
            metrics_auth: raw.metrics_auth,
        })
    }
}
