//! One event read: its `data:` payload, the chunk it carries
//! ([`parse`] into an [`Event`]), and the `usage` a stream or a whole body
//! reports.

use std::borrow::Cow;
use std::sync::OnceLock;

use bytes::Bytes;
use memchr::memmem::{Finder, FinderRev};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use super::*;

/// One OpenAI streaming chunk, as far as continuation needs it.
#[derive(Deserialize)]
pub struct Chunk<'a> {
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub model: Option<Cow<'a, str>>,
    pub created: Option<u64>,
    #[serde(default, borrow)]
    pub choices: Vec<Choice<'a>>,
    pub usage: Option<Usage>,
}

/// OpenAI's `usage` object, as far as metrics need it.
#[derive(Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
}

/// The `usage` of a whole (non-streaming) JSON response body, if it has one.
///
/// Servers write `usage` after the answer, last or followed by a few small
/// members (vLLM's `prompt_logprobs`, OpenAI's `system_fingerprint`), so it
/// is looked for from the end and only what follows it is read: the
/// answer's text is not parsed twice. Any other shape is parsed whole. As
/// in [`events_usage`], a body without the text `"usage"` has none (a key
/// spelled with `\u` escapes is not looked for).
pub fn body_usage(body: &[u8]) -> Option<Usage> {
    let at = last_usage_key(body)?;
    // An escaped quote is inside a string; an unescaped one followed by
    // `usage"` opens a string (a closing quote is never followed by a
    // letter in JSON).
    let backslashes = body[..at].iter().rev().take_while(|b| **b == b'\\').count();
    let read = (backslashes % 2 == 0)
        .then(|| skim::usage_at_end(body, at + USAGE_KEY.len()))
        .flatten();
    read.unwrap_or_else(|| whole_body_usage(body))
}

/// Where the last `"usage"` in `body` starts. Looked for forward in the
/// body's tail first, where a server writes it (a forward search is the
/// vectorised one), then backward through the rest.
pub(super) fn last_usage_key(body: &[u8]) -> Option<usize> {
    const TAIL: usize = 512;
    let from = body.len().saturating_sub(TAIL);
    if let Some(at) = keys().usage.find_iter(&body[from..]).last() {
        return Some(from + at);
    }
    if from == 0 {
        return None;
    }
    // One that starts before the tail and ends in it was not found there.
    let before = (from + USAGE_KEY.len() - 1).min(body.len());
    keys().last_usage.rfind(&body[..before])
}

/// The top-level `usage` of `body` by a full parse.
pub(super) fn whole_body_usage(body: &[u8]) -> Option<Usage> {
    #[derive(Deserialize)]
    struct Body {
        usage: Option<Usage>,
    }
    serde_json::from_slice::<Body>(body).ok()?.usage
}

#[derive(Deserialize)]
pub struct Choice<'a> {
    #[serde(default)]
    pub index: u64,
    #[serde(borrow)]
    pub delta: Option<Delta<'a>>,
    /// `/v1/completions` streams `text` instead of a delta.
    #[serde(borrow)]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
    pub logprobs: Option<Value>,
}

#[derive(Deserialize)]
pub struct Delta<'a> {
    #[serde(borrow)]
    pub content: Option<Cow<'a, str>>,
    pub tool_calls: Option<IgnoredAny>,
    pub function_call: Option<IgnoredAny>,
}

impl Choice<'_> {
    pub(super) fn content(&self) -> Option<&str> {
        self.delta
            .as_ref()
            .and_then(|d| d.content.as_deref())
            .or(self.text.as_deref())
    }

    /// Anything but plain text: tool calls or log probabilities cannot be
    /// re-created by a continuation.
    pub(super) fn beyond_text(&self) -> bool {
        self.delta
            .as_ref()
            .is_some_and(|d| d.tool_calls.is_some() || d.function_call.is_some())
            || self.logprobs.as_ref().is_some_and(|l| !l.is_null())
            || self.index != 0
    }
}

/// What one event says.
pub enum Event<'a> {
    /// `data: [DONE]`.
    Done,
    Data(Chunk<'a>),
    /// A `data:` object with an `error` key: the backend gave up.
    Error,
    /// A `data:` payload that is not JSON.
    Malformed,
    /// Comments, keep-alives, `event:`/`id:`/`retry:` lines only.
    Other,
}

/// Reads one event (as [`events`] yields it).
pub fn parse(event: &[u8]) -> Event<'_> {
    let Some(data) = data_payload(event) else {
        return Event::Other;
    };
    if data.trim_ascii() == b"[DONE]" {
        return Event::Done;
    }
    #[derive(Deserialize)]
    struct ErrorProbe {
        error: Option<IgnoredAny>,
    }
    match serde_json::from_slice::<Chunk<'_>>(data) {
        Ok(chunk) => {
            if serde_json::from_slice::<ErrorProbe>(data).is_ok_and(|p| p.error.is_some()) {
                Event::Error
            } else {
                Event::Data(chunk)
            }
        }
        Err(_) if serde_json::from_slice::<ErrorProbe>(data).is_ok_and(|p| p.error.is_some()) => {
            Event::Error
        }
        Err(_) => Event::Malformed,
    }
}

/// The `usage` a run of whole events carries (a stream's final usage
/// chunk), if any: one substring search first, so the chunks without it
/// (all but the last) cost no parse. For streams without a transcript
/// (not continuable), whose events are otherwise passed on unread.
pub fn events_usage(whole: &Bytes) -> Option<Usage> {
    keys().usage.find(whole)?;
    events(whole)
        .filter_map(|e| data_payload(&e).and_then(body_usage))
        .last()
}

/// The payload of an event's single `data:` line (OpenAI-style servers
/// send one per event); `None` for events without data.
pub(super) fn data_payload(event: &[u8]) -> Option<&[u8]> {
    data_span(event).map(|span| &event[span])
}

/// Where [`data_payload`] lies in the event.
pub(super) fn data_span(event: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    while start <= event.len() {
        let end = memchr::memchr(b'\n', &event[start..]).map_or(event.len(), |i| start + i);
        let line = &event[start..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            let from = start + 5 + usize::from(rest.first() == Some(&b' '));
            return Some(from..start + line.len());
        }
        start = end + 1;
    }
    None
}

/// The `"usage"` searchers, each built once.
pub(super) struct Keys {
    usage: Finder<'static>,
    /// `"usage"` searched from the end (a body's own usage is its last).
    last_usage: FinderRev<'static>,
}

pub(super) const USAGE_KEY: &[u8] = b"\"usage\"";

pub(super) fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys {
        usage: Finder::new(USAGE_KEY),
        last_usage: FinderRev::new(USAGE_KEY),
    })
}
