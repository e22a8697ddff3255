//! Validation of a whole config file: the walk over the sections
//! (`node`, `cluster`, `models`, `health`, `security`, `quota`) into a
//! typed [`Config`], with the checks that cross sections. The
//! [`Validator`] and its shared checks are `config.rs`'s.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use zonegate_cluster::{Role as MemberRole, TenantQuota, ZoneId};

use super::bounds;
use super::raw::*;
use super::*;

impl Validator<'_> {
    pub(super) fn validate(&self, mut raw: RawConfig) -> Result<Config, ConfigError> {
        let mut node = self.node(raw.node)?;
        let mut raw_cluster = raw.cluster;
        let cluster = self.cluster(&mut raw_cluster)?;
        let members = self.members(raw_cluster, &mut node)?;
        let zones: HashSet<&ZoneId> = members.iter().map(|m| &m.zone).collect();
        if zones.len() > 1 && cluster.tls.is_none() && !cluster.allow_plaintext {
            return Err(self.err(
                "cluster.tls",
                "a multi-zone cluster needs mutual TLS between members ([cluster.tls] with cert, key and client_ca); set [cluster] allow_plaintext = true only for local demos and tests",
            ));
        }
        let witness = members
            .iter()
            .any(|m| m.id == node.id && m.role == MemberRole::Witness);
        let mut raw_tenants = raw.tenants;
        let tenant_quotas: Vec<_> = raw_tenants
            .iter_mut()
            .map(|t| (t.quota.take(), t.zone_share.take()))
            .collect();
        let raw_policy = super::policy::RawPolicy::take(
            &mut raw_tenants,
            &mut raw.backends,
            std::mem::take(&mut raw.rules),
            std::mem::take(&mut raw.shadows),
        );
        for (key, n, b) in [
            ("tenants", raw_tenants.len(), bounds::TENANTS),
            ("backends", raw.backends.len(), bounds::BACKENDS),
            ("models", raw.models.len(), bounds::MODELS),
            ("prompt_tiers", raw.prompt_tiers.len(), bounds::PROMPT_TIERS),
        ] {
            if n as u64 > b.max {
                return Err(self.err(key, format!("{n} entries, at most {} ({})", b.max, b.why)));
            }
        }
        let costs = self.costs(&mut raw_tenants, &raw.backends, &raw.models)?;
        let tenants = self.tenants(raw_tenants)?;
        let backends = self.backends(raw.backends, witness)?;
        self.capacities(&backends)?;
        let serving: std::collections::BTreeSet<ZoneId> =
            backends.iter().map(|b| b.zone.clone()).collect();
        let mut tenant_bursts = Vec::with_capacity(tenants.len());
        let tenant_quotas = tenants
            .iter()
            .zip(tenant_quotas)
            .enumerate()
            .map(|(i, (t, (limits, share)))| {
                let (global, burst) = self.tenant_limits(&format!("tenants[{i}].quota"), limits)?;
                tenant_bursts.push(burst);
                Ok(TenantQuota {
                    tenant: t.name.to_string(),
                    priority: t.priority,
                    global,
                    shares: self.zone_share(
                        &format!("tenants[{i}].zone_share"),
                        share,
                        &serving,
                    )?,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let quotas = self.quotas(raw.quotas)?;
        let retry = self.retry(raw.retry)?;
        let models = self.models(raw.models, &backends, retry.connect_timeout)?;
        let health = self.health(raw.health, &models)?;
        let policy = self.policy(raw_policy, &tenants, &backends, &models)?;
        let affinity = AffinityConfig {
            zone_pin: raw.affinity.zone_pin.unwrap_or(true),
            pin_ttl: self.duration(
                "affinity.pin_ttl",
                raw.affinity.pin_ttl.as_deref(),
                Duration::from_secs(3600),
                bounds::PIN_TTL,
            )?,
            pin_capacity: self.int(
                "affinity.pin_capacity",
                raw.affinity.pin_capacity,
                1_000_000,
                bounds::PIN_CAPACITY,
            )?,
            cross_zone_fallback: raw.affinity.cross_zone_fallback.unwrap_or_default(),
            short_max_tokens: self.int(
                "affinity.short_max_tokens",
                raw.affinity.short_max_tokens,
                512,
                bounds::SHORT_TOKENS,
            )?,
            short_max_prompt_bytes: self.int(
                "affinity.short_max_prompt_bytes",
                raw.affinity.short_max_prompt_bytes,
                16 * 1024,
                bounds::PROMPT_BYTES,
            )?,
        };
        let balance = BalanceConfig {
            vnodes: self.positive("balance.vnodes", raw.balance.vnodes, 160, bounds::VNODES)?,
            load_factor: self.real(
                "balance.load_factor",
                raw.balance.load_factor,
                1.25,
                bounds::LOAD_FACTOR,
            )?,
        };
        let admin = self.admin(raw.admin)?;
        let telemetry = self.telemetry(raw.telemetry)?;
        let known: HashSet<&ZoneId> = backends
            .iter()
            .map(|b| &b.zone)
            .chain(members.iter().map(|m| &m.zone))
            .chain([&node.zone])
            .collect();
        let mut fallback_order = HashMap::new();
        for (zone, z) in raw.zones {
            for (i, target) in z.fallback_order.iter().enumerate() {
                if !known.contains(&ZoneId::new(target)) || *target == zone {
                    return Err(self.err(
                        format!("zones.{zone}.fallback_order[{i}]"),
                        format!("`{target}` is not another zone of this config"),
                    ));
                }
            }
            let order = z.fallback_order.iter().map(|o| ZoneId::new(o)).collect();
            fallback_order.insert(ZoneId::new(&zone), order);
        }
        let failover = self.failover(raw.failover, &fallback_order)?;
        let mut prompt_tiers: Vec<(u64, u32)> = raw
            .prompt_tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let key = format!("prompt_tiers[{i}]");
                Ok((
                    self.int(
                        &format!("{key}.min_bytes"),
                        Some(t.min_bytes),
                        0,
                        bounds::PROMPT_BYTES,
                    )?,
                    self.int(
                        &format!("{key}.min_tier"),
                        Some(t.min_tier),
                        0,
                        bounds::TIER,
                    )?,
                ))
            })
            .collect::<Result<_, ConfigError>>()?;
        prompt_tiers.sort_unstable();
        let tenant_keys = tenants
            .iter()
            .enumerate()
            .flat_map(|(i, t)| t.key_hashes.iter().map(move |h| (*h, i)))
            .collect();
        Ok(Config {
            file: String::new(),
            text: "".into(),
            config_version: 0,
            replicated: "".into(),
            local: Default::default(),
            quotas,
            tenant_quotas,
            tenant_bursts,
            costs,
            prompt_tiers,
            failover,
            node,
            tenants,
            tenant_keys,
            backends,
            models,
            retry,
            health,
            affinity,
            balance,
            admin,
            members,
            cluster,
            fallback_order,
            policy,
            telemetry,
        })
    }
}
