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

/// The most text notes hold before they give up describing (the relay
/// takes them after every chunk it reads, and clears them).
const MAX_NOTED_TEXT: usize = 1024 * 1024;

/// The room the notes' text starts with.
const NOTES_FIRST_ROOM: usize = 512;

/// What the OpenAI chunks a stream's translation wrote say, as a reader of
/// those chunks finds it: the first chunk's identity, the text of its
/// content chunks, whether one finished the answer, the usage chunk's
/// counts. The relay takes these instead of reading back the bytes the
/// translation just wrote (`dataplane::relay`). Noted only for chunks the
/// one-pass writer makes (`anthropic::Stream`); a chunk written any other
/// way leaves `whole` false, and the reader reads those chunks itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notes {
    /// Every chunk written since the notes were last taken is described.
    pub whole: bool,
    /// The role chunk's `id`, `model` and `created`.
    pub identity: Option<(String, String, u64)>,
    /// The content chunks' text, decoded, joined.
    pub text: String,
    /// Content chunks with text (one token each, about).
    pub deltas: u64,
    /// A chunk with a `finish_reason`, or `[DONE]`, was written.
    pub finished: bool,
    /// The usage chunk's `prompt_tokens` and `completion_tokens`.
    pub usage: Option<(u64, u64)>,
}

impl Default for Notes {
    fn default() -> Self {
        Self {
            whole: true,
            identity: None,
            text: String::new(),
            deltas: 0,
            finished: false,
            usage: None,
        }
    }
}

impl Notes {
    /// Taken: the next chunks' notes start afresh (the text's room kept).
    pub fn clear(&mut self) {
        self.whole = true;
        self.identity = None;
        self.text.clear();
        self.deltas = 0;
        self.finished = false;
        self.usage = None;
    }

    /// A content chunk's text, as the JSON string's bytes between its
    /// quotes: decoded as a JSON reader decodes it (not described when it
    /// cannot be, which a reader of the chunk then finds out itself).
    pub fn content(&mut self, quoted: &[u8]) {
        if quoted.is_empty() || !self.whole {
            return;
        }
        if !quoted.contains(&b'\\') {
            match std::str::from_utf8(quoted) {
                Ok(text) => self.text(text),
                Err(_) => self.whole = false,
            }
            return;
        }
        let mut json = Vec::with_capacity(quoted.len() + 2);
        json.push(b'"');
        json.extend_from_slice(quoted);
        json.push(b'"');
        match serde_json::from_slice::<String>(&json) {
            Ok(text) => self.text(&text),
            Err(_) => self.whole = false,
        }
    }

    /// A content chunk's text, decoded.
    pub fn text(&mut self, text: &str) {
        if text.is_empty() || !self.whole {
            return;
        }
        if self.text.len() + text.len() > MAX_NOTED_TEXT {
            // Nobody took the notes: let them go.
            self.whole = false;
            self.text = String::new();
            return;
        }
        self.deltas += 1;
        if self.text.capacity() == 0 {
            // Room for a chunk's worth of tokens at once: grown from
            // empty, a stream's notes were reallocated five times.
            self.text.reserve(text.len().max(NOTES_FIRST_ROOM));
        }
        self.text.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_nobody_takes_give_up_past_their_limit_whichever_way_the_text_came() {
        let big = "x".repeat(MAX_NOTED_TEXT / 2 + 1);
        for quoted in [false, true] {
            let mut n = Notes::default();
            for _ in 0..2 {
                if quoted {
                    n.content(format!("{big}\\n").as_bytes());
                } else {
                    n.text(&big);
                }
            }
            assert!(!n.whole, "{quoted}");
            assert!(n.text.is_empty() && n.deltas == 1, "{quoted}");
            n.clear();
            n.text("a");
            assert!(n.whole && n.text == "a" && n.deltas == 1);
        }
    }
}
