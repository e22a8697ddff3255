//! The Anthropic side of the seam: the request translated before it is
//! sent, the answer after it came (`crate::provider::anthropic` does the
//! translating; this file frames the bytes around it).

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use super::{Answer, Call, CallBody, Refused};
use crate::config::ProviderConfig;
use crate::dataplane::sse::Usage;
use crate::dataplane::upstream::Translate;
use crate::provider::{anthropic, Notes};

/// The Messages API request for an OpenAI chat request (the translator's
/// byte-level fast path, which falls back to the full translation).
pub(super) fn prepare<'a>(
    cfg: &'a ProviderConfig,
    body: Bytes,
    upstream_model: &str,
    client_model: &'a str,
) -> Result<Call<'a>, Refused> {
    let t =
        anthropic::request_bytes(&body, upstream_model, cfg.default_max_tokens).map_err(|e| {
            Refused {
                field: e.field,
                reason: e.reason,
            }
        })?;
    Ok(Call {
        cfg,
        path: Cow::Borrowed("/v1/messages"),
        body: CallBody::Translated(t.body),
        answer: Answer::Anthropic {
            client_model,
            stream: t.stream,
            include_usage: t.include_usage,
        },
    })
}

/// A whole Anthropic answer as OpenAI's `chat.completion`, and its usage
/// when the translation read it (`None`: the body says it); `Err` when
/// the answer is not one (the attempt fails as a broken backend's would).
pub fn answer(body: &[u8], client_model: &str) -> Result<(Bytes, Option<Usage>), String> {
    anthropic::answer_bytes(body, client_model, crate::clock::unix_s())
        .map(|(out, usage)| {
            let usage = usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens(),
                completion_tokens: u.output_tokens,
            });
            (Bytes::from(out), usage)
        })
        .map_err(|e| format!("the provider's answer: {e}"))
}

/// An Anthropic error answer as OpenAI's error shape, with the status the
/// client gets.
pub fn error(status: u16, body: &[u8]) -> (u16, Bytes) {
    let (status, v) = anthropic::error(status, body);
    (status, Bytes::from(v.to_string()))
}

/// The largest event an Anthropic stream may send (a tool call's whole
/// input arrives in deltas, so events stay small).
const MAX_EVENT: usize = 1024 * 1024;

/// The room the client's chunks are cut from, at least (a few chunks of a
/// paced stream, or one read's worth).
const GIVEN_ROOM: usize = 4096;

/// An Anthropic event stream, read as it arrives and given on as OpenAI
/// `data:` events (`upstream::UpstreamBody` calls it per chunk).
pub struct Events {
    buf: Vec<u8>,
    /// The client's bytes of the chunk being translated (kept: no
    /// allocation per chunk).
    out: Vec<u8>,
    /// Where the chunks given on are cut from: once the client's
    /// connection has written and dropped the chunks cut from it, its
    /// room is used again (`BytesMut::try_reclaim`), instead of a `malloc`
    /// and `free` per chunk.
    given: BytesMut,
    /// How much of `buf` was searched for an event's end already: a long
    /// event trickled in small chunks is searched once, not once per chunk.
    searched: usize,
    stream: anthropic::Stream,
}

impl Events {
    /// What the client's chunks say is noted from the start (the relay
    /// takes the notes, or stops them: `Translate::notes`).
    pub fn new(client_model: &str, include_usage: bool) -> Self {
        let mut stream = anthropic::Stream::new(client_model, include_usage);
        stream.note();
        Self {
            buf: Vec::new(),
            out: Vec::new(),
            given: BytesMut::new(),
            searched: 0,
            stream,
        }
    }
}

/// One whole event (its lines, without the blank line that ended it), its
/// OpenAI events appended to `out`.
fn event(stream: &mut anthropic::Stream, raw: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    stream
        .sse_event_into(raw, out)
        .map_err(|e| format!("the provider's stream: {e}"))
}

/// The first event in `buf` when it has Anthropic's two lines and no
/// more (`event: NAME\ndata: DATA\n\n`, line feeds only): its name, its
/// data and the length with the blank line after it. Two line searches
/// instead of [`event_end`]'s and `Stream::sse_event_into`'s; any other
/// shape, or an event not yet whole, is theirs.
fn two_lines(buf: &[u8]) -> Option<(&str, &[u8], usize)> {
    const EVENT: &[u8] = b"event: ";
    const DATA: &[u8] = b"data: ";
    let rest = buf.strip_prefix(EVENT)?;
    // The hot event's name is compared, not searched for (a line search
    // costs ~90 instructions on a short line).
    const DELTA: &[u8] = b"content_block_delta\n";
    let name_end = if rest.starts_with(DELTA) {
        DELTA.len() - 1
    } else {
        memchr::memchr(b'\n', rest)?
    };
    let name = &rest[..name_end];
    if name.last() == Some(&b'\r') {
        return None;
    }
    let rest = rest[name_end + 1..].strip_prefix(DATA)?;
    let data_end = memchr::memchr(b'\n', rest)?;
    let data = &rest[..data_end];
    if data.last() == Some(&b'\r') || rest.get(data_end + 1) != Some(&b'\n') {
        return None;
    }
    let name = match name {
        // Anthropic's events by their constant names (no UTF-8 check).
        b"content_block_delta" => "content_block_delta",
        b"message_start" => "message_start",
        b"content_block_start" => "content_block_start",
        b"content_block_stop" => "content_block_stop",
        b"message_delta" => "message_delta",
        b"message_stop" => "message_stop",
        b"ping" => "ping",
        other => std::str::from_utf8(other).ok()?,
    };
    Some((
        name,
        data,
        EVENT.len() + name_end + 1 + DATA.len() + data_end + 2,
    ))
}

/// Where the first event in `buf` ends: (its length, the length with the
/// blank line after it); the search starts at `from` (a line end before it
/// is known not to end an event).
fn event_end(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
    while let Some(off) = buf.get(i..).and_then(|b| memchr::memchr(b'\n', b)) {
        let nl = i + off;
        let rest = &buf[nl + 1..];
        if rest.first() == Some(&b'\n') {
            return Some((nl, nl + 2));
        }
        if rest.starts_with(b"\r\n") {
            return Some((nl, nl + 3));
        }
        i = nl + 1;
    }
    None
}

impl Translate for Events {
    fn data(&mut self, data: &[u8]) -> Result<Bytes, String> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let translated = self.translate(data, &mut out);
        let given = self.give(&out);
        self.out = out;
        translated.map(|()| given)
    }

    fn notes(&mut self) -> Option<&mut Notes> {
        self.stream.notes()
    }

    fn stop_notes(&mut self) {
        self.stream.stop_notes();
    }

    fn end(&mut self) -> Result<Bytes, String> {
        let rest = std::mem::take(&mut self.buf);
        self.searched = 0;
        let mut out = Vec::new();
        if !rest.iter().all(u8::is_ascii_whitespace) {
            event(&mut self.stream, &rest, &mut out)?;
        }
        Ok(Bytes::from(out))
    }
}

impl Events {
    /// The client's bytes as a chunk of their own (see `given`).
    fn give(&mut self, out: &[u8]) -> Bytes {
        if out.is_empty() {
            return Bytes::new();
        }
        if self.given.capacity() < out.len() && !self.given.try_reclaim(out.len()) {
            // Chunks still in flight hold the old room: a new one, which
            // the next chunks are cut from too (grown a chunk at a time,
            // the room was copied and reallocated for each).
            self.given = BytesMut::with_capacity(out.len().max(GIVEN_ROOM));
        }
        self.given.extend_from_slice(out);
        self.given.split().freeze()
    }

    /// The whole events of `data` (and of what was kept before it)
    /// translated into `out`; an unfinished last event is kept.
    fn translate(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        // An OpenAI chunk is about one and a half times the Anthropic
        // event it comes from: room for all of them at once.
        out.reserve(data.len().saturating_mul(2));
        if self.buf.is_empty() {
            // The usual chunk, whole events: read where it lies, and only
            // an unfinished last event is kept.
            let mut start = 0;
            loop {
                if let Some((name, body, next)) = two_lines(&data[start..]) {
                    self.stream
                        .event_into(name, body, out)
                        .map_err(|e| format!("the provider's stream: {e}"))?;
                    start += next;
                    continue;
                }
                let Some((len, next)) = event_end(&data[start..], 0) else {
                    break;
                };
                event(&mut self.stream, &data[start..start + len], out)?;
                start += next;
            }
            self.buf.extend_from_slice(&data[start..]);
        } else {
            // An event's end ("\n\n" or "\n\r\n") may straddle the old
            // bytes and the new: the search resumes two bytes back.
            let mut from = self.searched.saturating_sub(2);
            self.buf.extend_from_slice(data);
            let mut start = 0;
            while let Some((len, next)) = event_end(&self.buf[start..], from) {
                event(&mut self.stream, &self.buf[start..start + len], out)?;
                start += next;
                from = 0;
            }
            self.buf.drain(..start);
        }
        self.searched = self.buf.len();
        if self.buf.len() > MAX_EVENT {
            return Err(format!(
                "the provider's stream sent an event over {MAX_EVENT} bytes"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_found_whatever_the_chunks_and_line_ends() {
        assert_eq!(event_end(b"event: a\ndata: 1\n\nrest", 0), Some((16, 18)));
        assert_eq!(event_end(b"event: a\r\ndata: 1\r\n\r\n", 0), Some((18, 21)));
        assert_eq!(event_end(b"event: a\ndata: 1\n", 0), None);
        assert_eq!(event_end(b"event: a\ndata: 1\n\n", 15), Some((16, 18)));
    }

    #[test]
    fn two_line_events_are_framed_in_one_pass_and_anything_else_is_left() {
        assert_eq!(
            two_lines(b"event: ping\ndata: {}\n\nrest"),
            Some(("ping", &b"{}"[..], 22))
        );
        for odd in [
            &b"event: ping\r\ndata: {}\r\n\r\n"[..],
            b"event: ping\ndata: {}\n",
            b"event: ping\ndata: {}",
            b"event: ping\ndata: {}\r\n\n",
            b"event: ping\ndata: {}\n\r\n",
            b": c\nevent: ping\ndata: {}\n\n",
            b"event: ping\nid: 1\ndata: {}\n\n",
            b"event: ping\ndata: a\ndata: b\n\n",
            b"data: {}\n\n",
            b"event:ping\ndata: {}\n\n",
            b"event: p\xffng\ndata: {}\n\n",
        ] {
            assert_eq!(two_lines(odd), None, "{}", String::from_utf8_lossy(odd));
        }
    }

    #[test]
    fn an_anthropic_stream_split_anywhere_gives_the_same_openai_events() {
        let text = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
                    event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
                    event: ping\ndata: {\"type\":\"ping\"}\n\n\
                    event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
                    event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
                    event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n\
                    event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let whole = {
            let mut e = Events::new("m", true);
            let mut out = e.data(text.as_bytes()).expect("whole").to_vec();
            out.extend_from_slice(&e.end().expect("end"));
            String::from_utf8(out).expect("utf8")
        };
        assert!(whole.contains("\"content\":\"Hi\""), "{whole}");
        assert!(whole.ends_with("data: [DONE]\n\n"), "{whole}");
        for size in [1, 7, 64] {
            let mut e = Events::new("m", true);
            let mut out = Vec::new();
            for chunk in text.as_bytes().chunks(size) {
                out.extend_from_slice(&e.data(chunk).expect("chunk"));
            }
            out.extend_from_slice(&e.end().expect("end"));
            // `created` may differ by a second between the two streams.
            let strip = |s: &str| {
                s.split("\"created\":")
                    .map(|p| p.trim_start_matches(|c: char| c.is_ascii_digit()))
                    .collect::<String>()
            };
            assert_eq!(
                strip(&String::from_utf8(out).expect("utf8")),
                strip(&whole),
                "{size}"
            );
        }
    }

    /// The transcripts a relay keeps of one stream cut in pieces of
    /// `size`: by reading every chunk the translation gives, and by taking
    /// its notes (reading only the chunks they do not describe); and how
    /// many chunks the notes described. Both stop at an error event, as
    /// the relay stops reading there.
    fn transcripts(stream: &str, size: usize, include_usage: bool) -> (String, String, usize) {
        use crate::dataplane::sse::{self, Event, Transcript};
        let read = |t: &mut Transcript, out: &Bytes| {
            for event in sse::events(out) {
                match sse::parse(&event) {
                    Event::Error | Event::Malformed => return false,
                    e => t.observe(&e),
                }
            }
            true
        };
        let mut e = Events::new("m\u{e9}", include_usage);
        let (mut reading, mut noting, mut noted) = (Transcript::new(), Transcript::new(), 0);
        let pieces = stream.as_bytes().chunks(size).map(Some);
        for piece in pieces.chain([None]) {
            let out = match piece {
                Some(p) => e.data(p),
                None => e.end(),
            };
            let Ok(out) = out else {
                break;
            };
            let read_on = read(&mut reading, &out);
            match e.notes() {
                Some(n) if n.whole => {
                    noting.note(n);
                    n.clear();
                    noted += usize::from(!out.is_empty());
                }
                n => {
                    if let Some(n) = n {
                        n.clear();
                    }
                    read(&mut noting, &out);
                }
            }
            if !read_on {
                break;
            }
        }
        (format!("{reading:?}"), format!("{noting:?}"), noted)
    }

    const START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1,\"cache_read_input_tokens\":2}}}\n\n";
    const STOP: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n\
                        event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    fn text_block(index: u64, first: &str, deltas: &[&str]) -> String {
        let mut s = format!("event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"text\",\"text\":\"{first}\"}}}}\n\nevent: ping\ndata: {{\"type\":\"ping\"}}\n\n");
        for d in deltas {
            s.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":\"{d}\"}}}}\n\n"));
        }
        s.push_str(&format!("event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{index}}}\n\n"));
        s
    }

    #[test]
    fn the_notes_of_a_translation_say_what_reading_its_chunks_finds() {
        let plain = format!("{START}{}{STOP}", text_block(0, "", &["Hi", " there", ""]));
        let escaped = format!(
            "{START}{}{STOP}",
            text_block(
                0,
                "So: ",
                &[
                    "a\\nb",
                    "\\\"q\\\" \\u00e9\\ud83d\\ude00",
                    "h\u{e9}llo \u{2713}",
                    "\\\\"
                ]
            )
        );
        let tool = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}}\n\n\
                    event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n\
                    event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n";
        let with_tool = format!("{START}{}{tool}{STOP}", text_block(0, "", &["Let me see."]));
        let thinking = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n\
                        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n\
                        event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
        let with_thinking = format!("{START}{thinking}{}{STOP}", text_block(1, "", &["Yes."]));
        let error = format!(
            "{START}{}event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}}}\n\n",
            text_block(0, "", &["Hal"])
        );
        // Another key order: the field reader's and the typed ways.
        let reordered = format!(
            "{START}{}event: content_block_delta\ndata: {{\"delta\":{{\"text\":\"f\\u00fcr\",\"type\":\"text_delta\"}},\"index\":0,\"type\":\"content_block_delta\"}}\n\n\
             event: content_block_delta\ndata: {{\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"x\",\"extra\":[1,{{\"a\":null}}]}},\"type\":\"content_block_delta\"}}\n\n{STOP}",
            text_block(0, "", &["a"])
        );
        let no_end = format!("{START}{}", text_block(0, "", &["cut"]));
        for stream in [
            &plain,
            &escaped,
            &with_tool,
            &with_thinking,
            &error,
            &reordered,
            &no_end,
        ] {
            for size in [1, 3, 7, 64, 100_000] {
                for usage in [false, true] {
                    let (reading, noting, _) = transcripts(stream, size, usage);
                    assert_eq!(noting, reading, "{size} {usage}\n{stream}");
                }
            }
        }
        // The plain stream, whole: every chunk described by the notes.
        let (reading, _, noted) = transcripts(&plain, 100_000, true);
        assert_eq!(noted, 1, "{reading}");
        assert!(reading.contains("text: \"Hi there\""), "{reading}");
        assert!(
            reading.contains("usage: Some(Usage { prompt_tokens: 7, completion_tokens: 7 })"),
            "{reading}"
        );
    }

    #[test]
    fn a_long_event_trickled_byte_by_byte_is_read_once() {
        let text = "x".repeat(200_000);
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
                     event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
        let long = format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\r\n\r\n");
        let mut e = Events::new("m", false);
        let mut out = e.data(start.as_bytes()).expect("start").to_vec();
        // Searched once in all (a search from the start per byte would
        // scan 2·10¹⁰ bytes here).
        for b in long.as_bytes().chunks(1) {
            out.extend_from_slice(&e.data(b).expect("byte"));
        }
        let out = String::from_utf8(out).expect("utf8");
        assert!(out.contains(&text), "the long delta is given on whole");
        assert_eq!(e.searched, 0, "nothing is left over");
    }

    #[test]
    fn a_stream_that_contradicts_itself_fails_instead_of_guessing() {
        let mut e = Events::new("m", false);
        let bad = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":9,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n";
        assert!(e.data(bad.as_bytes()).is_err());
        let mut e = Events::new("m", false);
        assert!(
            e.data(&vec![b'x'; MAX_EVENT + 1]).is_err(),
            "an endless event"
        );
    }
}
