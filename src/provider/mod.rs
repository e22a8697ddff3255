//! Commercial LLM APIs behind the OpenAI wire format the clients speak:
//! the adapters that translate a chat request, its answer, its stream and
//! its errors to and from a provider's own format. Pure functions over
//! JSON values and bytes: no I/O, no clock but where a `*_at` variant takes
//! the time as a parameter, and no panic on any input.

pub mod anthropic;

/// A part of an OpenAI request (or of a provider's answer) that has no
/// faithful translation: answered as a 400 that names the field, never a
/// silently dropped parameter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct TranslateError {
    /// The JSON path of the field, e.g. `logprobs` or `messages[2].content[0].type`.
    pub field: String,
    /// Why it cannot be translated, in words a client can act on.
    pub reason: String,
}

impl TranslateError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The OpenAI error body for the client's 400: `type`
    /// `invalid_request_error`, `param` the field, `code` `unsupported_parameter`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.to_string(),
            "type": "invalid_request_error",
            "param": self.field,
            "code": "unsupported_parameter",
        }})
    }
}
