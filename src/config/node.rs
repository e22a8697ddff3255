//! Validation of `[node]`, `[admin]` and `[telemetry]`: this node's own
//! ports, threads, admin API and where its traces go.

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

    pub(super) fn telemetry(&self, raw: RawTelemetry) -> Result<TelemetryConfig, ConfigError> {
        let otlp_endpoint = match raw.otlp_endpoint.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(url) => Some(self.otlp_endpoint(url)?),
        };
        let sampling = self.real("telemetry.sampling", raw.sampling, 0.0, bounds::RATIO)?;
        let queue_size = self.int(
            "telemetry.queue_size",
            raw.queue_size,
            2048,
            bounds::SPAN_QUEUE,
        )?;
        Ok(TelemetryConfig {
            otlp_endpoint,
            sampling,
            queue_size: usize::try_from(queue_size)
                .map_err(|_| self.err("telemetry.queue_size", "too large for this machine"))?,
        })
    }

    /// `telemetry.otlp_endpoint`: an `http://` or `https://` URL with a
    /// host and at most a path (spans go to `{url}/v1/traces`).
    fn otlp_endpoint(&self, url: &str) -> Result<String, ConfigError> {
        const KEY: &str = "telemetry.otlp_endpoint";
        let uri: http::Uri = url.parse().map_err(|e| {
            self.err(
                KEY,
                format!("`{url}` is not a URL like \"http://collector:4318\": {e}"),
            )
        })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(self.err(KEY, format!("`{url}` must start with http:// or https://")));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(self.err(KEY, format!("`{url}` names no host")));
        }
        if uri.query().is_some() || url.contains('#') {
            return Err(self.err(
                KEY,
                format!("`{url}`: no query or fragment (spans go to its path + /v1/traces)"),
            ));
        }
        Ok(url.trim_end_matches('/').to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error_of, MINIMAL};
    use super::super::Config;

    fn telemetry(section: &str) -> String {
        format!("{MINIMAL}\n[telemetry]\n{section}\n")
    }

    #[test]
    fn telemetry_takes_an_http_collector_url_and_a_ratio_and_refuses_anything_else() {
        let cfg = Config::parse("t.toml", MINIMAL).unwrap();
        assert_eq!(cfg.telemetry.otlp_endpoint, None, "no traces by default");
        assert_eq!(cfg.telemetry.sampling, 0.0);
        let cfg = Config::parse(
            "t.toml",
            &telemetry("otlp_endpoint = \"http://collector:4318/\"\nsampling = 0.1"),
        )
        .unwrap();
        assert_eq!(
            cfg.telemetry.otlp_endpoint.as_deref(),
            Some("http://collector:4318"),
            "spans go to {{endpoint}}/v1/traces: no double slash"
        );
        assert_eq!(cfg.telemetry.sampling, 0.1);
        for (bad, key) in [
            (
                "otlp_endpoint = \"collector:4318\"",
                "telemetry.otlp_endpoint",
            ),
            (
                "otlp_endpoint = \"ftp://collector\"",
                "telemetry.otlp_endpoint",
            ),
            ("otlp_endpoint = \"http://\"", "telemetry.otlp_endpoint"),
            (
                "otlp_endpoint = \"http://c:4318/?x=1\"",
                "telemetry.otlp_endpoint",
            ),
            ("otlp_endpoint = \"not a url\"", "telemetry.otlp_endpoint"),
            ("sampling = 1.5", "telemetry.sampling"),
            ("sampling = -0.1", "telemetry.sampling"),
            ("sampling = nan", "telemetry.sampling"),
            ("queue_size = 0", "telemetry.queue_size"),
        ] {
            let e = error_of(&telemetry(bad));
            assert_eq!(e.key, key, "{bad}: {e}");
        }
    }
}
