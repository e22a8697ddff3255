//! The lean HTTP/1.1 server's request-head decision (`net/src/server.rs`)
//! and the header helpers it reads with (`net/src/http1.rs`): never a
//! panic; the same decision however the bytes arrive; the SWAR helpers
//! say what their byte-at-a-time definitions say.
//!
//! Input: one control byte (bit 0: a listener with plain paths; the rest:
//! a piece size), then the bytes a client sends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zonegate_net::fuzzing::{request_head, request_head_in_pieces, Head};
use zonegate_net::http1::{content_length, is_header_text, list_items, name_is, HeadFields};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, bytes)) = data.split_first() else {
        return;
    };
    let plain = ctl & 1 == 1;
    let whole = request_head(bytes, plain);
    if let Head::Ours { head_len, .. } = &whole {
        assert!(*head_len <= bytes.len());
        assert!(
            bytes[..*head_len].ends_with(b"\n"),
            "a head ends with its empty line"
        );
    }
    // Read in pieces, a head is parsed again only when the new bytes may
    // end it: the decision is the same, or (an invalid head with no end in
    // sight) not made yet.
    let step = usize::from(ctl >> 1).max(1);
    for trickled in [
        request_head_in_pieces(bytes, std::iter::repeat(1), plain),
        request_head_in_pieces(bytes, std::iter::repeat(step), plain),
    ] {
        match (&whole, &trickled) {
            (_, Head::Partial) if !matches!(whole, Head::Ours { .. }) => {}
            _ => assert_eq!(whole, trickled, "read at once vs in pieces"),
        }
    }

    // The header helpers against their definitions, on the fields of the
    // head and on the raw bytes.
    let text = |b: &u8| *b == b'\t' || (b' '..=b'~').contains(b);
    assert_eq!(is_header_text(bytes), bytes.iter().all(text));
    let lower: Vec<u8> = bytes
        .iter()
        .take(40)
        .map(u8::to_ascii_lowercase)
        .filter(u8::is_ascii)
        .collect();
    let fields = HeadFields::parse(bytes::Bytes::copy_from_slice(bytes));
    let names: Vec<&[u8]> = bytes.split(|b| *b == b':').take(8).collect();
    for name in &names {
        assert_eq!(name_is(name, &lower), name.eq_ignore_ascii_case(&lower));
        for known in [
            &b"content-length"[..],
            b"transfer-encoding",
            b"host",
            b"connection",
        ] {
            assert_eq!(name_is(name, known), name.eq_ignore_ascii_case(known));
        }
    }
    if let Some(fields) = &fields {
        for (name, value) in fields.iter() {
            let first = fields.iter().find(|(n, _)| n.eq_ignore_ascii_case(&lower));
            assert_eq!(fields.get(&lower), first.map(|(_, v)| v));
            assert_eq!(name_is(name, &lower), name.eq_ignore_ascii_case(&lower));
            let _ = (
                content_length(value),
                list_items(value).count(),
                fields.shared(value),
            );
        }
    }
    // A Content-Length: digits only (blanks around), 19 at most.
    let trimmed = bytes.trim_ascii();
    let expected =
        (!trimmed.is_empty() && trimmed.len() <= 19 && trimmed.iter().all(u8::is_ascii_digit))
            .then(|| std::str::from_utf8(trimmed).ok()?.parse::<u64>().ok())
            .flatten();
    assert_eq!(content_length(bytes), expected);
});
