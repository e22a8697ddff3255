//! A limited tenant's `x-ratelimit-*` headers: their names, and the
//! reset durations written as OpenAI writes them, with integer arithmetic
//! only (they go on every response of a limited tenant).

use http::{HeaderMap, HeaderName};

/// A limited tenant's `x-ratelimit-*` headers.
pub type RateHeaders = HeaderMap;

pub(super) static REQUEST_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];

pub(super) static TOKEN_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// A duration as OpenAI writes its resets: `20ms`, `1.5s`, `6m0s`.
pub fn reset_text(ns: u64) -> String {
    let mut b = bytes::BytesMut::new();
    push_reset(&mut b, ns);
    String::from_utf8_lossy(&b).into_owned()
}

/// Appends `ns` as a reset duration (see [`reset_text`]), with integer
/// arithmetic only: it runs for every response of a limited tenant.
pub(super) fn push_reset(b: &mut bytes::BytesMut, ns: u64) {
    let ms = ns.div_ceil(1_000_000);
    if ms < 1000 {
        push_u64(b, ms);
        b.extend_from_slice(b"ms");
    } else if ms < 60_000 {
        push_u64(b, ms / 1000);
        let mut frac = ms % 1000;
        if frac != 0 {
            b.extend_from_slice(b".");
            // Three digits, trailing zeros dropped.
            let mut digits: usize = 3;
            while frac % 10 == 0 {
                frac /= 10;
                digits -= 1;
            }
            for _ in 0..digits.saturating_sub(decimal_len(frac)) {
                b.extend_from_slice(b"0");
            }
            push_u64(b, frac);
        }
        b.extend_from_slice(b"s");
    } else {
        push_u64(b, ms / 60_000);
        b.extend_from_slice(b"m");
        push_u64(b, (ms % 60_000) / 1000);
        b.extend_from_slice(b"s");
    }
}

pub(super) fn decimal_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// Appends `v` in decimal.
pub(super) fn push_u64(b: &mut bytes::BytesMut, v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = v;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    b.extend_from_slice(&digits[i..]);
}

/// Adds the headers to a response.
pub fn set_headers(headers: &mut HeaderMap, values: &RateHeaders) {
    for (name, value) in values {
        headers.insert(name.clone(), value.clone());
    }
}
