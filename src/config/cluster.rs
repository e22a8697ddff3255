//! Validation of `[cluster]`: its settings, its members (and this node's
//! place among them), and failover.

use std::collections::{HashMap, HashSet};

use zonegate_cluster::{FailoverConfig, Member, ScoreWeights, ZoneId};

use super::bounds;
use super::raw::*;
use super::Validator;
use super::*;

impl Validator<'_> {
    /// `[cluster]` timing: election_timeout_min ≥ 3 × heartbeat (several
    /// heartbeats per timeout, so one slow beat elects nobody) and min <
    /// max (openraft draws its timeout between them).
    pub(super) fn cluster(&self, raw: &mut RawCluster) -> Result<ClusterSettings, ConfigError> {
        let d = zonegate_cluster::Timing::default();
        let heartbeat = self.duration(
            "cluster.heartbeat",
            raw.heartbeat.as_deref(),
            d.heartbeat,
            bounds::HEARTBEAT,
        )?;
        let min = self.duration(
            "cluster.election_timeout_min",
            raw.election_timeout_min.as_deref(),
            d.election_timeout_min,
            bounds::ELECTION_TIMEOUT,
        )?;
        let max = self.duration(
            "cluster.election_timeout_max",
            raw.election_timeout_max.as_deref(),
            d.election_timeout_max,
            bounds::ELECTION_TIMEOUT,
        )?;
        if min < heartbeat * 3 {
            return Err(self.err(
                "cluster.election_timeout_min",
                format!(
                    "must be at least 3 x cluster.heartbeat ({:?}), got {min:?}",
                    heartbeat * 3
                ),
            ));
        }
        if max <= min {
            return Err(self.err(
                "cluster.election_timeout_max",
                format!("must be greater than cluster.election_timeout_min ({min:?}), got {max:?}"),
            ));
        }
        Ok(ClusterSettings {
            timing: zonegate_cluster::Timing {
                heartbeat,
                election_timeout_min: min,
                election_timeout_max: max,
                ..d
            },
            ready_requires_leader: raw.ready_requires_leader,
            tls: self.tls("cluster", raw.tls.take(), true)?,
            limits: self.limits("cluster", raw.limits.take())?,
            allow_plaintext: raw.allow_plaintext,
        })
    }

    /// Validates `[[cluster.members]]`: unique ids, this node among them
    /// in its own zone, at least one voter. Fills `node.raft_listen` from
    /// this node's entry when it is not set.
    pub(super) fn members(
        &self,
        raw: RawCluster,
        node: &mut NodeConfig,
    ) -> Result<Vec<Member>, ConfigError> {
        if raw.members.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = HashSet::new();
        let mut members = Vec::new();
        for (i, m) in raw.members.into_iter().enumerate() {
            let key = format!("cluster.members[{i}]");
            if !ids.insert(m.id) {
                return Err(self.err(format!("{key}.id"), format!("duplicate member id {}", m.id)));
            }
            if m.zone.trim().is_empty() {
                return Err(self.err(format!("{key}.zone"), "must not be empty"));
            }
            for (field, addr) in [("raft", &m.raft), ("admin", &m.admin)] {
                let port_ok = addr.rsplit_once(':').is_some_and(|(host, port)| {
                    !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
                if !port_ok {
                    return Err(self.err(
                        format!("{key}.{field}"),
                        format!("`{addr}` is not a host:port address"),
                    ));
                }
            }
            members.push(Member {
                id: m.id,
                zone: ZoneId::new(m.zone.trim()),
                raft_addr: m.raft,
                admin_addr: m.admin,
                role: m.role,
            });
        }
        let Some(me) = members.iter().find(|m| m.id == node.id) else {
            return Err(self.err(
                "cluster.members",
                format!("node.id {} is not one of the members", node.id),
            ));
        };
        if me.zone != node.zone {
            return Err(self.err(
                "cluster.members",
                format!(
                    "member {} is in zone `{}` but node.zone is `{}`",
                    me.id, me.zone, node.zone
                ),
            ));
        }
        if !members.iter().any(|m| m.role.votes()) {
            return Err(self.err(
                "cluster.members",
                "at least one member must be a voter or witness",
            ));
        }
        if node.raft_listen.is_none() {
            node.raft_listen = Some(me.raft_addr.parse().map_err(|_| {
                self.err(
                    "node.raft_listen",
                    format!("not set, and this member's raft address `{}` is not an IP:port to listen on", me.raft_addr),
                )
            })?);
        }
        Ok(members)
    }

    pub(super) fn failover(
        &self,
        raw: RawFailover,
        fallback_order: &HashMap<ZoneId, Vec<ZoneId>>,
    ) -> Result<FailoverConfig, ConfigError> {
        let d = FailoverConfig::default();
        let cfg = FailoverConfig {
            enabled: raw.enabled.unwrap_or(d.enabled),
            period: self.duration(
                "failover.period",
                raw.period.as_deref(),
                d.period,
                bounds::FAILOVER_PERIOD,
            )?,
            weights: match raw.weights {
                None => d.weights,
                Some(w) => {
                    let weight = |k: &str, v: f64| {
                        self.real(
                            &format!("failover.weights.{k}"),
                            Some(v),
                            v,
                            bounds::REL_WEIGHT,
                        )
                    };
                    ScoreWeights {
                        gw_error: weight("gw_error", w.gw_error)?,
                        timeout: weight("timeout", w.timeout)?,
                        gpu: weight("gpu", w.gpu)?,
                    }
                }
            },
            cutoff: self.real("failover.cutoff", raw.cutoff, d.cutoff, bounds::RATIO)?,
            min_periods: self.positive(
                "failover.min_periods",
                raw.min_periods,
                d.min_periods,
                bounds::STREAK,
            )?,
            auto_failback: raw.auto_failback.unwrap_or(d.auto_failback),
            failback_threshold: self.real(
                "failover.failback_threshold",
                raw.failback_threshold,
                d.failback_threshold,
                bounds::RATIO,
            )?,
            failback_periods: self.positive(
                "failover.failback_periods",
                raw.failback_periods,
                d.failback_periods,
                bounds::STREAK,
            )?,
            history_periods: self.positive(
                "failover.history_periods",
                raw.history_periods,
                d.history_periods,
                bounds::HISTORY_PERIODS,
            )?,
            max_auto_failed_over: self.int(
                "failover.max_auto_failed_over",
                raw.max_auto_failed_over,
                d.max_auto_failed_over,
                bounds::FAILED_OVER_ZONES,
            )?,
            dwell: self.duration(
                "failover.dwell",
                raw.dwell.as_deref(),
                d.dwell,
                bounds::FAILOVER_DWELL,
            )?,
            fallback_order: fallback_order
                .iter()
                .map(|(z, o)| (z.clone(), o.clone()))
                .collect(),
        };
        cfg.validate()
            .map_err(|e| self.err(format!("failover.{}", e.key), e.reason))?;
        Ok(cfg)
    }
}
