//! Anthropic's Messages API wire format for `zonegate mock-backend
//! --provider anthropic`: the request checks Anthropic makes (`x-api-key`,
//! `anthropic-version`, required `max_tokens`, no unknown fields), its
//! answers (a `message`, or the `event:`/`data:` stream), its error bodies
//! and rate-limit headers, and its model list. Pure functions of the
//! mock's generated answer and settings; the mock (`mock.rs`) serves them
//! and keeps its fault switches.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq;

/// The API version a client must name (Anthropic refuses requests without
/// an `anthropic-version` header; this is the one every SDK sends).
pub const VERSION: &str = "2023-06-01";

/// The limits the mock's `anthropic-ratelimit-*` headers report.
pub const REQUESTS_LIMIT: u64 = 1_000;
pub const INPUT_TOKENS_LIMIT: u64 = 80_000;
pub const OUTPUT_TOKENS_LIMIT: u64 = 16_000;

/// Top-level request fields the Messages API knows; any other is a 400,
/// as Anthropic answers "Extra inputs are not permitted". It is how a test
/// sees that the gateway sent no OpenAI-only field.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "container",
    "mcp_servers",
];

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The message Anthropic sends with an injected fault's status.
fn fault_message(status: u16) -> &'static str {
    match status {
        401 => "invalid x-api-key",
        403 => "Your API key does not have permission to use the specified resource.",
        404 => "Not Found",
        429 => {
            "Number of requests has exceeded your per-minute rate limit; see the response \
                headers for current usage. Please try again later."
        }
        529 => "Overloaded",
        500..=599 => "Internal server error",
        _ => "mock fault: injected error",
    }
}

/// `{"type":"error","error":{"type","message"},"request_id"}`.
pub fn error_body(status: u16, message: &str, request_id: &str) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(status), "message": message},
        "request_id": request_id,
    })
}

fn reply(
    status: u16,
    content_type: &'static str,
    body: Bytes,
    request_id: &str,
) -> Response<Bytes> {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(HeaderName::from_static("request-id"), v);
    }
    resp
}

fn json_reply(status: u16, body: &Value, request_id: &str) -> Response<Bytes> {
    reply(
        status,
        "application/json",
        Bytes::from(body.to_string()),
        request_id,
    )
}

/// An error answer as Anthropic sends it: 429 and 529 bodies with
/// `retry-after` (seconds, when given), a 429 with the
/// `anthropic-ratelimit-*` headers of an exhausted request budget that
/// resets `retry_after` from `now`.
pub fn error_response(
    status: u16,
    message: Option<&str>,
    retry_after: Option<u64>,
    request_id: &str,
    now: SystemTime,
) -> Response<Bytes> {
    let message = message.unwrap_or_else(|| fault_message(status));
    let mut resp = json_reply(status, &error_body(status, message, request_id), request_id);
    let h = resp.headers_mut();
    if let Some(s) = retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    if status == 429 {
        let reset = Duration::from_secs(retry_after.unwrap_or(60));
        h.extend(rate_limit_headers(0, reset, now));
    }
    resp
}

/// Anthropic's `anthropic-ratelimit-*` headers: the mock's fixed limits,
/// `requests_remaining` of them left, every budget full again `reset` from
/// `now` (RFC 3339, as Anthropic writes it). Token budgets are reported
/// full but when no request is left, then empty.
pub fn rate_limit_headers(requests_remaining: u64, reset: Duration, now: SystemTime) -> HeaderMap {
    let at = now.checked_add(reset).unwrap_or(now);
    let reset = humantime::format_rfc3339_seconds(at).to_string();
    let exhausted = requests_remaining == 0;
    let left = |limit: u64| if exhausted { 0 } else { limit };
    let rows: [(&str, u64, u64); 4] = [
        (
            "requests",
            REQUESTS_LIMIT,
            requests_remaining.min(REQUESTS_LIMIT),
        ),
        (
            "tokens",
            INPUT_TOKENS_LIMIT + OUTPUT_TOKENS_LIMIT,
            left(INPUT_TOKENS_LIMIT + OUTPUT_TOKENS_LIMIT),
        ),
        ("input-tokens", INPUT_TOKENS_LIMIT, left(INPUT_TOKENS_LIMIT)),
        (
            "output-tokens",
            OUTPUT_TOKENS_LIMIT,
            left(OUTPUT_TOKENS_LIMIT),
        ),
    ];
    let mut h = HeaderMap::new();
    for (what, limit, remaining) in rows {
        for (field, value) in [
            ("limit", limit.to_string()),
            ("remaining", remaining.to_string()),
            ("reset", reset.clone()),
        ] {
            let name = format!("anthropic-ratelimit-{what}-{field}");
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                h.insert(n, v);
            }
        }
    }
    h
}

/// Checks the headers Anthropic checks: `x-api-key` (when `expect_key` is
/// set: missing or different → 401 `authentication_error`) and
/// `anthropic-version` (missing → 400). A client's `Authorization: Bearer`
/// is not Anthropic's credential and does not count.
pub fn authenticate(
    headers: &HeaderMap,
    expect_key: Option<&str>,
    request_id: &str,
) -> Result<(), Box<Response<Bytes>>> {
    if let Some(expected) = expect_key {
        let given = headers.get("x-api-key").map(HeaderValue::as_bytes);
        let message = match given {
            None => Some("x-api-key header is required"),
            Some(k) if !bool::from(k.ct_eq(expected.as_bytes())) => Some("invalid x-api-key"),
            Some(_) => None,
        };
        if let Some(m) = message {
            return Err(Box::new(json_reply(
                401,
                &error_body(401, m, request_id),
                request_id,
            )));
        }
    }
    if !headers.contains_key("anthropic-version") {
        let m = "anthropic-version: header is required";
        return Err(Box::new(json_reply(
            400,
            &error_body(400, m, request_id),
            request_id,
        )));
    }
    Ok(())
}

/// What the mock needs of a Messages API request.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub model: String,
    pub max_tokens: u64,
    pub stream: bool,
    /// The final assistant turn's text (a prefill the answer continues).
    pub prefill: Option<String>,
    /// The tool the answer must call: `tool_choice` `tool` names it, `any`
    /// means the first of `tools`.
    pub tool: Option<Tool>,
}

/// A tool the request offers, by name and input schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub input_schema: Value,
}

/// Parses and checks a `POST /v1/messages` body as Anthropic does: a 400
/// `invalid_request_error` for a body that is not JSON, a missing `model`,
/// `max_tokens` or `messages`, a role other than `user`/`assistant`, an
/// unknown top-level field, a temperature above 1, a prefill that ends
/// in whitespace.
pub fn parse_request(body: &[u8], request_id: &str) -> Result<Head, Box<Response<Bytes>>> {
    parse(body).map_err(|m| {
        Box::new(json_reply(
            400,
            &error_body(400, &m, request_id),
            request_id,
        ))
    })
}

fn parse(body: &[u8]) -> Result<Head, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v.as_object().ok_or("the body must be a JSON object")?;
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("{k}: Extra inputs are not permitted"));
    }
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .ok_or("model: Field required")?
        .to_owned();
    let max_tokens = obj
        .get("max_tokens")
        .and_then(Value::as_u64)
        .filter(|&n| n >= 1)
        .ok_or("max_tokens: Field required (an integer of at least 1)")?;
    if obj
        .get("temperature")
        .and_then(Value::as_f64)
        .is_some_and(|t| !(0.0..=1.0).contains(&t))
    {
        return Err("temperature: Input should be less than or equal to 1".into());
    }
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("messages: Field required (a non-empty list)")?;
    for (i, m) in messages.iter().enumerate() {
        match m.get("role").and_then(Value::as_str) {
            Some("user" | "assistant") => {}
            Some(other) => {
                return Err(format!(
                    "messages.{i}.role: Unexpected role \"{other}\". The Messages API accepts a \
                     top-level `system` parameter, not \"system\" as an input message role."
                ))
            }
            None => return Err(format!("messages.{i}.role: Field required")),
        }
    }
    let prefill = messages
        .last()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .map(|m| text_of(m.get("content").unwrap_or(&Value::Null)));
    if prefill
        .as_deref()
        .is_some_and(|p| p.ends_with(char::is_whitespace))
    {
        return Err("messages: final assistant content cannot end with trailing whitespace".into());
    }
    Ok(Head {
        model,
        max_tokens,
        stream,
        prefill,
        tool: forced_tool(obj),
    })
}

/// A content's text: the string, or its text blocks joined.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn forced_tool(obj: &Map<String, Value>) -> Option<Tool> {
    let tools = obj.get("tools").and_then(Value::as_array)?;
    let choice = obj.get("tool_choice")?;
    let wanted = match choice.get("type").and_then(Value::as_str)? {
        "tool" => choice.get("name").and_then(Value::as_str),
        "any" => None,
        _ => return None,
    };
    let tool = tools
        .iter()
        .find(|t| wanted.is_none_or(|w| t.get("name").and_then(Value::as_str) == Some(w)))?;
    Some(Tool {
        name: tool.get("name").and_then(Value::as_str)?.to_owned(),
        input_schema: tool.get("input_schema").cloned().unwrap_or(Value::Null),
    })
}

/// An input that fits a tool's schema: each property of the top-level
/// object gets `text` for a string, 1 for a number, true for a boolean,
/// an empty list or object, null otherwise.
pub fn tool_input(schema: &Value, text: &str) -> Value {
    let mut input = Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let v = match prop.get("type").and_then(Value::as_str) {
                Some("string") => json!(text),
                Some("number" | "integer") => json!(1),
                Some("boolean") => json!(true),
                Some("array") => json!([]),
                Some("object") => json!({}),
                _ => Value::Null,
            };
            input.insert(name.clone(), v);
        }
    }
    Value::Object(input)
}

/// The mock's answer, in the words it streams.
#[derive(Debug, Clone)]
pub struct Answer<'a> {
    /// `msg_…`
    pub id: &'a str,
    pub model: &'a str,
    /// Text pieces, one `text_delta` each; none means no text block.
    pub words: &'a [String],
    /// A `tool_use` block after the text: (id `toolu_…`, name, input).
    pub tool_use: Option<(&'a str, &'a str, &'a Value)>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: &'a str,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Answer<'_> {
    fn usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        })
    }

    fn blocks(&self) -> Vec<Value> {
        let mut blocks = Vec::with_capacity(2);
        if !self.words.is_empty() {
            blocks.push(json!({"type": "text", "text": self.words.concat()}));
        }
        if let Some((id, name, input)) = self.tool_use {
            blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
        blocks
    }

    /// The non-streamed answer: a `message` object.
    pub fn message(&self) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks(),
            "stop_reason": self.stop_reason,
            "stop_sequence": null,
            "usage": self.usage(self.output_tokens),
        })
    }

    /// The streamed answer: one `event: …\ndata: …\n\n` text per event, in
    /// Anthropic's order: `message_start`, a text block (start, `ping`, a
    /// delta per word, stop), a `tool_use` block whose input arrives in two
    /// `input_json_delta`s, `message_delta` (stop reason, output tokens),
    /// `message_stop`.
    pub fn events(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.words.len() + 10);
        let mut message = self.message();
        message["content"] = json!([]);
        message["stop_reason"] = Value::Null;
        message["usage"] = self.usage(1);
        out.push(event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ));
        let mut index = 0u64;
        if !self.words.is_empty() {
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}}),
            ));
            out.push(event("ping", &json!({"type": "ping"})));
            for w in self.words {
                // In the API's own key order, `type` first (a `Value`
                // writes its keys sorted), as clients and the adapter see
                // a text delta from Anthropic.
                let text = serde_json::to_string(w).unwrap_or_default();
                out.push(format!(
                    "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":{text}}}}}\n\n"
                ));
            }
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
            index += 1;
        }
        if let Some((id, name, input)) = self.tool_use {
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            ));
            let json = input.to_string();
            let mid = json
                .char_indices()
                .nth(json.len() / 2)
                .map_or(0, |(i, _)| i);
            for part in [&json[..mid], &json[mid..]] {
                out.push(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": part}}),
                ));
            }
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        out.push(event(
            "message_delta",
            &json!({"type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": self.output_tokens}}),
        ));
        out.push(event("message_stop", &json!({"type": "message_stop"})));
        out
    }
}

/// One SSE event as Anthropic writes it.
pub fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// A stream's mid-answer `error` event (e.g. `overloaded_error`).
pub fn error_event(status: u16, message: Option<&str>) -> String {
    let message = message.unwrap_or_else(|| fault_message(status));
    event(
        "error",
        &json!({"type": "error", "error": {"type": error_type(status), "message": message}}),
    )
}

/// The head of a streamed answer: 200, `text/event-stream`, `request-id`.
pub fn stream_response(request_id: &str) -> Response<Bytes> {
    let mut resp = reply(
        200,
        "text/event-stream; charset=utf-8",
        Bytes::new(),
        request_id,
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// A non-streamed answer: 200 with the `message` JSON.
pub fn message_response(answer: &Answer<'_>, request_id: &str) -> Response<Bytes> {
    json_reply(200, &answer.message(), request_id)
}

/// `GET /v1/models` (Anthropic's free endpoint, what health probes use).
pub fn models(models: &[String]) -> Value {
    let data: Vec<Value> = models
        .iter()
        .map(|m| {
            json!({"type": "model", "id": m, "display_name": m,
                "created_at": "2025-01-01T00:00:00Z"})
        })
        .collect();
    json!({
        "data": data,
        "has_more": false,
        "first_id": models.first(),
        "last_id": models.last(),
    })
}

/// A path the Messages API does not have: 404 `not_found_error`.
pub fn not_found(request_id: &str) -> Response<Bytes> {
    error_response(404, None, None, request_id, SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests;
