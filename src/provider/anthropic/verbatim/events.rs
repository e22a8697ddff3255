//! A stream's events read in one pass, as the answer is (`super`): the
//! text delta matched against the exact bytes Anthropic writes before any
//! field is read, and the events around the deltas (`message_start`, a
//! text block's `content_block_start`, `message_delta`, and the events
//! that carry nothing for the client) read field by field without serde.
//!
//! Each reader gives `None` for anything it does not take (a `\u` escape,
//! a `null` where a value is read, a field twice, another block type, a
//! value out of range), and `Stream` then reads the event the typed way,
//! then the `Value` way, which have the last word. The tests in
//! `tests/stream.rs` check that both ways give the same chunks.

use super::{once, usage_in, utf8, Json};
use crate::provider::anthropic::fast::UsageIn;

/// A text delta as Anthropic writes it, `type` first:
/// `{"type":"content_block_delta","index":N,"delta":{"type":"text_delta","text":"…"}}`,
/// nothing between the tokens: the block's index and the text's raw
/// bytes (the same JSON string when copied between quotes).
pub(in crate::provider::anthropic) fn exact_text_delta(data: &[u8]) -> Option<(u64, &[u8])> {
    const HEAD: &[u8] = b"{\"type\":\"content_block_delta\",\"index\":";
    // Up to the text's opening quote, which `Json::string` reads.
    const MID: &[u8] = b",\"delta\":{\"type\":\"text_delta\",\"text\":";
    if !data.starts_with(HEAD) {
        return None;
    }
    // The index starts right after the colon (no whitespace: that is
    // another shape, for the field reader).
    if !data.get(HEAD.len()).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let mut j = Json {
        b: data,
        i: HEAD.len(),
    };
    let index = j.u64()?;
    if !data[j.i..].starts_with(MID) {
        return None;
    }
    j.i += MID.len();
    if data.get(j.i) != Some(&b'"') {
        return None;
    }
    let text = j.string()?;
    if &data[j.i..] != b"}}" {
        return None;
    }
    // The rest of the event is ASCII of the template's.
    utf8(text).then_some(())?;
    Some((index, text))
}

/// `message_start`: the message's `id` (as text: one without escapes,
/// which Anthropic's `msg_…` ids never have) and its `usage`.
pub(in crate::provider::anthropic) fn message_start(
    data: &[u8],
) -> Option<(&str, Option<UsageIn>)> {
    utf8(data).then_some(())?;
    let mut j = Json::new(data);
    let mut seen = 0u32;
    let (mut id, mut usage) = (None, None);
    if !j.open(b'{', b'}')? {
        return None;
    }
    loop {
        match j.key()? {
            b"message" => {
                once(&mut seen, 1)?;
                let mut inner = 0u32;
                if j.open(b'{', b'}')? {
                    loop {
                        match j.key()? {
                            b"id" => {
                                once(&mut inner, 1)?;
                                id = Some(j.string()?);
                            }
                            b"usage" => {
                                once(&mut inner, 2)?;
                                usage = Some(usage_in(&mut j)?);
                            }
                            _ => j.skip(2)?,
                        }
                        if !j.more(b'}')? {
                            break;
                        }
                    }
                }
            }
            _ => j.skip(1)?,
        }
        if !j.more(b'}')? {
            break;
        }
    }
    if !j.end() {
        return None;
    }
    let id = id?;
    if id.contains(&b'\\') {
        return None;
    }
    Some((std::str::from_utf8(id).ok()?, usage))
}

/// `content_block_start` of a text block: its index and its starting
/// text's raw bytes (empty when it has none).
pub(in crate::provider::anthropic) fn text_block_start(data: &[u8]) -> Option<(u64, &[u8])> {
    utf8(data).then_some(())?;
    let mut j = Json::new(data);
    let mut seen = 0u32;
    let (mut index, mut text, mut kind) = (None, None, None);
    if !j.open(b'{', b'}')? {
        return None;
    }
    loop {
        match j.key()? {
            b"index" => {
                once(&mut seen, 1)?;
                index = Some(j.u64()?);
            }
            b"content_block" => {
                once(&mut seen, 2)?;
                let mut inner = 0u32;
                if j.open(b'{', b'}')? {
                    loop {
                        match j.key()? {
                            b"type" => {
                                once(&mut inner, 1)?;
                                kind = Some(j.string()?);
                            }
                            b"text" => {
                                once(&mut inner, 2)?;
                                text = Some(j.string()?);
                            }
                            _ => j.skip(2)?,
                        }
                        if !j.more(b'}')? {
                            break;
                        }
                    }
                }
            }
            _ => j.skip(1)?,
        }
        if !j.more(b'}')? {
            break;
        }
    }
    if !j.end() || kind? != b"text" {
        return None;
    }
    Some((index?, text.unwrap_or(b"")))
}

/// What a `message_delta` says: its stop reason (raw; `None` when absent
/// or `null`) and its `usage`.
pub(in crate::provider::anthropic) type MessageDelta<'a> = (Option<&'a [u8]>, Option<UsageIn>);

/// `message_delta`, read as [`MessageDelta`].
pub(in crate::provider::anthropic) fn message_delta(data: &[u8]) -> Option<MessageDelta<'_>> {
    utf8(data).then_some(())?;
    let mut j = Json::new(data);
    let mut seen = 0u32;
    let (mut stop, mut usage) = (None, None);
    if !j.open(b'{', b'}')? {
        return None;
    }
    loop {
        match j.key()? {
            b"delta" => {
                once(&mut seen, 1)?;
                let mut inner = 0u32;
                if j.open(b'{', b'}')? {
                    loop {
                        match j.key()? {
                            b"stop_reason" => {
                                once(&mut inner, 1)?;
                                if j.peek()? == b'n' {
                                    j.literal(b"null")?;
                                } else {
                                    stop = Some(j.string()?);
                                }
                            }
                            _ => j.skip(2)?,
                        }
                        if !j.more(b'}')? {
                            break;
                        }
                    }
                }
            }
            b"usage" => {
                once(&mut seen, 2)?;
                usage = Some(usage_in(&mut j)?);
            }
            _ => j.skip(1)?,
        }
        if !j.more(b'}')? {
            break;
        }
    }
    j.end().then_some((stop, usage))
}

/// Whether `data` is one JSON value without an escape (what an event
/// with nothing for the client, `ping`, `content_block_stop` or
/// `message_stop`, must still be; escapes, which such events do not
/// have, are the `Value` parse's to judge).
pub(in crate::provider::anthropic) fn plain_json(data: &[u8]) -> bool {
    if !utf8(data) || memchr::memchr(b'\\', data).is_some() {
        return false;
    }
    let mut j = Json::new(data);
    j.skip(0).is_some() && j.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_delta_is_matched_only_in_anthropics_exact_shape() {
        let ok = |s: &str| exact_text_delta(s.as_bytes()).map(|(i, t)| (i, t.to_vec()));
        let delta = |index: &str, text: &str| {
            format!("{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":{text}}}}}")
        };
        assert_eq!(ok(&delta("0", "\"Hi\"")), Some((0, b"Hi".to_vec())));
        assert_eq!(ok(&delta("12", "\"\"")), Some((12, Vec::new())));
        // Escapes as written, unicode as its bytes.
        assert_eq!(
            ok(&delta("1", r#""a\"b\\c\n\/""#)),
            Some((1, br#"a\"b\\c\n\/"#.to_vec()))
        );
        assert_eq!(
            ok(&delta("1", "\"héllo 日本\"")),
            Some((1, "héllo 日本".as_bytes().to_vec()))
        );
        for odd in [
            delta("1", r#""\u00e9""#),  // a `\u` escape: the field reader's (then serde's)
            delta("01", "\"x\""),       // not a JSON number
            delta(" 1", "\"x\""),       // whitespace: another shape
            delta("-1", "\"x\""),
            delta("1.0", "\"x\""),
            delta("99999999999999999999", "\"x\""), // beyond u64
            delta("1", "null"),
            delta("1", "\"x\" "),
            delta("1", "\"a\u{1}\""), // a control character
            delta("1", "\"x"),
            format!("{} ", delta("1", "\"x\"")),
            delta("1", "\"x\"").replace("}}", "},\"extra\":1}"),
            // Another order (serde_json's sorted keys): the field reader's.
            "{\"delta\":{\"text\":\"x\",\"type\":\"text_delta\"},\"index\":0,\"type\":\"content_block_delta\"}".to_owned(),
            delta("1", "\"x\"").replace("text_delta", "input_json_delta"),
        ] {
            assert_eq!(ok(&odd), None, "{odd}");
        }
        // Invalid UTF-8 in the text.
        let mut bad = delta("0", "\"__\"").into_bytes();
        let at = bad.len() - 5;
        bad[at] = 0xff;
        assert_eq!(exact_text_delta(&bad), None);
    }

    #[test]
    fn the_events_around_the_deltas_are_read_in_any_order_or_left_to_serde() {
        let start = br#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"c","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":null,"output_tokens":1,"service_tier":"standard"}}}"#;
        let (id, usage) = message_start(start).expect("start");
        assert_eq!(id, "msg_1");
        let usage = usage.expect("usage");
        assert_eq!(
            (usage.input_tokens, usage.output_tokens),
            (Some(25), Some(1))
        );
        assert_eq!(usage.cache_creation_input_tokens, None);
        let sorted = br#"{"message":{"content":[],"id":"msg_2","usage":{"input_tokens":3}},"type":"message_start"}"#;
        assert_eq!(message_start(sorted).map(|(id, _)| id), Some("msg_2"));
        for odd in [
            &br#"{"message":{"id":"msg\/1"}}"#[..], // an escape in the id
            br#"{"message":{"id":"a","id":"b"}}"#,  // twice
            br#"{"message":{"id":null}}"#,
            br#"{"message":{"id":"a","usage":null}}"#,
            br#"{"message":{"id":"a","usage":{"input_tokens":1.5}}}"#,
            br#"{"message":{"usage":{}}}"#, // no id
            br#"[{"id":"a"}]"#,
            br#"{"message":{"id":"a"}} x"#,
        ] {
            assert!(
                message_start(odd).is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }

        assert_eq!(
            text_block_start(br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
            Some((0, &b""[..]))
        );
        assert_eq!(
            text_block_start(
                br#"{"content_block":{"text":"Hi \"x\"","type":"text","citations":[]},"index":2}"#
            ),
            Some((2, &br#"Hi \"x\""#[..]))
        );
        assert_eq!(
            text_block_start(br#"{"index":1,"content_block":{"type":"text"}}"#),
            Some((1, &b""[..]))
        );
        for odd in [
            &br#"{"index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#[..],
            br#"{"index":1,"content_block":{"type":"text","text":null}}"#,
            br#"{"index":1,"index":1,"content_block":{"type":"text"}}"#,
            br#"{"index":-1,"content_block":{"type":"text"}}"#,
            br#"{"content_block":{"type":"text"}}"#,
            br#"{"index":1,"content_block":{"type":"text","text":"\u00e9"}}"#,
        ] {
            assert!(
                text_block_start(odd).is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }

        let delta = br#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#;
        let (stop, usage) = message_delta(delta).expect("delta");
        assert_eq!(stop, Some(&b"end_turn"[..]));
        assert_eq!(usage.and_then(|u| u.output_tokens), Some(15));
        let (stop, usage) =
            message_delta(br#"{"delta":{"stop_reason":null},"type":"message_delta"}"#)
                .expect("null");
        assert!(stop.is_none() && usage.is_none());
        for odd in [
            &br#"{"delta":{"stop_reason":1}}"#[..],
            br#"{"delta":null}"#,
            br#"{"delta":{},"delta":{}}"#,
            br#"{"usage":{"output_tokens":"1"}}"#,
            br#"{"delta":{"stop_reason":"end_turn"}"#,
        ] {
            assert!(
                message_delta(odd).is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }

        assert!(plain_json(br#"{"type":"ping"}"#));
        assert!(plain_json(
            br#" {"type" : "content_block_stop", "index": 0, "x": [1, 2.5e3, true, null]} "#
        ));
        for odd in [
            &b"{"[..],
            b"{} {}",
            br#"{"a":"\ud800"}"#,
            b"",
            b"{\"a\":\"\xff\"}",
        ] {
            assert!(!plain_json(odd), "{}", String::from_utf8_lossy(odd));
        }
    }
}
