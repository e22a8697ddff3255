//! Anthropic's Messages API behind OpenAI's chat completions: a request
//! ([`request`]), its answer ([`response`]), its stream ([`Stream`], one
//! event or one whole SSE event off the wire with [`Stream::sse_event`])
//! and its errors ([`error`]). The request path calls the bytes-to-bytes
//! [`request_bytes`] and [`response_bytes`]: the same translation without
//! a `serde_json::Value` for the common shapes (a third of the
//! instructions). The guide's page `providers-anthropic.md` has the same
//! tables for users, and the costs.
//!
//! # Request fields (OpenAI → Anthropic)
//!
//! A field that is `null` counts as absent. Anything not in this table is
//! refused: a [`TranslateError`] naming it, a 400 for the client.
//!
//! | OpenAI | Anthropic |
//! |---|---|
//! | `model` | replaced by the backend's upstream model |
//! | `messages`: `system`, `developer` | `system` (one string, or text blocks when several) |
//! | `messages`: `user`, `assistant` | turns; consecutive same-role turns merged into one |
//! | `messages`: `tool` (`tool_call_id`, `content`) | `tool_result` blocks in a user turn |
//! | assistant `tool_calls` | `tool_use` blocks (`arguments` parsed; must be a JSON object) |
//! | assistant `refusal` / refusal parts | text |
//! | content part `text` | text block |
//! | content part `image_url` (data: URL of jpeg/png/gif/webp; http(s) URL) | image block (`base64` / `url` source); `detail` is accepted and not sent (no counterpart) |
//! | content part `file` with PDF `file_data` | document block |
//! | content part `input_audio`, `file` by id, message `name` | refused |
//! | `max_completion_tokens`, else `max_tokens` | `max_tokens` (the backend's default when absent) |
//! | `temperature` 0–1 | `temperature` (above 1 refused: Anthropic's range is 0–1) |
//! | `top_p` | `top_p` |
//! | `stop` (string or list) | `stop_sequences` |
//! | `stream` | `stream` |
//! | `stream_options.include_usage` | nothing sent (Anthropic always reports usage); [`Stream`] adds the usage chunk |
//! | `tools` (`function`; `strict` false) | `tools` (`parameters` → `input_schema`) |
//! | `tool_choice` `auto` / `none` / `required` / named | `auto` / `none` / `any` / `tool` |
//! | `parallel_tool_calls: false` | `tool_choice.disable_parallel_tool_use` |
//! | `user` | `metadata.user_id` |
//! | `n` 1, `logprobs` false, `presence_penalty`/`frequency_penalty` 0, `logit_bias` {}, `response_format` text, `store` false, `modalities` \["text"\], `service_tier` auto/default | accepted (the default), not sent |
//! | any other value of those; `top_logprobs`, `seed`, `metadata`, `reasoning_effort`, `audio`, `prediction`, `web_search_options`, `functions`, `function_call`, `strict` tools, unknown fields | refused |
//!
//! # Answer
//!
//! | Anthropic | OpenAI `chat.completion` |
//! |---|---|
//! | `id` | `id` |
//! | text blocks | `message.content` (concatenated; null when only tool calls) |
//! | `tool_use` blocks | `message.tool_calls` (`input` as a JSON string) |
//! | `thinking` blocks | left out (never asked for) |
//! | `stop_reason` `end_turn`, `stop_sequence` | `finish_reason` `stop` |
//! | `max_tokens`, `model_context_window_exceeded` | `length` |
//! | `tool_use` | `tool_calls` |
//! | `refusal` | `content_filter` |
//! | `usage.input_tokens` + cache creation + cache reads | `usage.prompt_tokens` (cache reads as `prompt_tokens_details.cached_tokens`) |
//! | `usage.output_tokens` | `usage.completion_tokens` |
//!
//! Errors keep their meaning, not always their status: 529
//! `overloaded_error` → 503 (`overloaded`), 429 → 429, 401/403 → 502
//! `upstream_credentials` (the gateway's key, not the client's), a too-long
//! prompt → 400 `context_length_exceeded`.

mod fast;
mod request;
mod response;
mod stream;
mod verbatim;

pub use super::TranslateError;
pub use fast::{answer_bytes, request_bytes, response_bytes, Translated};
pub use response::{response_at, Usage};
pub use stream::{sse, Stream};

/// Translates an OpenAI chat completions request body into an Anthropic
/// Messages API request for `upstream_model`, with `default_max_tokens`
/// when the client sent no limit (Anthropic requires one). Refuses, naming
/// the field, whatever it cannot translate faithfully (the table above).
pub fn request(
    openai_body: &serde_json::Value,
    upstream_model: &str,
    default_max_tokens: u32,
) -> Result<serde_json::Value, TranslateError> {
    request::request(openai_body, upstream_model, default_max_tokens)
}

/// Translates an Anthropic Messages API answer into an OpenAI
/// `chat.completion` naming `client_model`, created now. An error here
/// means the provider's answer is malformed (a 502 for the client, not a
/// 400).
pub fn response(
    anthropic_body: &serde_json::Value,
    client_model: &str,
) -> Result<serde_json::Value, TranslateError> {
    response_at(anthropic_body, client_model, crate::clock::unix_s())
}

/// Translates an Anthropic error answer (`status`, raw body, which may be
/// anything) into the status and OpenAI error body the client receives.
pub fn error(status: u16, body: &[u8]) -> (u16, serde_json::Value) {
    response::error(status, body)
}

#[cfg(test)]
mod tests;
