//! The signed-call verifier (`net/src/sign.rs`): the header parse, the
//! call and answer checks at any clock. Never a panic; a parsed header
//! written and parsed again is itself; a call signed with the ring passes
//! exactly when its time is within the window, once (a replay is
//! refused), and its body is the signed one.
//!
//! Input: 8 bytes signing time, 8 bytes checking time, 8 bytes node, 2
//! bytes status, then a header value to check as it is; its bytes are
//! also the body.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use zonegate_net::sign::{
    check_body, sign_answer, sign_call, verify_answer, Call, KeyRing, Purpose, Signature, Verifier,
    WINDOW,
};

static RING: LazyLock<KeyRing> = LazyLock::new(|| {
    KeyRing::derive(
        "fuzz-secret-0123456789,older-secret-0123456789",
        Purpose::Raft,
    )
    .expect("a valid secret list")
});

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 26 {
        return;
    }
    let (ts, now, node) = (u64_at(data, 0), u64_at(data, 8), u64_at(data, 16));
    let status = u16::from_le_bytes([data[24], data[25]]);
    let rest = &data[26..];
    let text = String::from_utf8_lossy(rest);
    let call = Call {
        method: "POST",
        path: "/raft/v1/append",
        node,
    };

    // Whatever the header says.
    if let Ok(s) = Signature::parse(&text) {
        assert_eq!(
            Signature::parse(&s.header()).ok(),
            Some(s.clone()),
            "{text:?}"
        );
        let _ = check_body(&s, rest);
    }
    let verifier = Verifier::new(RING.clone());
    let _ = verifier.check_head(Some(&text), call, now);
    let _ = verify_answer(&RING, Some(&text), status, call, "nonce", rest, now);
    let _ = KeyRing::derive(&text, Purpose::Pin);

    // A call signed at `ts`, checked at `now`.
    let fresh = ts.abs_diff(now) <= WINDOW.as_millis() as u64;
    let signed = sign_call(&RING, call, rest, ts);
    let header = signed.header();
    let checked = verifier.check_head(Some(&header), call, now);
    assert_eq!(
        checked.is_ok(),
        fresh,
        "signed at {ts}, checked at {now}: {checked:?}"
    );
    if let Ok(s) = checked {
        assert!(check_body(&s, rest).is_ok());
        assert!(
            verifier.check_head(Some(&header), call, now).is_err(),
            "a replay passed"
        );
    }
    let other = Call {
        node: node ^ 1,
        ..call
    };
    assert!(
        verifier.check_head(Some(&header), other, now).is_err(),
        "another node's call passed"
    );

    // Its answer, signed at `ts`, checked at `now`.
    let answer = sign_answer(RING.signer(), status, call, &signed.nonce, rest, ts);
    let verified = verify_answer(
        &RING,
        Some(&answer.header()),
        status,
        call,
        &signed.nonce,
        rest,
        now,
    );
    assert_eq!(
        verified.is_ok(),
        fresh,
        "answer signed at {ts}, checked at {now}: {verified:?}"
    );
});
