//! Server-sent events as the relay sees them (pure, no I/O): whole events
//! only, so a cut never leaves half an event at the client; the text a
//! client has been given so far; and the rewrite that splices a
//! continuation's events into the stream the client already reads.
//! Framing into whole events is this file's; reading one event is
//! `event`, the text given so far `transcript`, the splice `splice`, the
//! cheap look `skim`.

use bytes::{Bytes, BytesMut};

mod event;
mod skim;
mod splice;
mod transcript;

pub use event::{body_usage, events_usage, parse, Choice, Chunk, Delta, Event, Usage};
use event::{data_payload, data_span};
pub use skim::{skim, Skim, Skimmer};
pub use splice::{error_event, Mismatch, Resumption, Splice};
pub use transcript::{Transcript, MAX_TRANSCRIPT_BYTES};

/// An event larger than this (with no boundary in sight) is not an LLM
/// token stream: the relay treats it as malformed rather than buffer it.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Cuts a byte stream into whole events. A chunk that ends on an event
/// boundary while nothing is held passes through without a copy (the
/// usual case: servers write one event per chunk). What is held is
/// looked at once: each chunk is searched for a boundary from where the
/// last search ended (less the three bytes a boundary may begin in), so
/// an event trickled a byte at a time costs linear work, not a search of
/// everything held per byte.
#[derive(Default)]
pub struct Framer {
    tail: BytesMut,
    /// Bytes at the front of `tail` already searched: no boundary ends
    /// within them.
    searched: usize,
    /// Bytes looked at for a boundary so far (tests assert it stays
    /// linear in the bytes pushed).
    #[cfg(test)]
    examined: usize,
}

/// The held part of an event grew past [`MAX_EVENT_BYTES`].
#[derive(Debug, PartialEq, Eq)]
pub struct Oversized;

impl Framer {
    /// Takes a chunk; returns the whole events it completed (possibly none).
    pub fn push(&mut self, chunk: Bytes) -> Result<Bytes, Oversized> {
        if self.tail.is_empty() && ends_on_boundary(&chunk) {
            return Ok(chunk);
        }
        self.tail.extend_from_slice(&chunk);
        // A boundary (at most 4 bytes) that ends in the new bytes begins
        // at most 3 bytes before them.
        let from = self.searched.saturating_sub(3);
        #[cfg(test)]
        {
            self.examined += self.tail.len() - from;
        }
        let whole = match last_boundary(&self.tail[from..]) {
            Some(end) => self.tail.split_to(from + end).freeze(),
            None => Bytes::new(),
        };
        self.searched = self.tail.len();
        if self.tail.len() > MAX_EVENT_BYTES {
            return Err(Oversized);
        }
        Ok(whole)
    }

    /// Whether part of an event is held (the stream ended inside one).
    pub fn has_partial(&self) -> bool {
        !self.tail.iter().all(|b| b.is_ascii_whitespace())
    }

    /// Drops what is held (a new upstream starts on an event boundary).
    pub fn reset(&mut self) {
        self.tail.clear();
        self.searched = 0;
    }
}

fn ends_on_boundary(b: &[u8]) -> bool {
    b.ends_with(b"\n\n") || b.ends_with(b"\r\n\r\n")
}

/// The end of the last event boundary in `b`, if any.
fn last_boundary(b: &[u8]) -> Option<usize> {
    let lf = b.windows(2).rposition(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = b.windows(4).rposition(|w| w == b"\r\n\r\n").map(|i| i + 4);
    lf.max(crlf)
}

/// The end of the first event in `b` (after its blank line): a `\n\n` or
/// a `\r\n\r\n`, whichever ends first. One pass over the line feeds (an
/// event holds a couple) instead of a substring search for each kind.
fn first_boundary(b: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', b).find_map(|at| {
        // At one line feed a CRLF boundary ends before an LF one.
        if at >= 3 && &b[at - 3..=at] == b"\r\n\r\n" {
            Some(at + 1)
        } else {
            (b.get(at + 1) == Some(&b'\n')).then_some(at + 2)
        }
    })
}

/// Splits whole events (as [`Framer::push`] returns them) into single
/// events, each with its terminating blank line, without copying.
pub fn events(whole: &Bytes) -> impl Iterator<Item = Bytes> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let rest = &whole[start..];
        if rest.is_empty() {
            return None;
        }
        let len = first_boundary(rest).unwrap_or(rest.len());
        let event = whole.slice(start..start + len);
        start += len;
        Some(event)
    })
}

#[cfg(test)]
mod tests {
    use serde::de::IgnoredAny;
    use serde::Deserialize;

    use super::event::whole_body_usage;
    use super::*;
    use proptest::strategy::Strategy as _;

    fn chunk(id: &str, content: &str, finish: Option<&str>) -> String {
        let v = serde_json::json!({"id": id, "model": "small", "created": 7,
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]});
        format!("data: {v}\n\n")
    }

    #[test]
    fn framer_passes_whole_events_and_holds_partial_ones() {
        let mut f = Framer::default();
        let a = Bytes::from("data: 1\n\n");
        assert_eq!(f.push(a.clone()).unwrap(), a, "whole chunk, no copy");
        assert_eq!(
            f.push(Bytes::from("data: 2\n\ndata: 3")).unwrap(),
            "data: 2\n\n"
        );
        assert!(f.has_partial());
        assert_eq!(f.push(Bytes::from("\n")).unwrap(), "");
        assert_eq!(
            f.push(Bytes::from("\ndata: 4\r\n\r\n")).unwrap(),
            "data: 3\n\ndata: 4\r\n\r\n"
        );
        assert!(!f.has_partial());
        let whole = Bytes::from("data: 3\n\ndata: 4\r\n\r\n: c\n\n");
        let split: Vec<Bytes> = events(&whole).collect();
        assert_eq!(split, ["data: 3\n\n", "data: 4\r\n\r\n", ": c\n\n"]);
    }

    #[test]
    fn a_trickled_event_costs_the_framer_linear_work() {
        // A backend that sends an event a byte at a time: each byte must
        // not make the framer look at everything held again.
        for (len, end) in [(8 * 1024, &b"\n\n"[..]), (8 * 1024 + 1, b"\r\n\r\n")] {
            let mut event = vec![b'x'; len];
            event[..6].copy_from_slice(b"data: ");
            event.extend_from_slice(end);
            let mut f = Framer::default();
            let mut out = Vec::new();
            for b in &event {
                out.extend_from_slice(&f.push(Bytes::copy_from_slice(&[*b])).unwrap());
            }
            assert_eq!(out, event, "the event, whole, once");
            assert!(!f.has_partial());
            assert!(
                f.examined <= 8 * event.len(),
                "{} bytes looked at for an event of {}",
                f.examined,
                event.len()
            );
        }
    }

    #[test]
    fn framer_refuses_an_endless_event() {
        let mut f = Framer::default();
        let big = Bytes::from(vec![b'x'; MAX_EVENT_BYTES + 1]);
        assert_eq!(f.push(big), Err(Oversized));
    }

    #[test]
    fn parse_tells_data_done_errors_and_garbage_apart() {
        assert!(matches!(parse(b"data: [DONE]\n\n"), Event::Done));
        assert!(matches!(parse(b": keep-alive\n\n"), Event::Other));
        assert!(matches!(
            parse(b"data: {\"error\":{\"message\":\"x\"}}\n\n"),
            Event::Error
        ));
        assert!(matches!(
            parse(b"data: {\"choices\":[{\"delta\":{\"con\n\n"),
            Event::Malformed
        ));
        let c = chunk("c1", "hi", None);
        assert!(matches!(parse(c.as_bytes()), Event::Data(_)));
    }

    /// What [`skim`] answers for `event`, checked against the parse: when
    /// it reads a text, the parse reads a data chunk, and a transcript fed
    /// either is the same.
    fn skimmed(event: &[u8]) -> Skim<'_> {
        let answer = skim(event);
        agrees(event, &answer);
        answer
    }

    /// Asserts that the parse reads `event` as the skimmer's `answer` says.
    fn agrees(event: &[u8], answer: &Skim<'_>) {
        let shown = String::from_utf8_lossy(event);
        match answer {
            Skim::Text { text, finish } => {
                let parsed = parse(event);
                assert!(
                    matches!(parsed, Event::Data(_)),
                    "parsed otherwise: {shown}"
                );
                let mut a = Transcript::new();
                a.push(text, *finish);
                let mut b = Transcript::new();
                b.observe(&parsed);
                assert_eq!(
                    (a.text, a.deltas, a.finished, a.plain, a.usage),
                    (b.text, b.deltas, b.finished, b.plain, b.usage),
                    "{shown}"
                );
            }
            Skim::Done => assert!(matches!(parse(event), Event::Done), "{shown}"),
            Skim::Unsure => {}
        }
    }

    /// Chunks as servers write them, `TEXT` where their text goes.
    /// (vLLM's; its last; `/v1/completions`; an odd but valid one; TGI's;
    /// SGLang's.)
    const TEMPLATES: [&str; 6] = [
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"TEXT\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"TEXT\"},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"TEXT\",\"finish_reason\":null}]}\r\n\r\n",
        "data:{ \"choices\": [ { \"delta\": { \"content\": null }, \"text\": \"TEXT\" } ], \"usage\": null }\n\n",
        "data: {\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1733011200,\"model\":\"tgi\",\"system_fingerprint\":\"3.0.1-sha-bb9095a\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"TEXT\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"5f0c\",\"object\":\"chat.completion.chunk\",\"created\":1733011200,\"model\":\"default\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":\"TEXT\",\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}\n\n",
    ];

    #[test]
    fn a_streams_skimmer_reads_chunks_against_the_last_one_read_in_full() {
        let mut skimmer = Skimmer::default();
        let event = |template: &str, text: &str| template.replace("TEXT", text).into_bytes();
        let text = |skimmer: &mut Skimmer, e: &[u8]| {
            let answer = skimmer.skim(e);
            agrees(e, &answer);
            match answer {
                Skim::Text { text, finish } => Some((text.into_owned(), finish)),
                _ => None,
            }
        };
        let chat = TEMPLATES[0];
        assert_eq!(
            text(&mut skimmer, &event(chat, "Hel")),
            Some(("Hel".into(), false))
        );
        for (between, want) in [
            ("lo", Some("lo")),
            ("", Some("")),
            ("a\\\"b\\n\\u00e9", Some("a\"b\n\u{e9}")),
            ("caf\u{e9}", Some("caf\u{e9}")),
            // What would end the string early, or not at all, or break it:
            // the whole chunk is read, and this one is not a plain text.
            // (A second index of the choice, after the delta.)
            ("x\"},\"index\":1,\"z\":{\"a\":\"", None),
            // (Still the delta's: its own `index` is not the choice's.)
            ("x\",\"index\":1,\"y\":\"", Some("x")),
            ("x\\", None),
            ("x\"", None),
            ("a\tb", None),
            ("\\ud800", None),
            ("\\q", None),
        ] {
            assert_eq!(
                text(&mut skimmer, &event(chat, between)),
                want.map(|w| (w.to_owned(), false)),
                "{between}"
            );
        }
        // Every server's shape: read in full, then against itself.
        for template in TEMPLATES {
            let finish = template.contains("\"stop\"");
            let mut own = Skimmer::default();
            for word in ["one", "two"] {
                assert_eq!(
                    text(&mut own, &event(template, word)),
                    Some((word.to_owned(), finish)),
                    "{template}"
                );
            }
        }
        // Bytes that are not UTF-8 between the template's.
        let mut bad = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"".to_vec();
        bad.extend_from_slice(b"\xff\xfe\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        assert_eq!(text(&mut skimmer, &bad), None);
        // A chunk that differs elsewhere is read in full, and is the
        // template from then on.
        let last = event(TEMPLATES[1], "!");
        assert_eq!(text(&mut skimmer, &last), Some(("!".into(), true)));
        assert_eq!(
            text(&mut skimmer, &event(TEMPLATES[1], "?")),
            Some(("?".into(), true))
        );
        assert_eq!(
            text(&mut skimmer, &event(chat, "again")),
            Some(("again".into(), false))
        );
        assert_eq!(skimmer.skim(b"data: [DONE]\n\n"), Skim::Done);
    }

    #[test]
    fn skim_reads_plain_chunks_and_passes_on_the_rest() {
        let text = |e: &str| match skimmed(e.as_bytes()) {
            Skim::Text { text, finish } => Some((text.into_owned(), finish)),
            _ => None,
        };
        assert_eq!(
            text(&chunk("c", "tok1 ", None)),
            Some(("tok1 ".into(), false))
        );
        assert_eq!(
            text(&chunk("c", "a\"b\\n", Some("stop"))),
            Some(("a\"b\\n".into(), true))
        );
        assert_eq!(
            text(&chunk("c", "x\\u00e9 ", None)),
            Some(("x\\u00e9 ".into(), false))
        );
        let shapes = [
            // Whitespace anywhere JSON allows it.
            ("data: { \"choices\" : [ { \"index\" : 0 , \"delta\" : { \"content\" : \"hi\" } , \"finish_reason\" : null } ] }\n\n", "hi", false),
            // `/v1/completions`: the choice's own text.
            ("data: {\"choices\":[{\"index\":0,\"text\":\"t\",\"finish_reason\":\"length\"}]}\n\n", "t", true),
            // OpenAI with `include_usage`: a null usage on every chunk;
            // other members (nested or not) are passed over.
            ("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":[1,{\"x\":-2.5e3}]}],\"usage\":null,\"obfuscation\":\"q\"}\n\n", "a", false),
            // The key's name as text, quoted words and a final backslash
            // in the text: text, not keys.
            (&chunk("c", "say \"error\" or \"usage\" \\", None), "say \"error\" or \"usage\" \\", false),
            (&chunk("c", "finish_reason", Some("stop")), "finish_reason", true),
            // A text or finish reason outside the choices is nobody's,
            // for the parser as for the skimmer.
            ("data: {\"text\":\"x\",\"choices\":[{\"delta\":{}}],\"finish_reason\":\"stop\"}\n\n", "", false),
            ("data: {\"choices\":[{\"message\":{\"content\":\"x\"}}]}\n\n", "", false),
            // A null content falls back to the choice's text, as in the parse.
            ("data: {\"choices\":[{\"delta\":{\"content\":null},\"text\":\"t\"}]}\n\n", "t", false),
            ("data: {\"choices\":[]}\n\n", "", false),
        ];
        for (event, want, finish) in shapes {
            assert_eq!(text(event), Some((want.into(), finish)), "{event}");
        }
        assert_eq!(skimmed(b"data: [DONE]\n\n"), Skim::Done);
        for unsure in [
            "data: {\"choices\": [{\"delta\": {\"content\n\n",
            "data: {\"error\":{\"message\":\"x\"},\"choices\":[]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"logprobs\":{\"content\":[]}}]}\n\n",
            ": comment\n\n",
            // Two choices, or a second answer's index.
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}},{\"delta\":{\"content\":\"b\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"a\"}}]}\n\n",
            // A string that never ends, an object without choices, a
            // duplicate member, a key spelled with an escape.
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\\\"}}]}\n\n",
            "data: {\"delta\":{\"content\":\"a\"}}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\",\"content\":\"b\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"con\\u0074ent\":\"a\"}}]}\n\n",
            // What the parser refuses: a wrong type, a control byte, a
            // bad escape, a bad number, trailing bytes, a lone surrogate.
            "data: {\"created\":1.5,\"choices\":[]}\n\n",
            "data: {\"choices\":[{\"finish_reason\":5}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\tb\"}}]}\n\n",
            "data: {\"x\":\"\\q\",\"choices\":[]}\n\n",
            "data: {\"x\":\"\\u00zz\",\"choices\":[]}\n\n",
            "data: {\"x\":01,\"choices\":[]}\n\n",
            "data: {\"choices\":[]} x\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"\\ud800\"}}]}\n\n",
        ] {
            assert_eq!(skimmed(unsure.as_bytes()), Skim::Unsure, "{unsure}");
        }
        // Nesting past the skimmer's depth is the parser's; the stack
        // does not grow with a hostile depth.
        let deep = format!(
            "data: {{\"x\":{}1{},\"choices\":[]}}\n\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(skimmed(deep.as_bytes()), Skim::Unsure);
    }

    /// Up to three edits for `edit`: a byte replaced, inserted or
    /// removed, at any place, any byte or one that means something in JSON.
    fn edits() -> impl proptest::strategy::Strategy<Value = Vec<(usize, u8, u8)>> {
        proptest::collection::vec(
            (
                0usize..4096,
                proptest::prop_oneof![
                    proptest::num::u8::ANY,
                    proptest::sample::select(b"\"{}[],:\\ 0123e.-nul\t".to_vec()),
                ],
                0u8..3,
            ),
            0..3,
        )
    }

    /// One edit of a chunk's bytes: replace, insert or delete at a place.
    fn edit(bytes: &mut Vec<u8>, (at, byte, how): (usize, u8, u8)) {
        if bytes.is_empty() {
            return;
        }
        let at = at % bytes.len();
        match how % 3 {
            0 => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ => {
                bytes.remove(at);
            }
        }
    }

    proptest::proptest! {
        /// However a stream is cut into chunks, the framer passes on what
        /// one that searches everything it holds at every chunk would:
        /// after each chunk, the bytes up to the last blank line held.
        #[test]
        fn the_framer_passes_what_a_full_search_would_however_cut(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"\r\n\n\na:".to_vec()),
                0..64,
            ),
            cuts in proptest::collection::vec(1usize..8, 0..64),
        ) {
            let mut f = Framer::default();
            let (mut passed, mut held, mut expected) = (Vec::new(), Vec::new(), Vec::new());
            let mut fed = 0;
            let mut cuts = cuts.into_iter().chain(std::iter::repeat(1));
            while fed < bytes.len() {
                let end = (fed + cuts.next().unwrap_or(1)).min(bytes.len());
                let chunk = &bytes[fed..end];
                passed.extend_from_slice(&f.push(Bytes::copy_from_slice(chunk)).unwrap());
                fed = end;
                held.extend_from_slice(chunk);
                if let Some(end) = last_boundary(&held) {
                    expected.extend(held.drain(..end));
                }
                proptest::prop_assert_eq!(&passed, &expected);
            }
        }
    }

    proptest::proptest! {
        /// Events end where the first blank line of either kind ends, as
        /// a byte-by-byte look finds it.
        #[test]
        fn events_split_where_a_blank_line_first_ends(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"\r\n\n\na:".to_vec()),
                0..48,
            ),
        ) {
            let whole = Bytes::from(bytes);
            let mut naive = Vec::new();
            let mut rest = &whole[..];
            while !rest.is_empty() {
                let len = (1..=rest.len())
                    .find(|&e| rest[..e].ends_with(b"\n\n") || rest[..e].ends_with(b"\r\n\r\n"))
                    .unwrap_or(rest.len());
                naive.push(Bytes::copy_from_slice(&rest[..len]));
                rest = &rest[len..];
            }
            let split: Vec<Bytes> = events(&whole).collect();
            proptest::prop_assert_eq!(split, naive);
        }
    }

    proptest::proptest! {
        /// Whatever the skimmer reads from a chunk, the full parse reads
        /// the same, for chunks of many shapes and for their bytes edited
        /// at random; any bytes at all are read without a panic.
        #[test]
        fn the_skimmer_reads_what_the_parser_reads(
            // Any text, or one that reads like a key the skimmer looks for.
            content in proptest::option::of(proptest::prop_oneof![
                "(\\PC|[\"\\\\])*",
                "(finish_reason|content|text|logprobs|choices)",
            ]),
            finish in proptest::option::of("[a-z_]{1,8}"),
            index in proptest::prop_oneof![4 => proptest::strategy::Just(0u64), 1 => 1u64..3],
            extra in proptest::collection::vec(
                (
                    0usize..3,
                    "(usage|error|text|content|finish_reason|logprobs|tool_calls|role|index|x)",
                    proptest::prop_oneof![
                        "(\\PC|[\"\\\\])*".prop_map(serde_json::Value::from),
                        proptest::strategy::Just(serde_json::Value::Null),
                        (-3i64..3).prop_map(serde_json::Value::from),
                        proptest::strategy::Just(serde_json::json!({"prompt_tokens": 1})),
                        proptest::strategy::Just(serde_json::json!([1, "a", {"b": null}])),
                    ],
                ),
                0..4,
            ),
            completions in proptest::bool::ANY,
            edits in edits(),
            noise in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let mut choice = serde_json::json!({"index": index, "finish_reason": finish});
            match (&content, completions) {
                // `/v1/completions`: the text is the choice's own.
                (Some(c), true) => choice["text"] = c.clone().into(),
                (Some(c), false) => choice["delta"] = serde_json::json!({"content": c}),
                (None, _) => choice["delta"] = serde_json::json!({}),
            }
            let mut v = serde_json::json!({"id": "c", "model": "m", "created": 1,
                "choices": [choice]});
            // Extra members at the top, in the choice, or in its delta.
            for (depth, k, val) in &extra {
                let target = match depth {
                    0 => &mut v,
                    1 => &mut v["choices"][0],
                    _ => &mut v["choices"][0]["delta"],
                };
                if target.is_object() {
                    target[k.as_str()] = val.clone();
                }
            }
            let mut payload = v.to_string().into_bytes();
            skimmed(format!("data: {v}\n\n").as_bytes());
            for e in &edits {
                edit(&mut payload, *e);
            }
            let mut event = b"data: ".to_vec();
            event.extend_from_slice(&payload);
            event.extend_from_slice(b"\n\n");
            skimmed(&event);
            let mut hostile = b"data: {\"choices\":".to_vec();
            hostile.extend_from_slice(&noise);
            let _ = skim(&hostile);
        }

        /// A stream's skimmer reads every chunk as the parser does, whatever
        /// lies between the bytes of the chunk it last read in full.
        #[test]
        fn a_streams_skimmer_reads_each_chunk_as_the_parser_does(
            events in proptest::collection::vec(
                (
                    0..TEMPLATES.len(),
                    proptest::prop_oneof![
                        // A string's inside, as a server escapes it.
                        "(\\PC|[\"\\\\\t])*".prop_map(|t| {
                            let quoted = serde_json::to_string(&t).unwrap_or_default();
                            quoted.as_bytes()[1..quoted.len() - 1].to_vec()
                        }),
                        // Anything at all.
                        proptest::collection::vec(proptest::num::u8::ANY, 0..16),
                        proptest::collection::vec(
                            proptest::sample::select(b"\"\\ux0d8{}[],:\t\xc3\xa9".to_vec()),
                            0..12,
                        ),
                    ],
                ),
                1..16,
            ),
        ) {
            let mut skimmer = Skimmer::default();
            for (template, between) in &events {
                let (head, tail) = TEMPLATES[*template].split_once("TEXT").unwrap_or_default();
                let mut event = head.as_bytes().to_vec();
                event.extend_from_slice(between);
                event.extend_from_slice(tail.as_bytes());
                let answer = skimmer.skim(&event);
                agrees(&event, &answer);
            }
        }
    }

    #[test]
    fn an_answer_longer_than_the_cap_stops_being_continuable_and_lets_its_text_go() {
        let mut t = Transcript::new();
        let piece = "x".repeat(64 * 1024);
        for _ in 0..(MAX_TRANSCRIPT_BYTES / piece.len()) {
            t.push(&piece, false);
        }
        assert!(t.plain && t.text.len() == MAX_TRANSCRIPT_BYTES);
        t.push("y", false);
        assert!(!t.plain, "past the cap: no continuation");
        assert!(
            t.text.is_empty() && t.text.capacity() == 0,
            "its text is let go"
        );
        t.push("z", true);
        assert!(t.text.is_empty() && t.finished);
    }

    #[test]
    fn transcript_collects_text_identity_and_plainness() {
        let mut t = Transcript::new();
        for e in [chunk("c1", "Hel", None), chunk("c1", "lo", None)] {
            t.observe(&parse(e.as_bytes()));
        }
        assert_eq!((t.text.as_str(), t.deltas, t.finished), ("Hello", 2, false));
        assert_eq!(t.id.as_deref(), Some("c1"));
        let tool = r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#;
        t.observe(&parse(format!("{tool}\n\n").as_bytes()));
        assert!(!t.plain);
        t.observe(&parse(b"data: [DONE]\n\n"));
        assert!(t.finished);
    }

    fn delivered(text: &str, deltas: u64) -> Transcript {
        Transcript {
            text: text.into(),
            id: Some("orig".into()),
            model: Some("big".into()),
            created: Some(1),
            deltas,
            finished: false,
            plain: true,
            usage: None,
        }
    }

    fn run(splice: &mut Splice, t: &mut Transcript, events: &[String]) -> Result<String, Mismatch> {
        let mut out = String::new();
        for e in events {
            if let Some(b) = splice.rewrite(&Bytes::from(e.clone()), t)? {
                out.push_str(std::str::from_utf8(&b).unwrap());
            }
        }
        Ok(out)
    }

    #[test]
    fn a_prefill_continuation_keeps_identity_and_appends_text() {
        let mut t = delivered("tok0 tok1 ", 2);
        let mut s = Splice::new(Resumption::Prefill, &t);
        let role =
            r#"data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let out = run(
            &mut s,
            &mut t,
            &[format!("{role}\n\n"), chunk("x", "tok2 ", Some("stop"))],
        )
        .unwrap();
        assert_eq!(t.text, "tok0 tok1 tok2 ");
        assert!(t.finished);
        assert!(
            !out.contains("\"x\"") && out.contains("\"orig\"") && out.contains("\"big\""),
            "{out}"
        );
        assert_eq!(
            out.matches("data:").count(),
            1,
            "the role-only event is dropped: {out}"
        );
    }

    #[test]
    fn a_restart_skips_exactly_the_delivered_prefix() {
        let mut t = delivered("tok0 tok1 ", 2);
        let mut s = Splice::new(Resumption::Restart, &t);
        let events = [
            chunk("x", "tok0 ", None),
            chunk("x", "tok1 to", None),
            chunk("x", "k2 ", Some("stop")),
        ];
        let out = run(&mut s, &mut t, &events).unwrap();
        assert_eq!(t.text, "tok0 tok1 tok2 ");
        assert!(
            out.contains("\"content\":\"to\"") && out.contains("\"content\":\"k2 \""),
            "{out}"
        );
    }

    #[test]
    fn a_restart_that_diverges_is_a_mismatch() {
        let mut t = delivered("tok0 tok1 ", 2);
        let mut s = Splice::new(Resumption::Restart, &t);
        assert_eq!(
            run(&mut s, &mut t, &[chunk("x", "tok0 other", None)]),
            Err(Mismatch)
        );
        let mut s = Splice::new(Resumption::Restart, &t);
        assert_eq!(
            run(&mut s, &mut t, &[chunk("x", "tok0 ", Some("stop"))]),
            Err(Mismatch)
        );
    }

    #[test]
    fn the_usage_of_a_run_of_events_is_found_without_a_transcript() {
        let text = Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
        );
        assert_eq!(
            events_usage(&text),
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
        let none = Bytes::from_static(b"data: {\"choices\":[]}\n\n");
        assert_eq!(events_usage(&none), None);
        let null = Bytes::from_static(b"data: {\"choices\":[],\"usage\":null}\n\n");
        assert_eq!(events_usage(&null), None);
    }

    #[test]
    fn a_bodys_usage_read_from_its_end_is_the_one_a_full_parse_finds() {
        let u = |p, c| {
            Some(Usage {
                prompt_tokens: p,
                completion_tokens: c,
            })
        };
        let answer = r#"{"id":"x","choices":[{"message":{"content":"hi"}}]"#;
        let cases: Vec<(String, Option<Usage>)> = vec![
            // Last, as OpenAI-style servers write it.
            (format!(r#"{answer},"usage":{{"prompt_tokens":5,"completion_tokens":7}}}}"#), u(5, 7)),
            // Followed by small members (vLLM, OpenAI), with whitespace.
            (
                format!("{answer}, \"usage\" : {{\"prompt_tokens\":1,\"completion_tokens\":2}} ,\n \"prompt_logprobs\": null, \"kv\": {{\"a\": [1, \"}}\"]}} }}\n"),
                u(1, 2),
            ),
            // First: the end does not prove it, the full parse finds it.
            (r#"{"usage":{"prompt_tokens":3},"choices":[]}"#.into(), u(3, 0)),
            (format!(r#"{answer},"usage":null}}"#), None),
            // Text the model wrote is inside a string: its quotes are escaped.
            (
                r#"{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":99}}"}}]}"#.into(),
                None,
            ),
            (
                r#"{"usage":{"prompt_tokens":4},"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":99}}"}}]}"#.into(),
                u(4, 0),
            ),
            // A key that ends in `"usage`: its quote is escaped.
            (r#"{"\"usage":{"prompt_tokens":9}}"#.into(), None),
            // An escaped backslash before a real key.
            (r#"{"a":"x\\","usage":{"completion_tokens":6}}"#.into(), u(0, 6)),
            // A nested `usage` key is not the answer's.
            (format!(r#"{answer},"meta":{{"usage":{{"prompt_tokens":8}}}}}}"#), None),
            (format!(r#"{answer},"usage":{{"prompt_tokens":8}}}},{{}}"#), None),
            (r#"{"a":[{"usage":{"prompt_tokens":8}}]}"#.into(), None),
            (r#"{"x":"usage"}"#.into(), None),
            (r#"{"usage":{"prompt_tokens":"many"}}"#.into(), None),
            (r#"{"usage":{"prompt_tokens":1},9:1}"#.into(), None),
            (r#"{"usage":{"prompt_tokens":1}"#.into(), None),
            ("".into(), None),
        ];
        for (body, want) in cases {
            assert_eq!(body_usage(body.as_bytes()), want, "{body}");
            assert_eq!(
                whole_body_usage(body.as_bytes()),
                want,
                "full parse of {body}"
            );
        }
    }

    /// The top-level keys of a JSON object, duplicates kept; `None` when
    /// `body` is not one.
    fn top_level_keys(body: &[u8]) -> Option<Vec<String>> {
        struct Keys(Vec<String>);
        impl<'de> Deserialize<'de> for Keys {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = Keys;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Keys, A::Error> {
                        let mut keys = Vec::new();
                        while let Some((k, IgnoredAny)) = map.next_entry::<String, IgnoredAny>()? {
                            keys.push(k);
                        }
                        Ok(Keys(keys))
                    }
                }
                d.deserialize_map(V)
            }
        }
        serde_json::from_slice::<Keys>(body).ok().map(|k| k.0)
    }

    proptest::proptest! {
        /// What a body's end says of its `usage` is what a full parse of
        /// the body finds, for answers of many shapes (the usage first,
        /// between or last, followed by other members, counts of every
        /// kind) and for their bytes edited at random while they are still
        /// one JSON object with one `usage` (a key spelled with `\u`
        /// escapes is not looked for: see `body_usage`); any bytes are read
        /// without a panic.
        #[test]
        fn a_bodys_usage_is_what_a_full_parse_finds(
            text in "(\\PC|[\"\\\\]|usage|\"usage\":)*",
            counts in proptest::collection::vec(
                (
                    "(prompt_tokens|completion_tokens|total_tokens|prompt_tokens_details|usage)",
                    proptest::prop_oneof![
                        (0u64..100).prop_map(|n| n.to_string()),
                        proptest::sample::select(vec![
                            "18446744073709551615", "18446744073709551616", "null", "-1", "-0",
                            "1.0", "1e2", "01", "\"7\"", "{\"cached_tokens\":0}", "[1,2]", "true",
                        ])
                        .prop_map(String::from),
                    ],
                ),
                0..4,
            ),
            // An object, null, an array, a number, none.
            kind in 0u8..5,
            place in 0usize..3,
            trailing in proptest::collection::vec(
                proptest::sample::select(vec![
                    r#""system_fingerprint":"fp""#,
                    r#""prompt_logprobs":null"#,
                    r#""meta":{"usage":{"prompt_tokens":8}}"#,
                    r#""x":[{"usage":1},"usage"]"#,
                ]),
                0..3,
            ),
            pretty in proptest::bool::ANY,
            // Whitespace after the usage: its key before the tail that is
            // searched first, across its start, or in it.
            pad in 0usize..1100,
            edits in edits(),
        ) {
            let choice = serde_json::json!({"index": 0, "message": {"content": text}});
            let mut members = vec![r#""id":"x""#.to_string(), format!(r#""choices":[{choice}]"#)];
            let fields: Vec<String> = counts.iter().map(|(k, v)| format!(r#""{k}":{v}"#)).collect();
            let usage = match kind {
                0 => Some(format!("{{{}}}", fields.join(","))),
                1 => Some("null".to_string()),
                2 => Some("[3,4]".to_string()),
                3 => Some("5".to_string()),
                _ => None,
            };
            if let Some(u) = usage {
                let pad = " ".repeat(pad);
                members.insert(place.min(members.len()), format!(r#""usage":{u}{pad}"#));
            }
            members.extend(trailing.iter().map(|t| t.to_string()));
            let sep = if pretty { ",\n  " } else { "," };
            let mut body = format!("{{{}}}", members.join(sep)).into_bytes();
            for e in &edits {
                edit(&mut body, *e);
            }
            let read = body_usage(&body);
            let one_usage = top_level_keys(&body)
                .is_some_and(|keys| keys.iter().filter(|k| *k == "usage").count() <= 1);
            if one_usage {
                proptest::prop_assert_eq!(read, whole_body_usage(&body));
            }
        }
    }

    #[test]
    fn usage_counts_both_parts() {
        let mut t = delivered("a b ", 2);
        let mut s = Splice::new(Resumption::Prefill, &t);
        let usage = r#"data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
        let out = run(&mut s, &mut t, &[format!("{usage}\n\n")]).unwrap();
        assert!(
            out.contains(r#""completion_tokens":5"#) && out.contains(r#""prompt_tokens":10"#),
            "{out}"
        );
        assert!(out.contains(r#""total_tokens":15"#), "{out}");
    }
}
