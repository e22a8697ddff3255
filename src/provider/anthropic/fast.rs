//! The bytes-to-bytes translations the request path calls: the common
//! shapes (plain text turns, a text or tool-use answer) go through typed,
//! borrowing structs with no `serde_json::Value` in between; anything else
//! falls back to the `Value` translation, which has the last word (its
//! refusals, its output). The two agree on every input the fast path
//! takes: the tests check it on the golden tables and on random requests.
//!
//! Why: a `Value` parse, rebuild and write of a typical request and answer
//! costs ~73k instructions, more than twice a whole proxied request; the
//! typed path a fraction of that (docs/src/providers-anthropic.md,
//! "Cost").

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::response::{finish_reason, Usage};
use crate::provider::TranslateError;

fn not_json(e: serde_json::Error) -> TranslateError {
    TranslateError::new("body", format!("not JSON: {e}"))
}

/// A translated request: the upstream body, and what the answer's
/// translation needs to know of the client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    /// The Messages API request body.
    pub body: Vec<u8>,
    /// The client asked for a stream (`stream: true`).
    pub stream: bool,
    /// The client asked for the usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
}

/// [`super::request`] from the client's body bytes to the upstream body
/// bytes: the same translation and the same refusals, and the two flags
/// the answer's translation needs (read in the same pass).
pub fn request_bytes(
    body: &[u8],
    upstream_model: &str,
    default_max_tokens: u32,
) -> Result<Translated, TranslateError> {
    if let Some(out) = super::verbatim::request(body, upstream_model, default_max_tokens) {
        return Ok(out);
    }
    if let Some(out) = simple_request(body, upstream_model, default_max_tokens) {
        return Ok(out);
    }
    let v: Value = serde_json::from_slice(body).map_err(not_json)?;
    let out = super::request(&v, upstream_model, default_max_tokens)?;
    Ok(Translated {
        body: serde_json::to_vec(&out).map_err(not_json)?,
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// [`super::response_at`] from the provider's body bytes to the client's.
pub fn response_bytes(
    body: &[u8],
    client_model: &str,
    created: u64,
) -> Result<Vec<u8>, TranslateError> {
    answer_bytes(body, client_model, created).map(|(out, _)| out)
}

/// [`response_bytes`], and the answer's usage when the one-pass path
/// read it (the counts the translated body's `usage` says; `None`: read
/// them from the body), so that nobody reads them again.
pub fn answer_bytes(
    body: &[u8],
    client_model: &str,
    created: u64,
) -> Result<(Vec<u8>, Option<Usage>), TranslateError> {
    if let Some((out, usage)) = super::verbatim::response(body, client_model, created) {
        return Ok((out, Some(usage)));
    }
    if let Some(out) = simple_response(body, client_model, created) {
        return Ok((out, None));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        TranslateError::new("body", format!("the provider's answer is not JSON: {e}"))
    })?;
    let out = super::response_at(&v, client_model, created)?;
    Ok((serde_json::to_vec(&out).map_err(not_json)?, None))
}

/// The request shapes the fast path takes; any other field, or a value
/// it does not expect, fails to parse and sends the body the long way.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimpleRequest<'a> {
    #[serde(borrow)]
    #[allow(dead_code)] // read to check it is a string
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    messages: Vec<SimpleMessage<'a>>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<serde_json::Number>,
    top_p: Option<serde_json::Number>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    stop: Option<Value>,
    #[serde(borrow)]
    user: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimpleMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow)]
    content: Cow<'a, str>,
}

#[derive(Serialize)]
struct Upstream<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: Vec<Turn<'a>>,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_sequences: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata<'a>>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Serialize)]
struct Metadata<'a> {
    user_id: &'a str,
}

fn simple_request(
    body: &[u8],
    upstream_model: &str,
    default_max_tokens: u32,
) -> Option<Translated> {
    let req: SimpleRequest<'_> = serde_json::from_slice(body).ok()?;
    let mut system = None;
    let mut messages: Vec<Turn<'_>> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let role = match m.role.as_ref() {
            // Several system messages become text blocks: the long way.
            "system" | "developer" if system.is_none() => {
                system = Some(m.content.as_ref());
                continue;
            }
            "user" => "user",
            "assistant" => "assistant",
            _ => return None,
        };
        // Turns to merge: the long way.
        if messages.last().is_some_and(|t| t.role == role) {
            return None;
        }
        messages.push(Turn {
            role,
            content: m.content.as_ref(),
        });
    }
    let unit = |x: &Option<serde_json::Number>| {
        x.as_ref()
            .is_none_or(|x| x.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)))
    };
    let positive = |n: Option<u64>| n.is_none_or(|n| n >= 1);
    if !unit(&req.temperature)
        || !unit(&req.top_p)
        || !positive(req.max_tokens)
        || !positive(req.max_completion_tokens)
    {
        return None;
    }
    let stop_sequences = match req.stop {
        None => None,
        Some(Value::String(s)) => Some(vec![Value::String(s)]),
        Some(Value::Array(list)) if list.iter().all(Value::is_string) => {
            (!list.is_empty()).then_some(list)
        }
        Some(_) => return None,
    };
    let out = Upstream {
        model: upstream_model,
        system,
        messages,
        max_tokens: req
            .max_completion_tokens
            .or(req.max_tokens)
            .unwrap_or(u64::from(default_max_tokens).max(1)),
        temperature: req.temperature,
        top_p: req.top_p,
        stop_sequences,
        stream: req.stream,
        metadata: req.user.as_deref().map(|user_id| Metadata { user_id }),
    };
    // Written into room for all of it: the client's body, less what is
    // left out, plus the few keys that change.
    let mut written = Vec::with_capacity(body.len().saturating_add(upstream_model.len() + 64));
    serde_json::to_writer(&mut written, &out).ok()?;
    Some(Translated {
        body: written,
        stream: req.stream.unwrap_or(false),
        include_usage: req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

/// The answer shapes the fast path takes: text and `tool_use` blocks.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    content: Vec<Block<'a>>,
    #[serde(borrow)]
    stop_reason: Option<Cow<'a, str>>,
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    input: Option<Value>,
}

/// Anthropic's `usage`, typed (unknown fields such as `service_tier` are
/// skipped; a count that is not an integer sends the body the long way).
#[derive(Deserialize, Default)]
pub(super) struct UsageIn {
    pub(super) input_tokens: Option<u64>,
    pub(super) output_tokens: Option<u64>,
    pub(super) cache_creation_input_tokens: Option<u64>,
    pub(super) cache_read_input_tokens: Option<u64>,
}

impl Usage {
    /// [`Usage::update`] from the typed fields.
    pub(super) fn merge(&mut self, u: &UsageIn) {
        if let Some(n) = u.input_tokens {
            self.input_tokens = n;
        }
        if let Some(n) = u.output_tokens {
            self.output_tokens = n;
        }
        if u.cache_creation_input_tokens.is_some() {
            self.cache_creation_input_tokens = u.cache_creation_input_tokens;
        }
        if u.cache_read_input_tokens.is_some() {
            self.cache_read_input_tokens = u.cache_read_input_tokens;
        }
    }
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: UsageOut,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: AnswerMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct AnswerMessage<'a> {
    role: &'static str,
    content: Option<Cow<'a, str>>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall<'a>>,
}

#[derive(Serialize)]
struct ToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<Details>,
}

#[derive(Serialize)]
struct Details {
    cached_tokens: u64,
}

impl From<&Usage> for UsageOut {
    fn from(u: &Usage) -> Self {
        let prompt = u.prompt_tokens();
        let cached = u.cache_creation_input_tokens.is_some() || u.cache_read_input_tokens.is_some();
        Self {
            prompt_tokens: prompt,
            completion_tokens: u.output_tokens,
            total_tokens: prompt.saturating_add(u.output_tokens),
            prompt_tokens_details: cached.then(|| Details {
                cached_tokens: u.cache_read_input_tokens.unwrap_or(0),
            }),
        }
    }
}

fn simple_response(body: &[u8], client_model: &str, created: u64) -> Option<Vec<u8>> {
    let m: Message<'_> = serde_json::from_slice(body).ok()?;
    if m.kind.as_deref().is_some_and(|k| k != "message") {
        return None;
    }
    let finish = finish_reason(m.stop_reason.as_deref()?).ok()?;
    let mut text: Option<Cow<'_, str>> = None;
    let mut tool_calls = Vec::new();
    for b in &m.content {
        match b.kind.as_ref() {
            "text" => {
                let t = b.text.as_deref()?;
                text = Some(match text {
                    None => Cow::Borrowed(t),
                    Some(prev) => Cow::Owned(prev.into_owned() + t),
                });
            }
            "tool_use" => tool_calls.push(ToolCall {
                id: b.id.as_deref()?,
                kind: "function",
                function: Function {
                    name: b.name.as_deref()?,
                    // Missing or null input: the long way says it as it is.
                    arguments: b.input.as_ref()?.to_string(),
                },
            }),
            "thinking" | "redacted_thinking" => {}
            _ => return None,
        }
    }
    let mut usage = Usage::default();
    if let Some(u) = &m.usage {
        usage.merge(u);
    }
    // OpenAI's content is null when the answer is only tool calls.
    let text = text.unwrap_or(Cow::Borrowed(""));
    let content = (!text.is_empty() || tool_calls.is_empty()).then_some(text);
    let out = Completion {
        id: &m.id,
        object: "chat.completion",
        created,
        model: client_model,
        choices: [Choice {
            index: 0,
            message: AnswerMessage {
                role: "assistant",
                content,
                refusal: None,
                tool_calls,
            },
            logprobs: None,
            finish_reason: finish,
        }],
        usage: UsageOut::from(&usage),
    };
    // Room for all of it: OpenAI's answer is the provider's, give or take
    // a few keys.
    let mut written = Vec::with_capacity(body.len().saturating_add(client_model.len() + 128));
    serde_json::to_writer(&mut written, &out).ok()?;
    Some(written)
}
