//! Anthropic's stream events → OpenAI `chat.completion.chunk` payloads.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::fast::UsageIn;
use super::response::{finish_reason, Usage};
use super::verbatim::events;
use crate::provider::{Notes, TranslateError};

fn malformed(field: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::new(field, reason)
}

/// The OpenAI SSE text of payloads as [`Stream::event`] returns them:
/// `data: <payload>\n\n` each.
pub fn sse(payloads: &[String]) -> String {
    let mut out = String::with_capacity(payloads.iter().map(|p| p.len() + 8).sum());
    for p in payloads {
        out.push_str("data: ");
        out.push_str(p);
        out.push_str("\n\n");
    }
    out
}

#[derive(Deserialize)]
struct TextDelta<'a> {
    index: u64,
    #[serde(borrow)]
    delta: TextDeltaInner<'a>,
}

#[derive(Deserialize)]
struct TextDeltaInner<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Cow<'a, str>,
}

#[derive(Deserialize)]
struct StartEvent<'a> {
    #[serde(borrow)]
    message: StartMessage<'a>,
}

#[derive(Deserialize)]
struct StartMessage<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct DeltaEvent<'a> {
    #[serde(borrow)]
    delta: Option<MessageDelta<'a>>,
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct MessageDelta<'a> {
    #[serde(borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

/// The payloads of whole `data: <payload>\n\n` events (a payload is
/// JSON written without line breaks, or `[DONE]`).
fn payloads(out: &[u8]) -> Vec<String> {
    out.split(|b| *b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data: "))
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// `s` as a JSON string, escaped as serde_json escapes it.
fn push_quoted(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()));
    }
}

/// A content chunk's end after its text: the delta's brace, the chunk's
/// end without a finish reason ([`TAIL_NULL`]) and the blank line.
const CONTENT_TAIL: &[u8] = b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

/// A chunk's end after its delta when it has no finish reason (what
/// `Stream::tail` writes for `None`).
const TAIL_NULL: &[u8] = b",\"logprobs\":null,\"finish_reason\":null}]}";

/// An SSE event's name and its data (its `data:` lines joined by line
/// feeds; borrowed when there is one).
type Fields<'a> = (&'a str, Cow<'a, [u8]>);

/// The [`Fields`] of an event; `None` for an event without data (a
/// comment, a keep-alive).
fn fields(raw: &[u8]) -> Result<Option<Fields<'_>>, TranslateError> {
    let mut name: &[u8] = b"";
    let mut data: Option<Cow<'_, [u8]>> = None;
    let mut start = 0;
    let ends = memchr::memchr_iter(b'\n', raw).chain(std::iter::once(raw.len()));
    for end in ends {
        let line = &raw[std::mem::replace(&mut start, end + 1)..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let (field, value) = match memchr::memchr(b':', line) {
            Some(at) => (&line[..at], &line[at + 1..]),
            None => (line, &b""[..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        match field {
            b"event" => name = value,
            b"data" => {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(prev) => {
                        let mut joined = prev.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        Cow::Owned(joined)
                    }
                })
            }
            _ => {}
        }
    }
    let Some(data) = data else {
        return Ok(None);
    };
    let name = std::str::from_utf8(name)
        .map_err(|_| malformed("event", "an event name that is not UTF-8"))?;
    Ok(Some((name, data)))
}

/// Where the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before `message_start`.
    Waiting,
    Open,
    /// After `message_stop`: `[DONE]` was given.
    Done,
    /// After an `error` event: its OpenAI error payload was given.
    Failed,
}

/// What a content block's deltas become.
#[derive(Debug, Clone, Copy)]
enum Block {
    Text,
    /// The OpenAI `tool_calls[].index` of this `tool_use` block.
    Tool(usize),
    /// Extended thinking: not part of the OpenAI answer.
    Skipped,
}

/// One Anthropic stream being translated, event by event, into the
/// payloads of OpenAI `data:` lines: the role chunk at `message_start`,
/// a content or tool-call chunk per delta, the `finish_reason` chunk at
/// `message_delta`, the usage chunk (when the client asked for
/// `stream_options.include_usage`) and `[DONE]` at `message_stop`; an
/// `error` event becomes OpenAI's error object and ends the stream.
#[derive(Debug, Clone)]
pub struct Stream {
    created: u64,
    model: String,
    include_usage: bool,
    usage: Usage,
    phase: Phase,
    /// (Anthropic block index, what it is), in the order the blocks began.
    blocks: Vec<(u64, Block)>,
    tools: usize,
    finish: Option<&'static str>,
    /// Every chunk's JSON up to its delta, written once per stream (the id
    /// is known at `message_start`): a chunk is this, its delta and a
    /// constant tail, not a `Value` built and written per event.
    prefix: String,
    /// A content chunk's `data:` event up to its text: `data: `, the
    /// prefix and `{"content":`, one copy per delta.
    content_head: String,
    /// The chunk's fields before `choices`, without the closing brace.
    head: String,
    /// What the chunks written since the notes were last cleared say,
    /// once [`Stream::note`] asked for it.
    notes: Option<Notes>,
}

impl Stream {
    /// A stream whose chunks name `client_model` (the model the client
    /// asked for) and carry the current time as `created`.
    pub fn new(client_model: &str, include_usage: bool) -> Self {
        Self::new_at(client_model, include_usage, crate::clock::unix_s())
    }

    /// [`Stream::new`] at `created`, the Unix time in seconds every chunk
    /// carries.
    pub fn new_at(client_model: &str, include_usage: bool, created: u64) -> Self {
        // The chunks' prefix is written at `message_start`, with the id:
        // no chunk is written before it (an `error` event's payload has
        // none).
        Self {
            created,
            model: client_model.to_owned(),
            include_usage,
            usage: Usage::default(),
            phase: Phase::Waiting,
            blocks: Vec::new(),
            tools: 0,
            finish: None,
            prefix: String::new(),
            content_head: String::new(),
            head: String::new(),
            notes: None,
        }
    }

    /// The chunks' prefixes for the message `id`, each string sized once
    /// (grown from empty they were reallocated eight times a stream).
    fn write_prefix(&mut self, id: &str) {
        // Written by hand, not through `Value`'s `Display` or `format!`
        // (several times slower), into the strings of the last prefix;
        // the strings are escaped as serde_json escapes them.
        self.head.clear();
        self.head.reserve(80 + id.len() + self.model.len());
        self.head.push_str("{\"id\":");
        push_quoted(&mut self.head, id);
        self.head
            .push_str(",\"object\":\"chat.completion.chunk\",\"created\":");
        self.head.push_str(itoa::Buffer::new().format(self.created));
        self.head.push_str(",\"model\":");
        push_quoted(&mut self.head, &self.model);
        const CHOICES: &str = ",\"choices\":[{\"index\":0,\"delta\":";
        self.prefix.clear();
        self.prefix.reserve(self.head.len() + CHOICES.len());
        self.prefix.push_str(&self.head);
        self.prefix.push_str(CHOICES);
        self.content_head.clear();
        self.content_head.reserve(self.prefix.len() + 20);
        self.content_head.push_str("data: ");
        self.content_head.push_str(&self.prefix);
        self.content_head.push_str("{\"content\":");
    }

    /// From now on, note what the chunks written say (see [`Notes`]).
    pub fn note(&mut self) {
        self.notes.get_or_insert_with(Notes::default);
    }

    /// What the chunks written since the notes were last cleared say
    /// (`None`: nothing is noted); the reader clears them
    /// ([`Notes::clear`]).
    pub fn notes(&mut self) -> Option<&mut Notes> {
        self.notes.as_mut()
    }

    /// Stop noting.
    pub fn stop_notes(&mut self) {
        self.notes = None;
    }

    /// The token counts seen so far (final after `message_stop`).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The OpenAI `finish_reason` once `message_delta` gave one.
    pub fn finish_reason(&self) -> Option<&'static str> {
        self.finish
    }

    /// `message_stop` or an `error` event was seen: the client's stream is
    /// complete (`[DONE]`) or ended with an error payload.
    pub fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Failed)
    }

    /// An `error` event ended the stream.
    pub fn failed(&self) -> bool {
        self.phase == Phase::Failed
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let mut out = self.prefix.clone();
        out.push_str(&serde_json::to_string(&delta).unwrap_or_default());
        Self::tail(&mut out, finish);
        out
    }

    fn tail(out: &mut String, finish: Option<&str>) {
        out.push_str(",\"logprobs\":null,\"finish_reason\":");
        match finish {
            // Finish reasons are our own constants: no escaping needed.
            Some(f) => {
                out.push('"');
                out.push_str(f);
                out.push('"');
            }
            None => out.push_str("null"),
        }
        out.push_str("}]}");
    }

    fn block(&self, data: &Value) -> Result<(u64, Block), TranslateError> {
        let index = data
            .get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| malformed("index", "missing"))?;
        self.blocks
            .iter()
            .find(|(i, _)| *i == index)
            .copied()
            .ok_or_else(|| malformed("index", format!("no content block {index} was started")))
    }

    /// Translates one Anthropic event (`event` is its `event:` name, `data`
    /// its `data:` bytes) into zero or more OpenAI `data:` payloads: JSON
    /// text, or `[DONE]`. Events after the end are ignored; an event that
    /// contradicts the stream (a delta of a block never started, data that
    /// is not JSON) is an error naming the field, and the caller ends the
    /// client's stream as for a broken upstream.
    pub fn event(&mut self, event: &str, data: &[u8]) -> Result<Vec<String>, TranslateError> {
        if self.finished() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        if self.fast_into(event, data, &mut out) {
            return Ok(payloads(&out));
        }
        self.general(event, data)
    }

    /// [`Stream::event`] the typed way, then the `Value` way: what the
    /// one-pass readers (`Stream::fast_into`) must agree with, and what
    /// reads whatever they do not take.
    pub(super) fn general(
        &mut self,
        event: &str,
        data: &[u8],
    ) -> Result<Vec<String>, TranslateError> {
        if self.finished() {
            return Ok(Vec::new());
        }
        if let Some(out) = self.typed(event, data) {
            return out;
        }
        if matches!(event, "content_block_stop" | "ping") && self.phase == Phase::Open {
            // Nothing for the client; still JSON, or the stream is broken.
            return serde_json::from_slice::<serde::de::IgnoredAny>(data)
                .map(|_| Vec::new())
                .map_err(|e| malformed("data", format!("an event's data is not JSON: {e}")));
        }
        let data: Value = serde_json::from_slice(data)
            .map_err(|e| malformed("data", format!("an event's data is not JSON: {e}")))?;
        // A relay that drops `event:` lines still leaves the data's `type`
        // (`message` is the SSE default name of an event without one).
        let kind = if event.is_empty() || event == "message" {
            data.get("type").and_then(Value::as_str).unwrap_or("")
        } else {
            event
        };
        if self.phase == Phase::Waiting && !matches!(kind, "message_start" | "ping" | "error") {
            return Err(malformed(
                "event",
                format!("`{kind}` before `message_start`"),
            ));
        }
        match kind {
            "message_start" => self.message_start(&data),
            "content_block_start" => self.block_start(&data),
            "content_block_delta" => self.block_delta(&data),
            "message_delta" => {
                if let Some(u) = data.get("usage") {
                    self.usage.update(u);
                }
                match data
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    Some(stop) => {
                        let finish = finish_reason(stop)?;
                        self.finish = Some(finish);
                        Ok(vec![self.chunk(json!({}), Some(finish))])
                    }
                    None => Ok(Vec::new()),
                }
            }
            "message_stop" => {
                self.phase = Phase::Done;
                let mut out = Vec::with_capacity(2);
                if self.include_usage {
                    let usage = serde_json::to_string(&self.usage.openai()).unwrap_or_default();
                    out.push(format!("{},\"choices\":[],\"usage\":{usage}}}", self.head));
                }
                out.push("[DONE]".to_owned());
                Ok(out)
            }
            "error" => {
                self.phase = Phase::Failed;
                let bytes = data.to_string();
                let (_, body) = super::response::error(0, bytes.as_bytes());
                Ok(vec![body.to_string()])
            }
            // `content_block_stop` and `ping` carry nothing for the client;
            // unknown events are skipped, as Anthropic's versioning policy
            // asks of clients ("handle unknown event types gracefully").
            _ => Ok(Vec::new()),
        }
    }

    /// [`Stream::event`] for one whole SSE event as it came off the wire
    /// (what `dataplane::sse::events` yields: `event:` and `data:` lines,
    /// comments, a blank line). Several `data:` lines join with a line
    /// feed, as the SSE standard says; an event without data (a comment,
    /// a keep-alive) gives nothing.
    pub fn sse_event(&mut self, raw: &[u8]) -> Result<Vec<String>, TranslateError> {
        let Some((name, data)) = fields(raw)? else {
            return Ok(Vec::new());
        };
        self.event(name, &data)
    }

    /// [`Stream::sse_event`] written as the client's `data: <payload>\n\n`
    /// events at the end of `out` (what [`sse`] makes of the payloads).
    pub fn sse_event_into(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), TranslateError> {
        let Some((name, data)) = fields(raw)? else {
            return Ok(());
        };
        self.event_into(name, &data, out)
    }

    /// [`Stream::event`] written as [`Stream::sse_event_into`] writes it:
    /// with no allocation for the events of an ordinary stream (their
    /// bytes go to `out` in one pass; see `Stream::fast_into`).
    pub fn event_into(
        &mut self,
        event: &str,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), TranslateError> {
        if self.finished() || self.fast_into(event, data, out) {
            return Ok(());
        }
        if let Some(n) = self.notes.as_mut() {
            n.whole = false;
        }
        for p in self.general(event, data)? {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(p.as_bytes());
            out.extend_from_slice(b"\n\n");
        }
        Ok(())
    }

    /// The events of an ordinary stream, read in one pass
    /// (`verbatim::events`) and written as whole `data:` events at the end
    /// of `out`: `false` (`out` and the stream untouched) for an event
    /// they do not take, which [`Stream::general`] then reads and answers
    /// the same way.
    fn fast_into(&mut self, event: &str, data: &[u8], out: &mut Vec<u8>) -> bool {
        match (event, self.phase) {
            ("content_block_delta", Phase::Open) => self.text_delta_into(data, out),
            ("message_start", Phase::Waiting) => {
                let Some((id, usage)) = events::message_start(data) else {
                    return false;
                };
                if let Some(u) = &usage {
                    self.usage.merge(u);
                }
                self.write_prefix(id);
                self.phase = Phase::Open;
                self.put_chunk(out, b"{\"role\":\"assistant\",\"content\":\"\"}", None);
                if let Some(n) = self.notes.as_mut() {
                    n.identity = Some((id.to_owned(), self.model.clone(), self.created));
                }
                true
            }
            ("content_block_start", Phase::Open) => {
                let Some((index, text)) = events::text_block_start(data) else {
                    return false;
                };
                if self.blocks.iter().any(|(i, _)| *i == index) {
                    return false;
                }
                self.blocks.push((index, Block::Text));
                if !text.is_empty() {
                    self.put_content(out, text.len(), |out| {
                        out.push(b'"');
                        out.extend_from_slice(text);
                        out.push(b'"');
                    });
                    if let Some(n) = self.notes.as_mut() {
                        n.content(text);
                    }
                }
                true
            }
            ("ping" | "content_block_stop", Phase::Open) => events::plain_json(data),
            ("message_delta", Phase::Open) => {
                let Some((stop, usage)) = events::message_delta(data) else {
                    return false;
                };
                let finish = match stop.map(|s| std::str::from_utf8(s).map(finish_reason)) {
                    None => None,
                    Some(Ok(Ok(f))) => Some(f),
                    // Not a reason OpenAI has: the general way names it.
                    Some(_) => return false,
                };
                if let Some(u) = &usage {
                    self.usage.merge(u);
                }
                if let Some(f) = finish {
                    self.finish = Some(f);
                    self.put_chunk(out, b"{}", Some(f));
                    if let Some(n) = self.notes.as_mut() {
                        n.finished = true;
                    }
                }
                true
            }
            ("message_stop", Phase::Open) => {
                if !events::plain_json(data) {
                    return false;
                }
                self.phase = Phase::Done;
                if self.include_usage {
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(self.head.as_bytes());
                    out.extend_from_slice(b",\"choices\":[],\"usage\":");
                    super::verbatim::push_usage(out, &self.usage);
                    out.extend_from_slice(b"}\n\n");
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                if let Some(n) = self.notes.as_mut() {
                    if self.include_usage {
                        n.usage = Some((self.usage.prompt_tokens(), self.usage.output_tokens));
                    }
                    n.finished = true;
                }
                true
            }
            _ => false,
        }
    }

    /// A text block's `text_delta` as a whole `data:` event at the end of
    /// `out`: matched against Anthropic's exact bytes, else read field by
    /// field (`verbatim`), else through typed borrowing structs; `false`
    /// (and `out` untouched) when the event is not a text block's delta of
    /// an expected shape.
    fn text_delta_into(&mut self, data: &[u8], out: &mut Vec<u8>) -> bool {
        if let Some((index, text)) = super::verbatim::text_delta(data) {
            // The text's bytes as they came: the same JSON string.
            if !self.is_text_block(index) {
                return false;
            }
            self.put_content(out, text.len(), |out| {
                out.push(b'"');
                out.extend_from_slice(text);
                out.push(b'"');
            });
            if let Some(n) = self.notes.as_mut() {
                n.content(text);
            }
            return true;
        }
        let Ok(d) = serde_json::from_slice::<TextDelta<'_>>(data) else {
            return false;
        };
        if d.delta.kind != "text_delta" || !self.is_text_block(d.index) {
            return false;
        }
        self.put_content(out, d.delta.text.len(), |out| {
            // Writing a string to a `Vec` cannot fail.
            let _ = serde_json::to_writer(&mut *out, d.delta.text.as_ref());
        });
        if let Some(n) = self.notes.as_mut() {
            n.text(&d.delta.text);
        }
        true
    }

    fn is_text_block(&self, index: u64) -> bool {
        self.blocks
            .iter()
            .any(|(i, b)| *i == index && matches!(b, Block::Text))
    }

    /// A content chunk as a `data:` event: `text` writes its JSON string
    /// (about `len` bytes).
    fn put_content(&self, out: &mut Vec<u8>, len: usize, text: impl FnOnce(&mut Vec<u8>)) {
        out.reserve(self.content_head.len() + len + CONTENT_TAIL.len());
        out.extend_from_slice(self.content_head.as_bytes());
        text(out);
        out.extend_from_slice(CONTENT_TAIL);
    }

    /// A chunk of `delta` (its JSON) and `finish` as a `data:` event.
    fn put_chunk(&self, out: &mut Vec<u8>, delta: &[u8], finish: Option<&str>) {
        out.reserve(self.prefix.len() + delta.len() + 80);
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(delta);
        match finish {
            None => out.extend_from_slice(TAIL_NULL),
            Some(f) => {
                out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":\"");
                out.extend_from_slice(f.as_bytes());
                out.extend_from_slice(b"\"}]}");
            }
        }
        out.extend_from_slice(b"\n\n");
    }

    /// `message_start`, `message_delta` and `message_stop` read through
    /// typed borrowing structs; `None` (not one of them, or not the shape
    /// expected) sends the event the general way, which gives the same
    /// chunks and names the field when something is wrong.
    fn typed(&mut self, event: &str, data: &[u8]) -> Option<Result<Vec<String>, TranslateError>> {
        match event {
            "message_start" if self.phase == Phase::Waiting => {
                let s: StartEvent<'_> = serde_json::from_slice(data).ok()?;
                Some(Ok(self.start(&s.message.id, s.message.usage.as_ref())))
            }
            "message_delta" if self.phase == Phase::Open => {
                let d: DeltaEvent<'_> = serde_json::from_slice(data).ok()?;
                if let Some(u) = &d.usage {
                    self.usage.merge(u);
                }
                Some(match d.delta.and_then(|d| d.stop_reason) {
                    Some(stop) => finish_reason(&stop).map(|finish| {
                        self.finish = Some(finish);
                        vec![self.chunk(json!({}), Some(finish))]
                    }),
                    None => Ok(Vec::new()),
                })
            }
            _ => None,
        }
    }

    fn start(&mut self, id: &str, usage: Option<&UsageIn>) -> Vec<String> {
        if let Some(u) = usage {
            self.usage.merge(u);
        }
        self.write_prefix(id);
        self.phase = Phase::Open;
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    fn message_start(&mut self, data: &Value) -> Result<Vec<String>, TranslateError> {
        if self.phase != Phase::Waiting {
            return Err(malformed("event", "a second `message_start`"));
        }
        let message = data
            .get("message")
            .ok_or_else(|| malformed("message", "missing"))?;
        let id = message
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed("message.id", "missing"))?;
        if let Some(u) = message.get("usage") {
            self.usage.update(u);
        }
        self.write_prefix(id);
        self.phase = Phase::Open;
        Ok(vec![
            self.chunk(json!({"role": "assistant", "content": ""}), None)
        ])
    }

    fn block_start(&mut self, data: &Value) -> Result<Vec<String>, TranslateError> {
        let index = data
            .get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| malformed("index", "missing"))?;
        if self.blocks.iter().any(|(i, _)| *i == index) {
            return Err(malformed(
                "index",
                format!("content block {index} started twice"),
            ));
        }
        let block = data
            .get("content_block")
            .ok_or_else(|| malformed("content_block", "missing"))?;
        let (kind, out) = match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                let out = if text.is_empty() {
                    Vec::new()
                } else {
                    vec![self.chunk(json!({"content": text}), None)]
                };
                (Block::Text, out)
            }
            Some("tool_use") => {
                let get = |k: &str| {
                    block
                        .get(k)
                        .and_then(Value::as_str)
                        .ok_or_else(|| malformed(format!("content_block.{k}"), "missing"))
                };
                let (id, name) = (get("id")?, get("name")?);
                // The input arrives as `input_json_delta`s after an empty
                // `{}`; a provider that sends it whole is passed on whole.
                let args = match block.get("input") {
                    Some(Value::Object(o)) if !o.is_empty() => Value::Object(o.clone()).to_string(),
                    _ => String::new(),
                };
                let k = self.tools;
                self.tools = self.tools.saturating_add(1);
                let delta = json!({"tool_calls": [{
                    "index": k, "id": id, "type": "function",
                    "function": {"name": name, "arguments": args},
                }]});
                (Block::Tool(k), vec![self.chunk(delta, None)])
            }
            Some("thinking" | "redacted_thinking") => (Block::Skipped, Vec::new()),
            _ => {
                return Err(malformed(
                    "content_block.type",
                    "a content block OpenAI's chat.completion.chunk cannot carry",
                ))
            }
        };
        self.blocks.push((index, kind));
        Ok(out)
    }

    fn block_delta(&mut self, data: &Value) -> Result<Vec<String>, TranslateError> {
        let (_, block) = self.block(data)?;
        let delta = data
            .get("delta")
            .ok_or_else(|| malformed("delta", "missing"))?;
        let field = |k: &str| {
            delta
                .get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| malformed(format!("delta.{k}"), "missing"))
        };
        match (delta.get("type").and_then(Value::as_str), block) {
            (Some("text_delta"), Block::Text) => {
                Ok(vec![self.chunk(json!({"content": field("text")?}), None)])
            }
            (Some("input_json_delta"), Block::Tool(k)) => {
                let delta = json!({"tool_calls": [{
                    "index": k, "function": {"arguments": field("partial_json")?},
                }]});
                Ok(vec![self.chunk(delta, None)])
            }
            (Some("thinking_delta" | "signature_delta"), Block::Skipped) => Ok(Vec::new()),
            (kind, _) => Err(malformed(
                "delta.type",
                format!(
                    "`{}` does not belong to this content block",
                    kind.unwrap_or("")
                ),
            )),
        }
    }
}
