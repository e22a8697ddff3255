//! The provider seam of an attempt: what changes when the backend is a
//! commercial API (`[[backends]] provider`, `api_key`, `headers`) rather
//! than a plain OpenAI-format server. A plain backend has no
//! [`ProviderConfig`] and never reaches this module: its requests and
//! answers pass through as they always did.
//!
//! Per provider: the request's path (Azure's deployment path with its
//! `api-version`, Anthropic's `/v1/messages`), the credential in the form
//! the provider expects (`Authorization: Bearer`, `api-key`, `x-api-key`
//! with `anthropic-version`), the configured headers, the body
//! (translated for Anthropic), and the answer read as the provider means
//! it: 401/403 is the backend's configuration fault (`credentials`), 429
//! and Anthropic's 529 are "busy" with the provider's own reset hints, a
//! success whose `x-ratelimit-remaining-*` reached 0 cools the backend
//! before it starts answering 429, and Anthropic's answers, streams and
//! errors come back in OpenAI's format (`provider::anthropic`).

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use zonegate_net::http1::{name_is, put_header, HeadLines};

use crate::config::{Provider, ProviderConfig};
use crate::dataplane::forward::{parse_retry_after, MAX_RETRY_AFTER};
use crate::dataplane::request::ClientHeaders;

pub mod anthropic;

/// What one attempt on a provider backend sends, and how its answer is
/// read.
pub struct Call<'a> {
    pub cfg: &'a ProviderConfig,
    /// The origin-form target at the provider.
    pub path: Cow<'a, str>,
    pub body: CallBody,
    pub answer: Answer<'a>,
}

/// The body an attempt sends: the client's, shared, or a translation's,
/// owned (it is copied into the request's write buffer, so it never needs
/// to become `Bytes`, which would allocate again for a `Vec` with spare
/// room).
pub enum CallBody {
    Shared(Bytes),
    Translated(Vec<u8>),
}

impl std::ops::Deref for CallBody {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            CallBody::Shared(b) => b,
            CallBody::Translated(v) => v,
        }
    }
}

/// How a provider's answer becomes the client's.
pub enum Answer<'a> {
    /// Already OpenAI's format (OpenAI, Azure OpenAI, Together, Groq…).
    Openai,
    /// Anthropic's Messages API, translated back; the chunks and the
    /// answer name the model the client asked for.
    Anthropic {
        client_model: &'a str,
        stream: bool,
        include_usage: bool,
    },
}

/// The request's endpoint, as far as providers differ on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    Other,
}

impl Endpoint {
    /// The endpoint a request's path (and query) names: compared in
    /// place, not split at `?` (a char search per call).
    pub fn of(path: &str) -> Self {
        let is = |endpoint: &str| {
            path.strip_prefix(endpoint)
                .is_some_and(|query| query.is_empty() || query.starts_with('?'))
        };
        if is("/v1/chat/completions") {
            Endpoint::Chat
        } else if is("/v1/completions") {
            Endpoint::Completions
        } else if is("/v1/embeddings") {
            Endpoint::Embeddings
        } else {
            Endpoint::Other
        }
    }
}

/// Whether a backend of `kind` serves `endpoint` at all: Anthropic has
/// chat only (no embeddings, no legacy completions). The route table
/// leaves such backends out of those requests' candidates.
pub fn serves(kind: Provider, endpoint: Endpoint) -> bool {
    match kind {
        Provider::Anthropic => endpoint == Endpoint::Chat,
        Provider::Openai | Provider::Azure => true,
    }
}

/// Why a request cannot go to a provider as it is: the client's 400,
/// naming the field.
#[derive(Debug)]
pub struct Refused {
    pub field: String,
    pub reason: String,
}

impl Refused {
    /// OpenAI's error body for it.
    pub fn body(&self) -> Bytes {
        let v = serde_json::json!({"error": {
            "message": format!("`{}`: {}", self.field, self.reason),
            "type": "invalid_request_error",
            "param": self.field,
            "code": "unsupported_parameter",
        }});
        Bytes::from(v.to_string())
    }
}

/// The request for a provider backend: its path, and its body (for
/// Anthropic, translated; `upstream_model` is the name the provider knows
/// the model by, `client_model` the one the client asked for).
pub fn prepare<'a>(
    cfg: &'a ProviderConfig,
    client_path: &'a str,
    body: Bytes,
    upstream_model: &str,
    client_model: &'a str,
) -> Result<Call<'a>, Refused> {
    let endpoint = Endpoint::of(client_path);
    match cfg.kind {
        Provider::Openai => Ok(Call {
            cfg,
            path: Cow::Borrowed(client_path),
            body: CallBody::Shared(body),
            answer: Answer::Openai,
        }),
        Provider::Azure => {
            let op = match endpoint {
                Endpoint::Chat => "chat/completions",
                Endpoint::Completions => "completions",
                Endpoint::Embeddings => "embeddings",
                Endpoint::Other => {
                    return Err(Refused {
                        field: "path".into(),
                        reason: format!("Azure OpenAI has no `{client_path}`"),
                    })
                }
            };
            Ok(Call {
                cfg,
                path: Cow::Owned(azure_path(upstream_model, op, &cfg.api_version)),
                body: CallBody::Shared(body),
                answer: Answer::Openai,
            })
        }
        Provider::Anthropic => {
            if endpoint != Endpoint::Chat {
                return Err(Refused {
                    field: "path".into(),
                    reason: format!("Anthropic's Messages API has no `{client_path}`"),
                });
            }
            anthropic::prepare(cfg, body, upstream_model, client_model)
        }
    }
}

/// Azure's deployment path; the deployment is percent-encoded where it
/// is not a plain name.
fn azure_path(deployment: &str, op: &str, version: &str) -> String {
    let mut d = String::with_capacity(deployment.len());
    for b in deployment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            d.push(char::from(b));
        } else {
            d.push_str(&format!("%{b:02X}"));
        }
    }
    format!("/openai/deployments/{d}/{op}?api-version={version}")
}

/// Client headers a provider request never carries, beyond those every
/// request drops (`forward::forwarded`): other forms of a credential and
/// the provider's version header, which are the backend's to set.
const DROP_FOR_PROVIDERS: &[&str] = &["api-key", "x-api-key", "anthropic-version"];

/// Whether a client header goes to a provider backend.
pub fn forwarded(name: &[u8]) -> bool {
    // The lengths first, in place: most names differ in length from all.
    !DROP_FOR_PROVIDERS
        .iter()
        .any(|d| d.len() == name.len() && name_is(name, d.as_bytes()))
}

/// Writes the provider's credential in its form, then the configured
/// headers. `now_ms` lets a key file be looked at again (see
/// `config::credential`).
pub fn put_credentials(out: &mut Vec<u8>, cfg: &ProviderConfig, now_ms: impl FnOnce() -> u64) {
    if let Some(key) = &cfg.key {
        let key = key.value(now_ms);
        match cfg.kind {
            Provider::Openai => {
                out.extend_from_slice(b"authorization: Bearer ");
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Provider::Azure => put_header(out, b"api-key", key.as_bytes()),
            Provider::Anthropic => put_header(out, b"x-api-key", key.as_bytes()),
        }
    }
    if cfg.kind == Provider::Anthropic {
        put_header(out, b"anthropic-version", cfg.api_version.as_bytes());
    }
    for (name, value) in &cfg.headers {
        put_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

/// The credential and configured headers of a provider's probe (its
/// model list), as [`put_credentials`] writes them on requests.
pub fn probe_headers(
    cfg: &ProviderConfig,
    now_ms: u64,
) -> Vec<(http::HeaderName, http::HeaderValue)> {
    let mut out = Vec::new();
    if let Some(key) = &cfg.key {
        let key = key.value(|| now_ms);
        let (name, value) = match cfg.kind {
            Provider::Openai => (http::header::AUTHORIZATION, format!("Bearer {key}")),
            Provider::Azure => (http::HeaderName::from_static("api-key"), key.to_string()),
            Provider::Anthropic => (http::HeaderName::from_static("x-api-key"), key.to_string()),
        };
        if let Ok(mut v) = http::HeaderValue::from_str(&value) {
            v.set_sensitive(true);
            out.push((name, v));
        }
    }
    if cfg.kind == Provider::Anthropic {
        if let Ok(v) = http::HeaderValue::from_str(&cfg.api_version) {
            out.push((http::HeaderName::from_static("anthropic-version"), v));
        }
    }
    out.extend(cfg.headers.iter().cloned());
    out
}

/// A 401 or 403 from a provider: the backend's key is wrong, expired or
/// not allowed the model; no retry on it can help.
pub fn is_credentials(status: StatusCode) -> bool {
    status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

/// Anthropic's 529 `overloaded_error`: busy, as a 429 is.
pub fn is_overloaded(status: StatusCode) -> bool {
    status.as_u16() == 529
}

/// How long a busy provider asks to be left alone: `Retry-After`, else
/// the soonest of its rate-limit reset headers (OpenAI's durations such
/// as `6m0s`, Anthropic's RFC 3339 times), at most [`MAX_RETRY_AFTER`].
pub fn busy_for(lines: &HeadLines, now: std::time::SystemTime) -> Option<Duration> {
    if let Some(d) = lines.get(b"retry-after").and_then(parse_retry_after) {
        return Some(d);
    }
    reset_hint(lines, now)
}

/// The soonest reset a provider's rate-limit headers name.
fn reset_hint(lines: &HeadLines, now: std::time::SystemTime) -> Option<Duration> {
    let mut soonest: Option<Duration> = None;
    for name in [
        &b"x-ratelimit-reset-requests"[..],
        b"x-ratelimit-reset-tokens",
        b"anthropic-ratelimit-requests-reset",
        b"anthropic-ratelimit-tokens-reset",
        b"anthropic-ratelimit-input-tokens-reset",
        b"anthropic-ratelimit-output-tokens-reset",
    ] {
        if let Some(d) = lines.get(name).and_then(|v| reset_in(v, now)) {
            soonest = Some(soonest.map_or(d, |s| s.min(d)));
        }
    }
    soonest.map(|d| d.min(MAX_RETRY_AFTER))
}

/// The rate-limit headers a provider's answer may say its allowance is
/// used up with: (remaining, its reset).
const LIMITS: &[(&[u8], &[u8])] = &[
    (
        b"x-ratelimit-remaining-requests",
        b"x-ratelimit-reset-requests",
    ),
    (b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens"),
    (
        b"anthropic-ratelimit-requests-remaining",
        b"anthropic-ratelimit-requests-reset",
    ),
    (
        b"anthropic-ratelimit-tokens-remaining",
        b"anthropic-ratelimit-tokens-reset",
    ),
];

/// A successful answer that says the provider's allowance is used up
/// (`x-ratelimit-remaining-requests: 0` or `…-tokens: 0`, Anthropic's
/// `anthropic-ratelimit-*-remaining: 0`): how long to cool the backend
/// for (until the latest reset of the exhausted allowances), so that the
/// next requests go elsewhere instead of collecting 429s. One second
/// when no reset header says how long.
pub fn exhausted_for(
    lines: &HeadLines,
    now: impl FnOnce() -> std::time::SystemTime,
) -> Option<Duration> {
    // Only a header whose value is `0` says an allowance is used up: an
    // answer without one (nearly every one) is done after a byte search.
    if !has_zero_value(&lines.lines) {
        return None;
    }
    // Then one pass: which of those is a limit's, without a lookup per
    // header name.
    let zero = lines
        .iter()
        .any(|(name, value)| value == b"0" && LIMITS.iter().any(|(r, _)| name_is(name, r)));
    if !zero {
        return None;
    }
    // The clock is read only now, for an answer that needs it.
    let now = now();
    let mut wait: Option<Duration> = None;
    for &(remaining, reset) in LIMITS {
        if lines.get(remaining).is_some_and(|v| v.trim_ascii() == b"0") {
            let d = lines
                .get(reset)
                .and_then(|v| reset_in(v, now))
                .unwrap_or(Duration::from_secs(1));
            wait = Some(wait.map_or(d, |w| w.max(d)));
        }
    }
    wait.map(|d| d.min(MAX_RETRY_AFTER))
}

/// Whether some header line of `head` may have the value `0`: a `0` with
/// the colon or whitespace before it and whitespace or the line's end
/// after it (every line whose trimmed value is `0` has one).
fn has_zero_value(head: &[u8]) -> bool {
    memchr::memchr_iter(b'0', head).any(|at| {
        let before = at.checked_sub(1).map(|i| head[i]);
        let after = head.get(at + 1);
        matches!(before, Some(b':' | b' ' | b'\t'))
            && matches!(after, None | Some(b'\r' | b'\n' | b' ' | b'\t'))
    })
}

/// A reset header's time from `now`: OpenAI's duration (`6m0s`, `20ms`)
/// or Anthropic's RFC 3339 time.
fn reset_in(value: &[u8], now: std::time::SystemTime) -> Option<Duration> {
    let value = std::str::from_utf8(value).ok()?.trim();
    humantime::parse_duration(value).ok().or_else(|| {
        humantime::parse_rfc3339_weak(value)
            .ok()
            .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO))
    })
}

/// Whether a client header is forwarded to this backend: every backend's
/// rule, and for a provider its own.
pub fn put_client_headers(out: &mut Vec<u8>, client: &ClientHeaders) {
    crate::dataplane::forward::put_backend_headers_where(out, client, forwarded);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn lines(text: &'static str) -> HeadLines {
        HeadLines {
            lines: Bytes::from_static(text.as_bytes()),
            ..HeadLines::default()
        }
    }

    #[test]
    fn azure_paths_name_the_deployment_and_the_api_version() {
        assert_eq!(
            azure_path("gpt-4o", "chat/completions", "2024-10-21"),
            "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            azure_path("a b/c", "embeddings", "v"),
            "/openai/deployments/a%20b%2Fc/embeddings?api-version=v"
        );
    }

    #[test]
    fn an_endpoint_is_its_whole_path_with_or_without_a_query() {
        for (path, want) in [
            ("/v1/chat/completions", Endpoint::Chat),
            ("/v1/chat/completions?api-version=1", Endpoint::Chat),
            ("/v1/chat/completionsx", Endpoint::Other),
            ("/v1/chat/completions/", Endpoint::Other),
            ("/v1/completions", Endpoint::Completions),
            ("/v1/embeddings?", Endpoint::Embeddings),
            ("/v1/embedding", Endpoint::Other),
            ("", Endpoint::Other),
        ] {
            assert_eq!(Endpoint::of(path), want, "{path}");
        }
    }

    #[test]
    fn anthropic_serves_chat_only() {
        assert!(serves(
            Provider::Anthropic,
            Endpoint::of("/v1/chat/completions")
        ));
        assert!(!serves(Provider::Anthropic, Endpoint::of("/v1/embeddings")));
        assert!(!serves(
            Provider::Anthropic,
            Endpoint::of("/v1/completions")
        ));
        assert!(serves(Provider::Azure, Endpoint::of("/v1/embeddings")));
    }

    #[test]
    fn a_provider_reads_its_own_rate_limit_hints() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            busy_for(&lines("retry-after: 7\r\n"), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            busy_for(
                &lines("x-ratelimit-reset-requests: 6m0s\r\nx-ratelimit-reset-tokens: 20ms\r\n"),
                now
            ),
            Some(Duration::from_millis(20))
        );
        // 2023-11-14T22:13:20Z is `now`; three seconds later.
        assert_eq!(
            busy_for(
                &lines("anthropic-ratelimit-requests-reset: 2023-11-14T22:13:23Z\r\n"),
                now
            ),
            Some(Duration::from_secs(3))
        );
        assert_eq!(busy_for(&lines("x-other: 1\r\n"), now), None);
        assert_eq!(
            busy_for(&lines("x-ratelimit-reset-requests: 99999h\r\n"), now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            exhausted_for(
                &lines("x-ratelimit-remaining-requests: 0\r\nx-ratelimit-reset-requests: 2s\r\n"),
                || now
            ),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            exhausted_for(&lines("x-ratelimit-remaining-requests: 12\r\n"), || now),
            None
        );
        // The exhausted allowance's own reset, not a sooner one of another.
        assert_eq!(
            exhausted_for(
                &lines(
                    "x-ratelimit-remaining-requests: 0\r\nx-ratelimit-reset-requests: 1s\r\n\
                     x-ratelimit-remaining-tokens: 900\r\nx-ratelimit-reset-tokens: 30ms\r\n"
                ),
                || now
            ),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            exhausted_for(
                &lines("anthropic-ratelimit-requests-remaining: 0\r\n"),
                || now
            ),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn a_zero_allowance_is_found_however_its_line_is_spaced_and_nothing_else_is() {
        let now = SystemTime::UNIX_EPOCH;
        for head in [
            "x-ratelimit-remaining-tokens:0\r\n",
            "x-ratelimit-remaining-tokens: \t0 \r\n",
            "date: Mon, 07 Dec 2026 00:00:00 GMT\r\nanthropic-ratelimit-tokens-remaining: 0\r\n",
            "Anthropic-RateLimit-Tokens-Remaining:\t0\n",
        ] {
            assert!(has_zero_value(head.as_bytes()), "{head:?}");
            assert_eq!(
                exhausted_for(&lines(head), || now),
                Some(Duration::from_secs(1)),
                "{head:?}"
            );
        }
        for head in [
            "content-length: 370\r\ndate: Mon, 07 Dec 2026 03:10:58 GMT\r\nrequest-id: req_0\r\n",
            "x-ratelimit-remaining-tokens: 10\r\nx-ratelimit-remaining-requests: 01\r\n",
            "",
        ] {
            assert!(!has_zero_value(head.as_bytes()), "{head:?}");
            assert_eq!(exhausted_for(&lines(head), || now), None, "{head:?}");
        }
        // A `0` value of another header passes the first look, not the second.
        assert_eq!(exhausted_for(&lines("x-other: 0\r\n"), || now), None);
    }
}
