//! What routing needs from a request, read without touching the rest of the
//! body: model, stream flag, output-token cap, user, and the request class.

pub(crate) mod headers;

pub use headers::ClientHeaders;

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::config::AffinityConfig;
use crate::dataplane::error::ApiError;

/// The routing-relevant fields of an OpenAI request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMeta {
    pub model: String,
    pub stream: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u64>,
    pub user: Option<String>,
    /// A plain-text answer, one choice, no log probabilities and no tools:
    /// a stream of it that breaks can be continued on another backend.
    pub plain_text: bool,
}

#[derive(Deserialize)]
struct Head {
    model: Option<String>,
    stream: Option<bool>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    user: Option<String>,
    n: Option<u64>,
    logprobs: Option<serde_json::Value>,
    tools: Option<IgnoredAny>,
    functions: Option<IgnoredAny>,
    /// Skipped element by element: serde_json skips an unknown array of
    /// objects with a stack it allocates per parse (one allocation per
    /// chat request); a `Vec` of nothing allocates nothing. Not an array
    /// (never valid) is a 400 here instead of the backend's.
    #[allow(dead_code)]
    messages: Option<Vec<IgnoredAny>>,
    // Unknown fields are skipped by serde (still validated as JSON).
}

impl RequestMeta {
    /// Parses the fields routing needs; a body that is not a JSON object in
    /// UTF-8, or whose known fields have the wrong type, is a 400. (serde
    /// skips unknown fields without checking the UTF-8 of their strings, so
    /// the whole body is checked first: bytes a backend cannot decode never
    /// reach it.)
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let text = std::str::from_utf8(body).map_err(|e| {
            ApiError::BadRequest(format!(
                "the request body is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ))
        })?;
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return Err(ApiError::BadRequest(
                "the request body must be a JSON object".into(),
            ));
        }
        // From the checked text: serde does not check each string again.
        let head: Head = serde_json::from_str(text)
            .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
        let model = head
            .model
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::BadRequest("you must provide a `model` parameter".into()))?;
        let logprobs = match head.logprobs {
            None | Some(serde_json::Value::Null | serde_json::Value::Bool(false)) => false,
            Some(_) => true,
        };
        Ok(Self {
            model,
            stream: head.stream.unwrap_or(false),
            max_tokens: head.max_completion_tokens.or(head.max_tokens),
            user: head.user,
            plain_text: head.n.unwrap_or(1) <= 1
                && !logprobs
                && head.tools.is_none()
                && head.functions.is_none(),
        })
    }
}

/// Whether a request may cross zones when its own cannot serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    Short,
    Long,
}

impl RequestClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestClass::Short => "short",
            RequestClass::Long => "long",
        }
    }
}

/// A request is short when it caps its output at `short_max_tokens` and its
/// prompt (approximated by the body size) is under `short_max_prompt_bytes`.
/// No cap means long: an uncapped generation may run for minutes.
/// Embeddings generate nothing, so only their input size counts.
pub fn classify(
    meta: &RequestMeta,
    body_len: usize,
    embeddings: bool,
    cfg: &AffinityConfig,
) -> RequestClass {
    let small_prompt = (body_len as u64) < cfg.short_max_prompt_bytes;
    let small_output = embeddings || meta.max_tokens.is_some_and(|t| t <= cfg.short_max_tokens);
    if small_prompt && small_output {
        RequestClass::Short
    } else {
        RequestClass::Long
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CrossZone;

    fn meta(body: &str) -> Result<RequestMeta, ApiError> {
        RequestMeta::parse(body.as_bytes())
    }

    #[test]
    fn parses_routing_fields_and_ignores_the_rest() {
        let m = meta(r#"{"model":"m","stream":true,"max_tokens":5,"user":"u","messages":[{"role":"user","content":"hi"}],"temperature":0.2}"#).unwrap();
        assert_eq!(
            m,
            RequestMeta {
                model: "m".into(),
                stream: true,
                max_tokens: Some(5),
                user: Some("u".into()),
                plain_text: true,
            }
        );
        for body in [
            r#"{"model":"m","n":2}"#,
            r#"{"model":"m","logprobs":true}"#,
            r#"{"model":"m","logprobs":3}"#,
            r#"{"model":"m","tools":[]}"#,
        ] {
            assert!(!meta(body).unwrap().plain_text, "{body}");
        }
        assert!(
            meta(r#"{"model":"m","logprobs":false,"n":1}"#)
                .unwrap()
                .plain_text
        );
        // Messages of any shape an array holds: content parts, escapes, null.
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\nb"}]}]}"#,
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m","messages":null}"#,
            r#"{"model":"m","messages":[[1,[2]],"x",{"a":{"b":[]}}]}"#,
        ] {
            assert_eq!(meta(body).unwrap().model, "m", "{body}");
        }
        let m = meta(r#"{"model":"m","max_tokens":5,"max_completion_tokens":9}"#).unwrap();
        assert_eq!(m.max_tokens, Some(9), "max_completion_tokens wins");
    }

    #[test]
    fn invalid_utf8_anywhere_is_a_400() {
        let mut body = br#"{"model":"m","messages":[{"role":"user","content":"caf"#.to_vec();
        body.extend_from_slice(&[0xC3, 0x28]);
        body.extend_from_slice(br#""}]}"#);
        let e = RequestMeta::parse(&body).expect_err("invalid UTF-8");
        assert!(matches!(e, ApiError::BadRequest(m) if m.contains("UTF-8")));
    }

    #[test]
    fn rejects_bad_bodies_with_400() {
        for body in [
            "",
            "not json",
            "[\"m\"]",
            "{\"model\":",
            "{\"messages\":[]}",
            "{\"model\":\"\"}",
            "{\"model\":7}",
            "{\"model\":\"m\",\"stream\":\"yes\"}",
            "{\"model\":\"m\",\"max_tokens\":-1}",
            "{\"model\":\"m\",\"messages\":\"hi\"}",
            "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"]}",
        ] {
            let e = meta(body).expect_err(body);
            assert!(matches!(e, ApiError::BadRequest(_)), "{body}: {e:?}");
        }
    }

    #[test]
    fn deeply_nested_messages_are_skipped_without_recursion() {
        // Valid JSON, however deep: serde_json skips it with a loop, not a
        // call per level, so a hostile depth neither overflows the stack
        // nor costs more than its bytes.
        for depth in [200, 100_000] {
            let body = format!(
                r#"{{"model":"m","messages":[{}{}]}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            );
            assert_eq!(meta(&body).unwrap().model, "m", "{depth}");
            // Unbalanced, it is a 400.
            let e = meta(&body[..body.len() - 2]).expect_err("truncated");
            assert!(matches!(e, ApiError::BadRequest(_)), "{depth}: {e:?}");
        }
    }

    #[test]
    fn classifies_short_and_long() {
        let cfg = AffinityConfig {
            zone_pin: true,
            pin_ttl: std::time::Duration::from_secs(3600),
            pin_capacity: 10,
            cross_zone_fallback: CrossZone::Short,
            short_max_tokens: 512,
            short_max_prompt_bytes: 16 * 1024,
        };
        let m = |t: Option<u64>| RequestMeta {
            model: "m".into(),
            stream: false,
            max_tokens: t,
            user: None,
            plain_text: true,
        };
        let cases = [
            (Some(512), 100, false, RequestClass::Short),
            (Some(513), 100, false, RequestClass::Long),
            (None, 100, false, RequestClass::Long),
            (Some(10), 16 * 1024, false, RequestClass::Long),
            (None, 100, true, RequestClass::Short),
            (None, 20_000, true, RequestClass::Long),
        ];
        for (tokens, len, emb, want) in cases {
            assert_eq!(
                classify(&m(tokens), len, emb, &cfg),
                want,
                "{tokens:?} {len} {emb}"
            );
        }
    }
}
