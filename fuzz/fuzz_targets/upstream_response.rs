//! The backend response reader (`src/dataplane/upstream/wire.rs`): head
//! parse, 1xx skipping, framing, hop-by-hop filtering, body decoding.
//! Never a panic; the same response however the bytes arrive; a backend
//! can neither forge zonegate's own headers nor pass framing headers on.
//!
//! Input: one control byte (a piece size), then what the backend sends
//! before it closes the connection.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zonegate::dataplane::upstream::fuzzing::read_response;

/// Header names a passed-on answer never carries.
const NEVER: [&[u8]; 10] = [
    b"content-length",
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"trailer",
    b"upgrade",
    b"proxy-authenticate",
    b"te",
    b"x-request-id",
    b"x-zonegate-",
];

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, wire)) = data.split_first() else {
        return;
    };
    let whole = read_response(wire, std::iter::empty());
    if let Ok(read) = &whole {
        assert!((200..=599).contains(&read.status), "status {}", read.status);
        assert!(read.body.len() + read.left <= wire.len());
        for line in read.lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            assert!(line.ends_with(b"\r"), "a line ends with CRLF");
            let name = line.split(|b| *b == b':').next().unwrap_or_default();
            for never in NEVER {
                let prefix = never.ends_with(b"-");
                let hit = if prefix {
                    name.len() >= never.len() && name[..never.len()].eq_ignore_ascii_case(never)
                } else {
                    name.eq_ignore_ascii_case(never)
                };
                assert!(!hit, "{} passed on", String::from_utf8_lossy(name));
            }
        }
    }
    let step = usize::from(ctl).max(1);
    for (how, pieces) in [("a byte at a time", 1), ("in pieces", step)] {
        let trickled = read_response(wire, std::iter::repeat(pieces));
        match (&whole, &trickled) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "at once vs {how}"),
            // Limits on what is held (a chunk-size line, trailers) apply
            // only while it is incomplete: at once may take more.
            (Ok(_), Err(_)) => {}
            (Err(e), Ok(b)) => panic!("at once: {e}; {how}: {b:?}"),
            (Err(_), Err(_)) => {}
        }
    }
});
