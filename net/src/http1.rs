//! What both of zonegate's HTTP/1.1 parsers share: the server's
//! (`listen`'s lean server for plain requests) and the backend client's
//! (`zonegate::dataplane::upstream`). One definition, so the two agree on
//! what a valid `Content-Length` is.

use std::ops::Range;

/// A `Content-Length` value: digits only (surrounding blanks allowed), at
/// most 19 of them. No sign, no hex, no list: anything else is invalid.
pub fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Where `part`, a slice of `whole` (a header name or value httparse
/// found in a buffer), lies in it: kept while the buffer is still
/// borrowed, then cut from the buffer's frozen bytes without a copy.
pub fn span(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    start..start + part.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_digits_only() {
        assert_eq!(content_length(b"42"), Some(42));
        assert_eq!(content_length(b" 7 "), Some(7));
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b"1 2",
            b"0x10",
            b"99999999999999999999",
        ] {
            assert_eq!(content_length(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_span_cuts_the_same_bytes_from_the_whole() {
        let whole = b"name: value\r\n";
        let part = &whole[6..11];
        assert_eq!(&whole[span(whole, part)], b"value");
    }
}
