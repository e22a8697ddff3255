//! The chunked body decoder (`src/dataplane/upstream/wire.rs`, `Decoder`):
//! never a panic; the same body however the bytes arrive; never more
//! bytes out than came in.
//!
//! Input: one control byte (a piece size), then a chunked body and what
//! follows it, until the backend closes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zonegate::dataplane::upstream::fuzzing::read_chunked;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, wire)) = data.split_first() else {
        return;
    };
    let whole = read_chunked(wire, std::iter::empty());
    if let Ok((body, left)) = &whole {
        assert!(body.len() + left <= wire.len());
    }
    let step = usize::from(ctl).max(1);
    for (how, pieces) in [("a byte at a time", 1), ("in pieces", step)] {
        let trickled = read_chunked(wire, std::iter::repeat(pieces));
        match (&whole, &trickled) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "at once vs {how}"),
            (Ok(_), Err(_)) => {} // Line limits apply while incomplete.
            (Err(e), Ok(b)) => panic!("at once: {e}; {how}: {b:?}"),
            (Err(_), Err(_)) => {}
        }
    }
});
