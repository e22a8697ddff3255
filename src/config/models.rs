//! Validation of `[[tenants]]`, `[[backends]]` and `[[models]]`: tenants,
//! backends and their timeouts, models with their retry policy, and the
//! fallback and continuation graphs (no cycles).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use http::uri::Scheme;
use zonegate_cluster::{Limits, ZoneId};

use super::bounds;
use super::provider::{default_probe_path, PROVIDER_PROBE_INTERVAL};
use super::raw::*;
use super::Validator;
use super::*;

impl Validator<'_> {
    pub(super) fn tenants(&self, raw: Vec<RawTenant>) -> Result<Vec<Tenant>, ConfigError> {
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        raw.into_iter()
            .enumerate()
            .map(|(i, t)| {
                let key = format!("tenants[{i}]");
                if t.name.is_empty() {
                    return Err(self.err(format!("{key}.name"), "must not be empty"));
                }
                if !names.insert(t.name.clone()) {
                    return Err(self.err(
                        format!("{key}.name"),
                        format!("duplicate tenant `{}`", t.name),
                    ));
                }
                let keys = match t.key_sha256 {
                    OneOrMany::One(s) => vec![s],
                    OneOrMany::Many(v) => v,
                };
                if keys.is_empty() {
                    return Err(
                        self.err(format!("{key}.key_sha256"), "needs at least one key digest")
                    );
                }
                let key_hashes = keys
                    .iter()
                    .map(|k| {
                        let h = self.sha256(&format!("{key}.key_sha256"), k)?;
                        if !hashes.insert(h) {
                            return Err(self.err(
                                format!("{key}.key_sha256"),
                                "this key digest is already used by another tenant",
                            ));
                        }
                        Ok(h)
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Tenant {
                    name: t.name.into(),
                    key_hashes,
                    priority: t.priority,
                })
            })
            .collect()
    }

    /// A witness serves no traffic, so it alone may have no backends.
    pub(super) fn backends(
        &self,
        raw: Vec<RawBackend>,
        witness: bool,
    ) -> Result<Vec<BackendConfig>, ConfigError> {
        if raw.is_empty() && !witness {
            return Err(self.err("backends", "at least one [[backends]] entry is required"));
        }
        let mut names = HashSet::new();
        raw.into_iter()
            .enumerate()
            .map(|(i, b)| {
                let key = format!("backends[{i}]");
                if b.name.is_empty() || !names.insert(b.name.clone()) {
                    return Err(self.err(
                        format!("{key}.name"),
                        format!("backend names must be unique and non-empty (`{}`)", b.name),
                    ));
                }
                if b.zone.trim().is_empty() {
                    return Err(self.err(format!("{key}.zone"), "must not be empty"));
                }
                let uri: http::Uri = b.url.parse().map_err(|e| {
                    self.err(
                        format!("{key}.url"),
                        format!("`{}` is not a URL: {e}", b.url),
                    )
                })?;
                let scheme = uri.scheme().cloned();
                let scheme = match scheme {
                    Some(s) if s == Scheme::HTTP || s == Scheme::HTTPS => s,
                    _ => {
                        return Err(
                            self.err(format!("{key}.url"), "must be an http:// or https:// URL")
                        )
                    }
                };
                if scheme == Scheme::HTTP && b.tls.is_some() {
                    return Err(self.err(format!("{key}.tls"), "is only for https:// backends"));
                }
                let provider = self.provider(&key, &b)?;
                let tls = self.backend_tls(&key, b.tls)?;
                let authority = uri
                    .authority()
                    .cloned()
                    .ok_or_else(|| self.err(format!("{key}.url"), "needs a host and port"))?;
                if !matches!(uri.path(), "" | "/") {
                    return Err(self.err(
                        format!("{key}.url"),
                        "must be the server root (http://host:port); paths are not supported",
                    ));
                }
                if b.models.is_empty() {
                    return Err(self.err(format!("{key}.models"), "must list at least one model"));
                }
                let weight =
                    self.int(&format!("{key}.weight"), Some(b.weight), 1, bounds::WEIGHT)?;
                if let Some(c) = b.capacity {
                    self.int(&format!("{key}.capacity"), Some(c), c, bounds::CAPACITY)?;
                }
                let health_path = match (&b.health_path, &provider) {
                    (Some(p), _) => p.clone(),
                    (None, Some(p)) => default_probe_path(p),
                    (None, None) => default_health_path(),
                };
                let probe_interval = match b.health.as_ref().and_then(|h| h.interval.as_deref()) {
                    Some(s) => Some(self.duration(
                        &format!("{key}.health.interval"),
                        Some(s),
                        PROVIDER_PROBE_INTERVAL,
                        bounds::PROBE_INTERVAL,
                    )?),
                    None => provider.as_ref().map(|_| PROVIDER_PROBE_INTERVAL),
                };
                for (path_key, path) in [
                    ("health_path", Some(&health_path)),
                    ("metrics_path", b.metrics_path.as_ref()),
                ] {
                    if let Some(p) = path {
                        if !p.starts_with('/') {
                            return Err(
                                self.err(format!("{key}.{path_key}"), "must start with `/`")
                            );
                        }
                    }
                }
                for m in b.model_names.keys() {
                    if !b.models.contains(m) {
                        return Err(self.err(
                            format!("{key}.model_names.{m}"),
                            "names a model this backend does not list in `models`",
                        ));
                    }
                }
                Ok(BackendConfig {
                    name: b.name,
                    zone: ZoneId::new(b.zone.trim()),
                    scheme,
                    tls,
                    authority,
                    models: b.models,
                    weight,
                    health_path,
                    metrics_path: b.metrics_path,
                    model_names: b.model_names.into_iter().collect(),
                    capacity: b.capacity,
                    provider,
                    probe_interval,
                })
            })
            .collect()
    }

    /// A model's timeouts; `first_byte_timeout` is read as the deprecated
    /// alias of `ttft_timeout` (with a warning).
    pub(super) fn timeouts(
        &self,
        key: &str,
        m: &RawModel,
        default_connect: Duration,
    ) -> Result<Timeouts, ConfigError> {
        let d = Timeouts::default();
        let ttft = match (&m.ttft_timeout, &m.first_byte_timeout) {
            (Some(_), Some(_)) => {
                return Err(self.err(
                    format!("{key}.first_byte_timeout"),
                    "set only ttft_timeout (first_byte_timeout is its deprecated alias)",
                ))
            }
            (None, Some(old)) => {
                tracing::warn!(
                    file = %self.file,
                    "{key}.first_byte_timeout is deprecated: it is now ttft_timeout, and applies to streams only"
                );
                self.duration(
                    &format!("{key}.first_byte_timeout"),
                    Some(old),
                    d.ttft,
                    bounds::REQUEST_TIMEOUT,
                )?
            }
            (new, None) => self.duration(
                &format!("{key}.ttft_timeout"),
                new.as_deref(),
                d.ttft,
                bounds::REQUEST_TIMEOUT,
            )?,
        };
        let field = |name: &str, v: &Option<String>, default| {
            self.duration(
                &format!("{key}.{name}"),
                v.as_deref(),
                default,
                bounds::REQUEST_TIMEOUT,
            )
        };
        let t = Timeouts {
            connect: self.duration(
                &format!("{key}.connect_timeout"),
                m.connect_timeout.as_deref(),
                default_connect,
                bounds::CONNECT_TIMEOUT,
            )?,
            ttft,
            generation: field("generation_timeout", &m.generation_timeout, d.generation)?,
            idle: field("idle_timeout", &m.idle_timeout, d.idle)?,
            total: field("total_timeout", &m.total_timeout, d.total)?,
        };
        if t.total < t.ttft {
            return Err(self.err(
                format!("{key}.total_timeout"),
                "must be at least ttft_timeout: the deadline bounds every attempt",
            ));
        }
        Ok(t)
    }

    pub(super) fn models(
        &self,
        raw: Vec<RawModel>,
        backends: &[BackendConfig],
        default_connect: Duration,
    ) -> Result<Vec<ModelConfig>, ConfigError> {
        let served: Vec<&str> = {
            let mut seen = HashSet::new();
            backends
                .iter()
                .flat_map(|b| b.models.iter().map(String::as_str))
                .filter(|m| seen.insert(*m))
                .collect()
        };
        let mut out: Vec<ModelConfig> = Vec::new();
        for (i, m) in raw.into_iter().enumerate() {
            let key = format!("models[{i}]");
            if !served.contains(&m.name.as_str()) {
                return Err(self.err(
                    format!("{key}.name"),
                    format!("no backend serves model `{}`", m.name),
                ));
            }
            if out.iter().any(|o| o.name == m.name) {
                return Err(self.err(
                    format!("{key}.name"),
                    format!("duplicate model `{}`", m.name),
                ));
            }
            for (j, f) in m.fallback.iter().enumerate() {
                if !served.contains(&f.as_str()) || *f == m.name {
                    return Err(self.err(
                        format!("{key}.fallback[{j}]"),
                        format!("`{f}` is not another model served by some backend"),
                    ));
                }
            }
            for (j, f) in m.context_fallback.iter().enumerate() {
                if !served.contains(&f.as_str()) || *f == m.name {
                    return Err(self.err(
                        format!("{key}.context_fallback[{j}]"),
                        format!("`{f}` is not another model served by some backend"),
                    ));
                }
            }
            let timeouts = self.timeouts(&key, &m, default_connect)?;
            if let Some(t) = m.tier {
                self.int(&format!("{key}.tier"), Some(t), t, bounds::TIER)?;
            }
            let limits = self.model_limits(&format!("{key}.limits"), m.limits)?;
            for (j, a) in m.aliases.iter().enumerate() {
                let taken = served.contains(&a.as_str())
                    || out.iter().any(|o| o.aliases.contains(a))
                    || m.aliases[..j].contains(a);
                if a.is_empty() || taken {
                    return Err(self.err(
                        format!("{key}.aliases[{j}]"),
                        format!("`{a}` is empty, a served model's name or another alias"),
                    ));
                }
            }
            out.push(ModelConfig {
                limits,
                aliases: m.aliases,
                name: m.name,
                balance: m.balance,
                fallback: m.fallback,
                context_fallback: m.context_fallback,
                timeouts,
                continuation: m.continuation,
                tier: m.tier,
            });
        }
        for (list, edges) in [
            (
                "fallback",
                (|m: &ModelConfig| &m.fallback) as fn(&ModelConfig) -> &Vec<String>,
            ),
            ("context_fallback", |m: &ModelConfig| &m.context_fallback),
        ] {
            if let Some((i, cycle)) = fallback_cycle(&out, edges) {
                return Err(self.err(
                    format!("models[{i}].{list}"),
                    format!("{list} cycle: {}", cycle.join(" → ")),
                ));
            }
        }
        for name in served {
            if !out.iter().any(|m| m.name == name) {
                out.push(ModelConfig {
                    name: name.to_owned(),
                    balance: Balance::default(),
                    fallback: Vec::new(),
                    context_fallback: Vec::new(),
                    timeouts: Timeouts {
                        connect: default_connect,
                        ..Timeouts::default()
                    },
                    continuation: Continuation::default(),
                    tier: None,
                    limits: Limits::default(),
                    aliases: Vec::new(),
                });
            }
        }
        Ok(out)
    }

    pub(super) fn retry(&self, raw: RawRetry) -> Result<RetryConfig, ConfigError> {
        let budget_ratio = raw.budget_ratio.unwrap_or(0.2);
        if !(0.0..=1.0).contains(&budget_ratio) {
            return Err(self.err("retry.budget_ratio", "must be between 0.0 and 1.0"));
        }
        Ok(RetryConfig {
            max_attempts: self.positive(
                "retry.max_attempts",
                raw.max_attempts,
                3,
                bounds::MAX_ATTEMPTS,
            )?,
            budget_ratio,
            min_concurrent_retries: self.int(
                "retry.min_concurrent_retries",
                raw.min_concurrent_retries,
                10,
                bounds::MIN_CONCURRENT_RETRIES,
            )?,
            default_cooldown: self.duration(
                "retry.default_cooldown",
                raw.default_cooldown.as_deref(),
                Duration::from_secs(1),
                bounds::RETRY_WAIT,
            )?,
            connect_timeout: self.duration(
                "retry.connect_timeout",
                raw.connect_timeout.as_deref(),
                Duration::from_secs(2),
                bounds::CONNECT_TIMEOUT,
            )?,
            max_retry_after_wait: self.duration(
                "retry.max_retry_after_wait",
                raw.max_retry_after_wait.as_deref(),
                Duration::from_secs(3),
                bounds::RETRY_WAIT,
            )?,
        })
    }
}

/// The first cycle of the graph `edges` draws over `models` (a model's
/// list of other models): the index of the model it starts from, and the
/// names along it, back to the first. Models only listed (not configured)
/// have no list, so they end every path.
pub(super) fn fallback_cycle(
    models: &[ModelConfig],
    edges: fn(&ModelConfig) -> &Vec<String>,
) -> Option<(usize, Vec<String>)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let index: HashMap<&str, usize> = models
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.as_str(), i))
        .collect();
    let mut marks = vec![Mark::New; models.len()];
    for start in 0..models.len() {
        if marks[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (model, next edge to follow).
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        marks[start] = Mark::OnPath;
        while let Some(&mut (m, ref mut next)) = path.last_mut() {
            let targets = edges(&models[m]);
            if *next == targets.len() {
                marks[m] = Mark::Done;
                path.pop();
                continue;
            }
            let target = targets[*next].as_str();
            *next += 1;
            let Some(&t) = index.get(target) else {
                continue;
            };
            match marks[t] {
                Mark::Done => {}
                Mark::New => {
                    marks[t] = Mark::OnPath;
                    path.push((t, 0));
                }
                Mark::OnPath => {
                    let from = path.iter().position(|(p, _)| *p == t).unwrap_or(0);
                    let mut names: Vec<String> = path[from..]
                        .iter()
                        .map(|(p, _)| models[*p].name.clone())
                        .collect();
                    names.push(models[t].name.clone());
                    return Some((t, names));
                }
            }
        }
    }
    None
}
