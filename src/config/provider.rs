//! `[[backends]]` keys of commercial providers: `provider`, `api_key`,
//! `headers`, `api_version`, `default_max_tokens`, validated into a
//! [`ProviderConfig`]; the key is read here, so a missing variable or an
//! unreadable file is a config error naming the file, the key and why.

use std::sync::Arc;
use std::time::Duration;

use super::bounds;
use super::credential::{Credential, Source};
use super::raw::RawBackend;
use super::{ConfigError, Provider, ProviderConfig, Validator};

/// A provider's probe interval unless `[backends.health] interval` says
/// otherwise: its model list is free, but it is not ours to hammer.
pub(super) const PROVIDER_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// The `api-version` Azure OpenAI requests carry unless `api_version` says.
pub const AZURE_API_VERSION: &str = "2024-10-21";
/// The `anthropic-version` Anthropic requests carry unless `api_version` says.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Anthropic's `max_tokens` when neither the client nor
/// `default_max_tokens` sets it.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Headers zonegate writes itself (framing, the host, the credential in
/// each provider's form): `headers` may not set them.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "accept-encoding",
    "authorization",
    "api-key",
    "x-api-key",
    "anthropic-version",
    "x-request-id",
];

/// A provider's free probe: its model list.
pub(super) fn default_probe_path(p: &ProviderConfig) -> String {
    match p.kind {
        Provider::Azure => format!("/openai/models?api-version={}", p.api_version),
        Provider::Openai | Provider::Anthropic => "/v1/models".to_owned(),
    }
}

impl Validator<'_> {
    /// The provider settings of backend `key`; `None` for a plain
    /// OpenAI-format backend without a key or headers.
    pub(super) fn provider(
        &self,
        key: &str,
        b: &RawBackend,
    ) -> Result<Option<Arc<ProviderConfig>>, ConfigError> {
        let credential = match &b.api_key {
            None => None,
            Some(secret) => {
                let (sub, source) =
                    match (&secret.env, &secret.file) {
                        (Some(name), None) if !name.trim().is_empty() => {
                            ("env", Source::Env(name.trim().to_owned()))
                        }
                        (None, Some(path)) if !path.as_os_str().is_empty() => {
                            ("file", Source::File(path.clone()))
                        }
                        _ => return Err(self.err(
                            format!("{key}.api_key"),
                            "must be { env = \"VARIABLE\" } or { file = \"/path\" } (one of them, \
                             not empty)",
                        )),
                    };
                let c = Credential::load(source)
                    .map_err(|reason| self.err(format!("{key}.api_key.{sub}"), reason))?;
                Some(Arc::new(c))
            }
        };
        let mut headers = Vec::with_capacity(b.headers.len());
        for (name, value) in &b.headers {
            let hkey = format!("{key}.headers.{name}");
            let n = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| self.err(&hkey, "is not a header name"))?;
            if RESERVED.contains(&n.as_str()) || n.as_str().starts_with("x-zonegate-") {
                return Err(self.err(
                    &hkey,
                    "is written by zonegate itself (framing, host or the credential: use `api_key`)",
                ));
            }
            let mut v = http::HeaderValue::from_str(value)
                .map_err(|_| self.err(&hkey, "is not a header value (one line of text)"))?;
            v.set_sensitive(true);
            headers.push((n, v));
        }
        let version_default = match b.provider {
            Provider::Azure => AZURE_API_VERSION,
            Provider::Anthropic => ANTHROPIC_VERSION,
            Provider::Openai => "",
        };
        let api_version = match &b.api_version {
            Some(_) if b.provider == Provider::Openai => {
                return Err(self.err(
                    format!("{key}.api_version"),
                    "is only for provider = \"azure\" or \"anthropic\"",
                ))
            }
            Some(v)
                if v.is_empty()
                    || !v
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_')) =>
            {
                return Err(self.err(
                    format!("{key}.api_version"),
                    format!("`{v}` is not a version like \"{version_default}\""),
                ))
            }
            Some(v) => v.clone(),
            None => version_default.to_owned(),
        };
        if b.default_max_tokens.is_some() && b.provider != Provider::Anthropic {
            return Err(self.err(
                format!("{key}.default_max_tokens"),
                "is only for provider = \"anthropic\" (which requires max_tokens)",
            ));
        }
        let default_max_tokens = self.int(
            &format!("{key}.default_max_tokens"),
            b.default_max_tokens,
            DEFAULT_MAX_TOKENS,
            bounds::MAX_TOKENS,
        )?;
        if b.provider == Provider::Openai && credential.is_none() && headers.is_empty() {
            return Ok(None);
        }
        Ok(Some(Arc::new(ProviderConfig {
            kind: b.provider,
            key: credential,
            headers,
            api_version,
            default_max_tokens,
        })))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::error_of;
    use crate::config::Config;

    const HEAD: &str = r#"
        [node]
        id = 1
        zone = "az-a"
        listen = "127.0.0.1:0"
        admin_listen = "127.0.0.1:0"
        data_dir = "data/node-1"
    "#;

    fn backend(extra: &str) -> String {
        format!(
            "{HEAD}\n[[backends]]\nname = \"p\"\nzone = \"az-a\"\nurl = \"https://api.example.com\"\n\
             models = [\"m\"]\n{extra}\n"
        )
    }

    #[test]
    fn a_missing_key_variable_or_unreadable_key_file_names_the_file_the_key_and_why() {
        let e = error_of(&backend(
            "api_key = { env = \"ZONEGATE_TEST_UNSET_PROVIDER_KEY\" }",
        ));
        assert_eq!(e.file, "test.toml");
        assert_eq!(e.key, "backends[0].api_key.env");
        assert!(e.reason.contains("is not set"), "{e}");
        let e = error_of(&backend("api_key = { file = \"/nonexistent/key\" }"));
        assert_eq!(e.key, "backends[0].api_key.file");
        assert!(e.reason.contains("cannot read `/nonexistent/key`"), "{e}");
        let e = error_of(&backend("api_key = { }"));
        assert_eq!(e.key, "backends[0].api_key");
        let e = error_of(&backend("headers = { Authorization = \"Bearer x\" }"));
        assert_eq!(e.key, "backends[0].headers.Authorization");
        let e = error_of(&backend("api_version = \"2024-01-01\""));
        assert_eq!(e.key, "backends[0].api_version");
        let e = error_of(&backend("provider = \"azure\"\napi_version = \"a&b\""));
        assert_eq!(e.key, "backends[0].api_version");
        let e = error_of(&backend("provider = \"azure\"\ndefault_max_tokens = 5"));
        assert_eq!(e.key, "backends[0].default_max_tokens");
    }

    #[test]
    fn a_providers_key_is_read_but_only_its_reference_is_ever_shown() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("key");
        std::fs::write(&path, "sk-ant-secret-value\n").expect("write");
        let text = backend(&format!(
            "provider = \"anthropic\"\napi_key = {{ file = \"{}\" }}\n\
             headers = {{ \"anthropic-beta\" = \"tools-2024\" }}",
            path.display()
        ));
        let cfg = Config::parse("test.toml", &text).expect("valid");
        let b = &cfg.backends[0];
        let p = b.provider.as_ref().expect("a provider");
        assert_eq!(p.api_version, super::ANTHROPIC_VERSION);
        assert_eq!(b.health_path, "/v1/models");
        assert_eq!(b.probe_interval, Some(super::PROVIDER_PROBE_INTERVAL));
        let key = p.key.as_ref().expect("key");
        assert_eq!(*key.value(|| 0), "sk-ant-secret-value");
        for shown in [format!("{cfg:?}"), cfg.replicated_toml().to_owned()] {
            assert!(!shown.contains("sk-ant-secret-value"), "{shown}");
        }
        // A plain backend stays plain: no provider, the usual probe.
        let plain = Config::parse("test.toml", &backend("")).expect("valid");
        assert!(plain.backends[0].provider.is_none());
        assert_eq!(plain.backends[0].health_path, "/health");
        assert_eq!(plain.backends[0].probe_interval, None);
    }
}
