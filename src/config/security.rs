//! The security sections of the config: TLS per listener (`[node.tls]`,
//! `[admin.tls]`, `[cluster.tls]`), listener limits (`[node.limits]`,
//! `[admin.limits]`, `[cluster.limits]`), backend TLS, and admin source
//! networks. Certificate files are loaded at validation, so
//! `check-config` finds a bad one.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use zonegate_net::listen::Limits;
use zonegate_net::tls::{BackendTls, ServerTls, TlsFiles};

use super::{bounds, ConfigError, Validator};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    header_read_timeout: Option<String>,
    idle_timeout: Option<String>,
    body_read_timeout: Option<String>,
    send_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackendTls {
    ca: Option<PathBuf>,
    server_name: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

/// A listener's limits as configured; the connection budget's default
/// depends on the open-files limit, known only at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSettings {
    pub max_connections: Option<usize>,
    /// `None`: no cap per source address.
    pub max_connections_per_ip: Option<usize>,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub body_read_timeout: Duration,
    pub send_timeout: Duration,
}

impl Default for LimitSettings {
    fn default() -> Self {
        let d = Limits::with_max(0);
        Self {
            max_connections: None,
            max_connections_per_ip: d.max_connections_per_ip,
            header_read_timeout: d.header_read_timeout,
            idle_timeout: d.idle_timeout,
            body_read_timeout: d.body_read_timeout,
            send_timeout: d.send_timeout,
        }
    }
}

impl LimitSettings {
    /// The limits, with `default_max` where no budget is configured.
    pub fn resolve(&self, default_max: usize) -> Limits {
        Limits {
            max_connections: self.max_connections.unwrap_or(default_max),
            max_connections_per_ip: self.max_connections_per_ip,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            body_read_timeout: self.body_read_timeout,
            send_timeout: self.send_timeout,
        }
    }
}

/// An IP network (`10.0.0.0/8`, `::1/128`, or one address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
            None => {
                let a = s.parse::<IpAddr>().ok()?;
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    /// Whether `ip` lies in this network (an IPv4-mapped IPv6 address
    /// counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |a: IpAddr| -> u128 {
            match a {
                IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix))
        };
        bits(ip) & mask == bits(self.addr) & mask
    }
}

impl Validator<'_> {
    /// A path as written, relative ones taken from the config file's
    /// directory.
    fn config_path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            return p.to_owned();
        }
        Path::new(self.file)
            .parent()
            .map_or_else(|| p.to_owned(), |dir| dir.join(p))
    }

    /// `[section.tls]`: files resolved and loaded once, so a bad one
    /// fails here.
    pub(super) fn tls(
        &self,
        section: &str,
        raw: Option<RawTls>,
        require_client_ca: bool,
    ) -> Result<Option<TlsFiles>, ConfigError> {
        let Some(raw) = raw else { return Ok(None) };
        let files = TlsFiles {
            cert: self.config_path(&raw.cert),
            key: self.config_path(&raw.key),
            client_ca: raw.client_ca.as_deref().map(|p| self.config_path(p)),
        };
        if require_client_ca && files.client_ca.is_none() {
            return Err(self.err(
                format!("{section}.tls.client_ca"),
                "mutual TLS between members needs the cluster CA",
            ));
        }
        ServerTls::load(files.clone(), &[])
            .map_err(|e| self.err(format!("{section}.tls"), e.to_string()))?;
        Ok(Some(files))
    }

    pub(super) fn limits(
        &self,
        section: &str,
        raw: Option<RawLimits>,
    ) -> Result<LimitSettings, ConfigError> {
        let raw = raw.unwrap_or_default();
        let d = LimitSettings::default();
        let key = |k: &str| format!("{section}.limits.{k}");
        let max_connections = match raw.max_connections {
            Some(n) => Some(self.int(&key("max_connections"), Some(n), n, bounds::CONNECTIONS)?),
            None => None,
        };
        let per_ip_key = key("max_connections_per_ip");
        let max_connections_per_ip = match raw.max_connections_per_ip {
            Some(n) => Some(self.int(&per_ip_key, Some(n), n, bounds::CONNECTIONS)?),
            None => None,
        };
        if let (Some(per_ip), Some(most)) = (max_connections_per_ip, max_connections) {
            if per_ip > most {
                return Err(self.err(
                    per_ip_key,
                    format!("must be at most max_connections ({most})"),
                ));
            }
        }
        Ok(LimitSettings {
            max_connections,
            max_connections_per_ip,
            header_read_timeout: self.duration(
                &key("header_read_timeout"),
                raw.header_read_timeout.as_deref(),
                d.header_read_timeout,
                bounds::LISTENER_TIMEOUT,
            )?,
            idle_timeout: self.duration(
                &key("idle_timeout"),
                raw.idle_timeout.as_deref(),
                d.idle_timeout,
                bounds::LISTENER_TIMEOUT,
            )?,
            body_read_timeout: self.duration(
                &key("body_read_timeout"),
                raw.body_read_timeout.as_deref(),
                d.body_read_timeout,
                bounds::LISTENER_TIMEOUT,
            )?,
            send_timeout: self.duration(
                &key("send_timeout"),
                raw.send_timeout.as_deref(),
                d.send_timeout,
                bounds::LISTENER_TIMEOUT,
            )?,
        })
    }

    pub(super) fn backend_tls(
        &self,
        key: &str,
        raw: Option<RawBackendTls>,
    ) -> Result<BackendTls, ConfigError> {
        let Some(raw) = raw else {
            return Ok(BackendTls::default());
        };
        if raw.insecure_skip_verify && (raw.ca.is_some() || raw.server_name.is_some()) {
            return Err(self.err(
                format!("{key}.tls"),
                "insecure_skip_verify verifies nothing: drop ca and server_name, or drop it",
            ));
        }
        let tls = BackendTls {
            ca: raw.ca.as_deref().map(|p| self.config_path(p)),
            server_name: raw.server_name,
            insecure_skip_verify: raw.insecure_skip_verify,
        };
        if let Some(name) = &tls.server_name {
            rustls::pki_types::ServerName::try_from(name.as_str()).map_err(|_| {
                self.err(
                    format!("{key}.tls.server_name"),
                    format!("`{name}` is not a DNS name or IP address"),
                )
            })?;
        }
        if let Some(ca) = &tls.ca {
            // One message whatever went wrong (missing, unreadable, not a
            // regular file, too large, not PEM): the path comes from
            // replicated config, and the leader's answer must not tell
            // which files exist on it.
            tls.client_config().map_err(|_| {
                self.err(
                    format!("{key}.tls.ca"),
                    format!(
                        "cannot load a CA bundle from `{}`: it must be a readable regular file of at most {} KiB holding PEM certificates",
                        ca.display(),
                        zonegate_net::tls::MAX_PEM_BYTES / 1024
                    ),
                )
            })?;
        }
        Ok(tls)
    }

    pub(super) fn networks(&self, key: &str, raw: &[String]) -> Result<Vec<Network>, ConfigError> {
        raw.iter()
            .map(|s| {
                Network::parse(s.trim()).ok_or_else(|| {
                    self.err(
                        key,
                        format!("`{s}` is not an IP network like \"10.0.0.0/8\""),
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{error_of, MINIMAL};

    fn with_ca(path: &str) -> String {
        MINIMAL.replace("http://127", "https://127").replace(
            "models = [\"qwen25-7b-instruct\"]",
            &format!("models = [\"qwen25-7b-instruct\"]\ntls = {{ ca = \"{path}\" }}"),
        )
    }

    /// `/dev/zero` made the leader allocate until it aborted, `/dev/urandom`
    /// spin; and the answer told a missing file from an unreadable one.
    #[test]
    fn a_backend_ca_path_reads_only_a_bounded_regular_file_and_says_one_thing() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'a'; 2 * 1024 * 1024]).unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let missing = dir.path().join("missing.pem");
        let paths = [
            "/dev/zero".to_owned(),
            "/dev/urandom".to_owned(),
            dir.path().display().to_string(),
            big.display().to_string(),
            garbage.display().to_string(),
            missing.display().to_string(),
        ];
        let mut reasons = Vec::new();
        for p in &paths {
            let started = std::time::Instant::now();
            let e = error_of(&with_ca(p));
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "{p} took {:?}",
                started.elapsed()
            );
            assert_eq!(e.key, "backends[0].tls.ca", "{e}");
            reasons.push(e.reason.replace(p.as_str(), "PATH"));
        }
        assert!(
            reasons.iter().all(|r| *r == reasons[0]),
            "one message for every failure: {reasons:#?}"
        );
        assert!(
            reasons[0].contains("regular file of at most 1024 KiB"),
            "{}",
            reasons[0]
        );
    }

    #[test]
    fn networks_contain_what_they_should() {
        let cases = [
            ("10.0.0.0/8", "10.1.2.3", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("127.0.0.1", "127.0.0.1", true),
            ("127.0.0.1", "127.0.0.2", false),
            ("0.0.0.0/0", "192.168.1.1", true),
            ("10.0.0.0/8", "::ffff:10.0.0.1", true),
            ("::1/128", "::1", true),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "10.0.0.1", false),
        ];
        for (net, ip, want) in cases {
            let n = Network::parse(net).unwrap();
            assert_eq!(n.contains(ip.parse().unwrap()), want, "{net} ∋ {ip}");
        }
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x", "::/129"] {
            assert!(Network::parse(bad).is_none(), "{bad}");
        }
    }
}
