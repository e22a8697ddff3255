//! The rewrite that splices a continuation's events into the stream the
//! client already reads ([`Splice`]), and the event that ends a stream
//! cut short.

use bytes::Bytes;
use serde_json::Value;

use super::*;

/// How a continuation picks up the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumption {
    /// The continuation was asked to go on from the delivered text: every
    /// word it sends is new.
    Prefill,
    /// The continuation regenerates from the start: what the client
    /// already has must come back first, exactly, and is skipped.
    Restart,
}

/// The regenerated text diverged from what the client already has.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch;

/// Rewrites a continuation's events into the stream the client reads.
pub struct Splice {
    how: Resumption,
    /// The text delivered before the seam.
    delivered: String,
    delivered_deltas: u64,
    /// Restart: the text regenerated so far (skipped while it is a prefix
    /// of `delivered`).
    regenerated: String,
    id: Option<String>,
    model: Option<String>,
    created: Option<u64>,
}

impl Splice {
    pub fn new(how: Resumption, t: &Transcript) -> Self {
        Self {
            how,
            delivered: t.text.clone(),
            delivered_deltas: t.deltas,
            regenerated: String::new(),
            id: t.id.clone(),
            model: t.model.clone(),
            created: t.created,
        }
    }

    /// Whether a restart is still re-reading what the client already has.
    pub fn catching_up(&self) -> bool {
        self.how == Resumption::Restart && self.regenerated.len() < self.delivered.len()
    }

    /// One event of the continuation as the client must see it: `None`
    /// when it carries nothing new (a role-only delta, a restart's replay
    /// of delivered text). The transcript is updated with what is sent.
    pub fn rewrite(
        &mut self,
        raw: &Bytes,
        transcript: &mut Transcript,
    ) -> Result<Option<Bytes>, Mismatch> {
        let Some(data) = data_payload(raw) else {
            return Ok(Some(raw.clone()));
        };
        if data.trim_ascii() == b"[DONE]" {
            if self.catching_up() {
                return Err(Mismatch);
            }
            transcript.finished = true;
            return Ok(Some(raw.clone()));
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(data) else {
            return Ok(Some(raw.clone()));
        };
        let content = content_of(&v).map(str::to_owned);
        let finish = finish_of(&v);
        let new_text = match content {
            Some(c) => self.fresh_part(&c)?,
            None => String::new(),
        };
        if finish && self.catching_up() {
            // The regenerated answer ended before reaching the seam.
            return Err(Mismatch);
        }
        let usage = v.get("usage").is_some_and(|u| !u.is_null());
        if new_text.is_empty() && !finish && !usage {
            return Ok(None);
        }
        set_content(&mut v, &new_text);
        self.restore_identity(&mut v);
        if usage {
            self.count_both_parts(&mut v);
            transcript.usage = v
                .get("usage")
                .and_then(|u| serde_json::from_value(u.clone()).ok());
        }
        transcript.append(&new_text);
        transcript.finished |= finish;
        Ok(Some(Bytes::from(format!("data: {v}\n\n"))))
    }

    /// The part of a content delta the client has not seen.
    pub(super) fn fresh_part(&mut self, content: &str) -> Result<String, Mismatch> {
        if self.how == Resumption::Prefill {
            return Ok(content.to_owned());
        }
        let before = self.regenerated.len();
        self.regenerated.push_str(content);
        let seam = self.delivered.len();
        if self.regenerated.len() <= seam {
            return if self.delivered.starts_with(&self.regenerated) {
                Ok(String::new())
            } else {
                Err(Mismatch)
            };
        }
        if before >= seam {
            return Ok(content.to_owned());
        }
        if !self.regenerated.starts_with(&self.delivered) {
            return Err(Mismatch);
        }
        // `delivered` is a prefix of `regenerated`, so `seam` is a char
        // boundary of it and `seam - before` one of `content`.
        Ok(content[seam - before..].to_owned())
    }

    pub(super) fn restore_identity(&self, v: &mut Value) {
        let Some(obj) = v.as_object_mut() else { return };
        if let Some(id) = &self.id {
            obj.insert("id".into(), Value::from(id.as_str()));
        }
        if let Some(model) = &self.model {
            obj.insert("model".into(), Value::from(model.as_str()));
        }
        if let Some(created) = self.created {
            obj.insert("created".into(), Value::from(created));
        }
    }

    /// `usage` of the whole answer: the delivered deltas are added to the
    /// completion; a prefill's prompt included them, so they leave it.
    pub(super) fn count_both_parts(&self, v: &mut Value) {
        let Some(usage) = v.get_mut("usage").and_then(Value::as_object_mut) else {
            return;
        };
        let get = |u: &serde_json::Map<String, Value>, k: &str| u.get(k).and_then(Value::as_u64);
        let (Some(prompt), Some(completion)) =
            (get(usage, "prompt_tokens"), get(usage, "completion_tokens"))
        else {
            return;
        };
        let prompt = match self.how {
            Resumption::Prefill => prompt.saturating_sub(self.delivered_deltas),
            Resumption::Restart => prompt,
        };
        let completion = match self.how {
            Resumption::Prefill => completion + self.delivered_deltas,
            // A restart regenerated the delivered part: its count holds it.
            Resumption::Restart => completion,
        };
        usage.insert("prompt_tokens".into(), prompt.into());
        usage.insert("completion_tokens".into(), completion.into());
        usage.insert("total_tokens".into(), (prompt + completion).into());
    }
}

pub(super) fn first_choice(v: &Value) -> Option<&Value> {
    v.get("choices")?.as_array()?.first()
}

pub(super) fn content_of(v: &Value) -> Option<&str> {
    let c = first_choice(v)?;
    c.get("delta")
        .and_then(|d| d.get("content"))
        .or_else(|| c.get("text"))
        .and_then(Value::as_str)
}

pub(super) fn finish_of(v: &Value) -> bool {
    first_choice(v)
        .and_then(|c| c.get("finish_reason"))
        .is_some_and(|f| !f.is_null())
}

pub(super) fn set_content(v: &mut Value, text: &str) {
    let Some(c) = v
        .get_mut("choices")
        .and_then(Value::as_array_mut)
        .and_then(|a| a.first_mut())
    else {
        return;
    };
    if let Some(delta) = c.get_mut("delta").and_then(Value::as_object_mut) {
        delta.remove("role");
        if delta.contains_key("content") || !text.is_empty() {
            delta.insert("content".into(), text.into());
        }
    } else if c.get("text").is_some() {
        c["text"] = text.into();
    }
}

/// The SSE error event that ends a stream zonegate could not complete.
pub fn error_event(message: &str) -> Bytes {
    let body = crate::dataplane::error::error_body(message, "server_error", "stream_interrupted");
    Bytes::from(format!("data: {body}\n\n"))
}
