//! A client's request headers as the server handed them over: the fields
//! where the head holds them (the lean HTTP/1 server's inference POSTs,
//! see `zonegate_net::listen::Plain`) or a header map (every request hyper
//! serves: HTTP/2, and HTTP/1 that is not plain). The request path reads
//! a few of them and passes the rest on
//! ([`crate::dataplane::forward::put_backend_headers`]),
//! through this one view whichever it got.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use zonegate_net::http1::{is_header_text, HeadFields};

/// A client's request headers (see the module).
#[derive(Clone, Debug)]
pub enum ClientHeaders {
    Fields(HeadFields),
    Map(HeaderMap),
}

impl ClientHeaders {
    /// The first value of `name`, its surrounding whitespace trimmed.
    pub fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        match self {
            Self::Fields(fields) => fields.get(name.as_str().as_bytes()),
            Self::Map(map) => map.get(name).map(HeaderValue::as_bytes),
        }
    }

    /// The first value of `name` when it is visible text (what
    /// `HeaderValue::to_str` accepts: visible ASCII, spaces and tabs).
    pub fn text(&self, name: &HeaderName) -> Option<&str> {
        let value = self.get(name).filter(|v| is_header_text(v))?;
        std::str::from_utf8(value).ok()
    }

    /// The first value of `name` as a header value that shares the
    /// request's bytes (no copy).
    pub fn value(&self, name: &HeaderName) -> Option<HeaderValue> {
        match self {
            Self::Fields(fields) => {
                let value = fields.get(name.as_str().as_bytes())?;
                HeaderValue::from_maybe_shared(fields.shared(value)).ok()
            }
            Self::Map(map) => map.get(name).cloned(),
        }
    }

    /// Calls `f` with each header's name and value, in order.
    pub fn for_each<'a>(&'a self, mut f: impl FnMut(&'a [u8], &'a [u8])) {
        match self {
            Self::Fields(fields) => fields.iter().for_each(|(name, value)| f(name, value)),
            Self::Map(map) => map
                .iter()
                .for_each(|(name, value)| f(name.as_str().as_bytes(), value.as_bytes())),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use http::header;

    /// The fields of `head` and the same headers as a map.
    pub(crate) fn both(head: &'static str) -> [ClientHeaders; 2] {
        let fields = HeadFields::parse(Bytes::from_static(head.as_bytes())).expect("a head");
        let mut map = HeaderMap::new();
        for (name, value) in fields.iter() {
            map.append(
                HeaderName::from_bytes(name).expect("a name"),
                HeaderValue::from_maybe_shared(fields.shared(value)).expect("a value"),
            );
        }
        [ClientHeaders::Fields(fields), ClientHeaders::Map(map)]
    }

    #[test]
    fn fields_and_a_map_of_the_same_head_read_the_same() {
        let head = "Host: gw\r\nAuthorization:  Bearer k1 \r\nX-Request-Id: réq\r\n\
                    x-session-id: s1\nX-Session-Id: s2\r\nX-Empty:\r\n";
        for h in both(head) {
            assert_eq!(h.get(&header::AUTHORIZATION), Some(&b"Bearer k1"[..]));
            assert_eq!(h.text(&header::AUTHORIZATION), Some("Bearer k1"));
            let session = HeaderName::from_static("x-session-id");
            assert_eq!(h.text(&session), Some("s1"), "the first of two, any case");
            let id = HeaderName::from_static("x-request-id");
            assert!(h.get(&id).is_some());
            assert_eq!(h.text(&id), None, "not visible ASCII");
            assert_eq!(h.value(&id).expect("a value").as_bytes(), "réq".as_bytes());
            assert_eq!(h.text(&HeaderName::from_static("x-empty")), Some(""));
            assert_eq!(h.get(&header::COOKIE), None);
            let mut names = Vec::new();
            h.for_each(|name, _| names.push(name.to_ascii_lowercase()));
            assert_eq!(
                names,
                [
                    "host",
                    "authorization",
                    "x-request-id",
                    "x-session-id",
                    "x-session-id",
                    "x-empty"
                ]
                .map(|n| n.as_bytes().to_vec())
            );
        }
    }

    /// Up to 11 headers as a peer may send them: a token, or one of
    /// `special` (names the code under test treats apart), and a value of
    /// visible ASCII, tabs and obs-text (a char per Latin-1 byte).
    pub(crate) fn arb_headers(
        special: &[&str],
    ) -> impl proptest::strategy::Strategy<Value = Vec<(String, String)>> {
        let special: Vec<String> = special.iter().map(|s| s.to_string()).collect();
        proptest::collection::vec(
            (
                proptest::prop_oneof![
                    proptest::string::string_regex("[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,12}")
                        .expect("regex"),
                    proptest::sample::select(special),
                ],
                "[ -~\t\u{80}-\u{ff}]{0,20}",
            ),
            0..12,
        )
    }

    proptest::proptest! {
        /// Whatever headers a client sends, its fields read as a header map
        /// of the same headers would: the same first value by any name,
        /// the same text, the same headers in order, and the same lines
        /// for the backend (but for the names' case).
        #[test]
        fn fields_read_as_a_map_of_the_same_headers(
            headers in arb_headers(&[
                "Authorization", "x-request-id", "Connection", "Keep-Alive", "X-Listed",
                "content-length", "Host", "x-session-id", "close",
            ]),
            crlf in proptest::bool::ANY,
        ) {
            let mut head = Vec::new();
            let mut map = HeaderMap::new();
            for (name, value) in &headers {
                // Latin-1 bytes, as a client may send obs-text.
                let value: Vec<u8> = value.chars().map(|c| c as u32 as u8).collect();
                head.extend_from_slice(name.as_bytes());
                head.extend_from_slice(b": ");
                head.extend_from_slice(&value);
                head.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
                map.append(
                    HeaderName::from_bytes(name.as_bytes()).expect("a token"),
                    HeaderValue::from_bytes(value.trim_ascii()).expect("a value"),
                );
            }
            let fields = HeadFields::parse(Bytes::from(head)).expect("a head httparse takes");
            let [fields, map] = [ClientHeaders::Fields(fields), ClientHeaders::Map(map)];
            let mut names: Vec<HeaderName> = headers
                .iter()
                .map(|(n, _)| HeaderName::from_bytes(n.as_bytes()).expect("a token"))
                .collect();
            names.push(header::COOKIE);
            for name in &names {
                proptest::prop_assert_eq!(fields.get(name), map.get(name));
                proptest::prop_assert_eq!(fields.text(name), map.text(name));
                proptest::prop_assert_eq!(fields.value(name), map.value(name));
            }
            let all = |h: &ClientHeaders| {
                let mut all = Vec::new();
                h.for_each(|n, v| all.push((n.to_ascii_lowercase(), v.to_vec())));
                all
            };
            // A map keeps a name's values together, at its first place.
            let in_order = all(&fields);
            let first = |n: &[u8]| in_order.iter().position(|(m, _)| m == n);
            let mut grouped = in_order.clone();
            grouped.sort_by_key(|(n, _)| first(n));
            proptest::prop_assert_eq!(grouped, all(&map));
            let backend = |h: &ClientHeaders| {
                let mut out = Vec::new();
                crate::dataplane::forward::put_backend_headers(&mut out, h);
                out.to_ascii_lowercase()
            };
            let (from_fields, from_map) = (backend(&fields), backend(&map));
            let lines = |b: &[u8]| {
                let mut l: Vec<Vec<u8>> = b.split(|c| *c == b'\n').map(<[u8]>::to_vec).collect();
                l.sort();
                l
            };
            proptest::prop_assert_eq!(lines(&from_fields), lines(&from_map));
        }
    }
}
