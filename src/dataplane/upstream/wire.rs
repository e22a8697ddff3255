//! HTTP/1.1 to backends on the wire: the request written, the response
//! head parsed, its body decoded. Bytes in, bytes out; the I/O is
//! `upstream`'s.
//!
//! A response is framed as RFC 9112 §6.3 says: no body for 204 and 304;
//! `Transfer-Encoding` ending in `chunked` is chunked (a `Content-Length`
//! beside it is ignored and the connection not reused); any other
//! `Transfer-Encoding`, or no length at all, reads to the close; one
//! `Content-Length` value (repeats must agree) is the length. 1xx answers
//! are skipped. A status outside 100–599 (RFC 9110 §15: three digits, the
//! first 1–5) is not an answer. Anything else is an error, and the
//! connection is closed.
//!
//! A content-coded answer (a `Content-Encoding` other than `identity`,
//! which zonegate never asks for: see [`encode_request`]) is not read as
//! an event stream whatever its type: its bytes are passed on untouched,
//! never framed into events, parsed or spliced.
//!
//! The head's hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, the
//! headers it names, `Keep-Alive`, `Transfer-Encoding`, `Trailer`,
//! `Upgrade`, `Proxy-Authenticate`) describe this connection only: they
//! are read here and left out of the answer's headers, so they never
//! reach the client; so are `Content-Length` (the client's framing is its
//! server's, from the body's length), and the headers zonegate writes on
//! an answer itself (`x-zonegate-*`, `x-request-id`), so that a backend
//! can neither forge nor double them. The rest are kept as the lines they
//! came as ([`HeadLines`]), not as a header map.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::StatusCode;
use smallvec::SmallVec;
use zonegate_net::http1::{
    content_length, list_items, may_end_head, name_is, put_header, put_number, span, written,
    HeadLines, Span,
};

/// Headers in one response at most (hyper's client allows 100 too).
const MAX_HEADERS: usize = 100;
/// A response head larger than this is refused.
const MAX_HEAD: usize = 64 * 1024;
/// A chunk-size line (with its extensions) at most.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Trailer bytes after the last chunk at most (they are read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

/// Writes the head of a POST of `body_len` bytes to `path`: the header
/// lines `headers` writes (whole `name: value\r\n` lines, the caller's
/// choice: no framing, hop-by-hop or `Accept-Encoding` header among
/// them), then `accept-encoding: identity` and the body's length.
///
/// zonegate reads what backends answer (event streams framed and spliced,
/// `usage` read for the token charge), so it asks for answers without a
/// content coding, whatever the client accepts (RFC 9110 §12.5.3). A
/// backend that codes its answer anyway has it passed on untouched
/// ([`parse_head`]).
pub(super) fn encode_request(
    out: &mut Vec<u8>,
    path: &str,
    headers: impl FnOnce(&mut Vec<u8>),
    body_len: usize,
) {
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    headers(out);
    out.extend_from_slice(b"accept-encoding: identity\r\ncontent-length: ");
    put_number(out, body_len as u64, 10);
    out.extend_from_slice(b"\r\n\r\n");
}

/// A response head, and how its body is read.
pub(super) struct Head {
    pub status: StatusCode,
    /// The headers the answer passes on.
    pub lines: HeadLines,
    pub decoder: Decoder,
    /// The connection may carry another request once the body is read.
    pub keep_alive: bool,
}

/// How far an incomplete response head has been looked at: kept across
/// the reads of one answer's head, so a head sent a byte at a time costs
/// linear work, not quadratic (as `zonegate_net::h1` does for requests).
#[derive(Debug, Default)]
pub(super) struct HeadScan {
    /// Bytes at the front of the buffer already parsed as incomplete.
    checked: usize,
}

/// Parses the response head at the front of `buf`, skipping 1xx answers;
/// `Ok(None)` while it is incomplete. The head's bytes are taken from
/// `buf`; what follows (the body's start) stays.
/// `spans` is scratch space, kept by the connection across answers;
/// `scan` is this answer's (a fresh one for each).
pub(super) fn parse_head(
    buf: &mut BytesMut,
    spans: &mut Vec<Span>,
    scan: &mut HeadScan,
) -> Result<Option<Head>, String> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Parsed again only once the bytes read since may end the head.
        if scan.checked > 0 && buf.len() < MAX_HEAD {
            examined(buf.len() - scan.checked.saturating_sub(3));
            let ends = may_end_head(buf, scan.checked);
            scan.checked = buf.len();
            if !ends {
                return Ok(None);
            }
        }
        examined(buf.len());
        // Left uninitialised: httparse writes each header it finds.
        let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut raw);
        let len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {
                scan.checked = buf.len();
                return Ok(None);
            }
            Ok(httparse::Status::Partial) => return Err("a response head over 64 KiB".into()),
            Err(e) => return Err(format!("an invalid response head: {e}")),
        };
        let code = resp.code.unwrap_or(0);
        if (100..200).contains(&code) && code != 101 {
            buf.advance(len);
            scan.checked = 0;
            continue;
        }
        if code == 101 {
            return Err("a protocol switch (101) nobody asked for".into());
        }
        // `StatusCode` takes up to 999; a client's parser may not.
        let status = StatusCode::from_u16(code)
            .ok()
            .filter(|_| code <= 599)
            .ok_or_else(|| format!("status {code}, outside 100–599"))?;
        let http11 = resp.version == Some(1);
        let mut keep_alive = http11;
        let mut chunked = None;
        let mut length = None;
        let mut sse = None;
        // Header names the `Connection` header lists (hop-by-hop too).
        let mut listed: SmallVec<[&[u8]; 4]> = SmallVec::new();
        spans.clear();
        for h in resp.headers.iter() {
            let name = h.name.as_bytes();
            if name_is(name, b"transfer-encoding") {
                // The final coding is the last token of the last header.
                let last = h.value.rsplit(|b| *b == b',').next().unwrap_or(b"");
                chunked = Some(name_is(last.trim_ascii(), b"chunked"));
            } else if name_is(name, b"content-length") {
                for item in h.value.split(|b| *b == b',') {
                    let n = content_length(item).ok_or("an invalid Content-Length")?;
                    if length.is_some_and(|l| l != n) {
                        return Err("conflicting Content-Length values".into());
                    }
                    length = Some(n);
                }
            } else if name_is(name, b"connection") {
                for token in list_items(h.value) {
                    if name_is(token, b"close") {
                        keep_alive = false;
                    } else if name_is(token, b"keep-alive") && !http11 {
                        keep_alive = true;
                    }
                    listed.push(token);
                }
            }
            spans.push((span(buf, name), span(buf, h.value)));
        }
        // Linear in the names a hostile backend lists, times the headers.
        let mut dated = false;
        let mut coded = false;
        let lines = written(|lines| {
            for (name, value) in spans.iter() {
                let name = &buf[name.clone()];
                let passed = !(NOT_PASSED.iter().any(|h| name_is(name, h))
                    || listed.iter().any(|l| name.eq_ignore_ascii_case(l))
                    || is_zonegates(name));
                if passed {
                    let value = &buf[value.clone()];
                    dated |= name_is(name, b"date");
                    // The first type the client gets is the one that counts.
                    if sse.is_none() && name_is(name, b"content-type") {
                        sse = Some(value.starts_with(b"text/event-stream"));
                    }
                    coded |= name_is(name, b"content-encoding")
                        && list_items(value).any(|c| !name_is(c, b"identity"));
                    put_header(lines, name, value);
                }
            }
        });
        drop(listed);
        let decoder = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Decoder::Done
        } else {
            match (chunked, length) {
                (Some(true), l) => {
                    // Both framings given: read it chunked, never reuse it.
                    keep_alive &= l.is_none();
                    Decoder::Chunked(Chunk::Size(0))
                }
                (Some(false), _) | (None, None) => {
                    keep_alive = false;
                    Decoder::Close
                }
                (None, Some(n)) => Decoder::Length(n),
            }
        };
        buf.advance(len);
        return Ok(Some(Head {
            status,
            lines: HeadLines {
                lines,
                dated,
                // A coded stream's bytes are not events zonegate can read.
                event_stream: sse.unwrap_or(false) && !coded,
            },
            decoder,
            keep_alive,
        }));
    }
}

/// Response headers not passed on: those that describe the backend's
/// connection only (hop-by-hop), and the framing the server writes
/// itself.
const NOT_PASSED: [&[u8]; 8] = [
    b"content-length",
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"trailer",
    b"upgrade",
    b"proxy-authenticate",
    b"te",
];

/// A header zonegate writes on every answer itself.
fn is_zonegates(name: &[u8]) -> bool {
    const PREFIX: &[u8] = b"x-zonegate-";
    name.get(..PREFIX.len()).is_some_and(|p| name_is(p, PREFIX)) || name_is(name, b"x-request-id")
}

/// How much of a response body is still to come, and in what shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decoder {
    /// This many bytes.
    Length(u64),
    Chunked(Chunk),
    /// Until the backend closes the connection.
    Close,
    Done,
}

/// Where a chunked body's reading stands. A size line or a trailer line
/// not yet whole keeps how much of it was looked at, so one trickled a
/// byte at a time is searched once, not again at every byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Chunk {
    /// A chunk-size line is next; this many bytes of it were looked at
    /// (no line feed among them).
    Size(usize),
    /// This many bytes of the current chunk.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk: bytes taken so far, and bytes
    /// of the current line looked at (no CRLF ends among them).
    Trailers { seen: usize, checked: usize },
}

#[cfg(test)]
thread_local! {
    /// Bytes this thread's head parses and decoders looked at (tests
    /// assert it stays linear in the bytes read).
    pub(super) static EXAMINED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts bytes looked at (tests only).
fn examined(_n: usize) {
    #[cfg(test)]
    EXAMINED.with(|e| e.set(e.get() + _n));
}

/// What one [`Decoder::step`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    Data(Bytes),
    /// `buf` holds no more of the body: read.
    NeedMore,
    Done,
}

impl Decoder {
    /// Takes the next piece of the body from `buf`.
    pub(super) fn step(&mut self, buf: &mut BytesMut) -> Result<Step, &'static str> {
        loop {
            let chunk = match self {
                Decoder::Done | Decoder::Length(0) => {
                    *self = Decoder::Done;
                    return Ok(Step::Done);
                }
                Decoder::Length(left) => return Ok(take(buf, left)),
                Decoder::Close if buf.is_empty() => return Ok(Step::NeedMore),
                Decoder::Close => return Ok(Step::Data(buf.split().freeze())),
                Decoder::Chunked(chunk) => chunk,
            };
            match chunk {
                Chunk::Size(checked) => {
                    // Parsed once its line feed is in.
                    let from = (*checked).min(buf.len());
                    examined(buf.len() - from);
                    let parsed = match memchr::memchr(b'\n', &buf[from..]) {
                        None => Ok(httparse::Status::Partial),
                        Some(_) => httparse::parse_chunk_size(buf),
                    };
                    match parsed {
                        Ok(httparse::Status::Complete((used, size))) => {
                            examined(used);
                            buf.advance(used);
                            *chunk = if size == 0 {
                                Chunk::Trailers {
                                    seen: 0,
                                    checked: 0,
                                }
                            } else {
                                Chunk::Data(size)
                            };
                        }
                        Ok(httparse::Status::Partial) if buf.len() <= MAX_CHUNK_LINE => {
                            *checked = buf.len();
                            return Ok(Step::NeedMore);
                        }
                        _ => return Err("an invalid chunk-size line"),
                    }
                }
                Chunk::Data(left) => {
                    let step = take(buf, left);
                    if *left == 0 {
                        // The data's CRLF, taken with it when it is in:
                        // a buffer emptied by a whole chunk tells the relay
                        // that nothing more was read (`UpstreamBody::buffered`).
                        *chunk = if buf.starts_with(b"\r\n") {
                            buf.advance(2);
                            Chunk::Size(0)
                        } else {
                            Chunk::DataEnd
                        };
                    }
                    return Ok(step);
                }
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Step::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("a chunk's data not followed by CRLF");
                    }
                    buf.advance(2);
                    *chunk = Chunk::Size(0);
                }
                Chunk::Trailers { seen, checked } => {
                    // The first CRLF, looked for from where the last look
                    // ended (a CR just before it pairs with a line feed
                    // just after).
                    let from = (*checked).min(buf.len());
                    examined(buf.len() - from);
                    let crlf = memchr::memchr_iter(b'\n', &buf[from..])
                        .map(|at| from + at)
                        .find(|&at| at > 0 && buf[at - 1] == b'\r');
                    let Some(end) = crlf.map(|at| at - 1) else {
                        if *seen + buf.len() > MAX_TRAILERS {
                            return Err("trailers over 16 KiB");
                        }
                        *checked = buf.len();
                        return Ok(Step::NeedMore);
                    };
                    buf.advance(end + 2);
                    *seen += end + 2;
                    *checked = 0;
                    if end == 0 {
                        *self = Decoder::Done;
                        return Ok(Step::Done);
                    }
                    if *seen > MAX_TRAILERS {
                        return Err("trailers over 16 KiB");
                    }
                }
            }
        }
    }

    /// The backend closed the connection: the end of a body read to the
    /// close, else a cut one.
    pub(super) fn eof(&mut self) -> Result<(), &'static str> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(())
            }
            _ => Err("the backend closed the connection before the answer ended"),
        }
    }

    /// No byte of the body is left to read.
    pub(super) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done | Decoder::Length(0))
    }
}

/// Up to `left` bytes from `buf`.
fn take(buf: &mut BytesMut, left: &mut u64) -> Step {
    if buf.is_empty() {
        return Step::NeedMore;
    }
    let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
    *left -= n as u64;
    Step::Data(buf.split_to(n).freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in pieces of `piece` bytes: the body, or the error.
    fn decode(wire: &[u8], piece: usize) -> Result<(Vec<u8>, Decoder, usize), String> {
        let mut buf = BytesMut::new();
        let mut pieces = wire.chunks(piece);
        let mut head = None;
        let mut scan = HeadScan::default();
        while head.is_none() {
            match parse_head(&mut buf, &mut Vec::new(), &mut scan)? {
                Some(h) => head = Some(h),
                None => buf.extend_from_slice(pieces.next().ok_or("head cut")?),
            }
        }
        let mut decoder = head.map(|h| h.decoder).ok_or("no head")?;
        let mut body = Vec::new();
        loop {
            match decoder.step(&mut buf)? {
                Step::Data(d) => body.extend_from_slice(&d),
                Step::Done => return Ok((body, decoder, buf.len())),
                Step::NeedMore => match pieces.next() {
                    Some(p) => buf.extend_from_slice(p),
                    None => {
                        decoder.eof()?;
                        return Ok((body, decoder, buf.len()));
                    }
                },
            }
        }
    }

    #[test]
    fn bodies_decode_the_same_however_the_bytes_arrive() {
        let cases: [(&[u8], &str); 7] = [
            (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", "hello"),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n",
                "hello, world",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n",
                "abc",
            ),
            (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", "ok"),
            (b"HTTP/1.1 200 OK\r\n\r\nto the close", "to the close"),
            (b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n", ""),
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok", "ok"),
        ];
        for (wire, body) in cases {
            for piece in [1, 2, 3, 7, wire.len()] {
                let (got, decoder, left) = decode(wire, piece).unwrap_or_else(|e| {
                    panic!("{:?} by {piece}: {e}", String::from_utf8_lossy(wire))
                });
                assert_eq!(String::from_utf8_lossy(&got), body, "by {piece}");
                assert_eq!(decoder, Decoder::Done);
                assert_eq!(left, 0);
            }
        }
    }

    /// A whole chunk leaves nothing behind it in the buffer (its CRLF goes
    /// with its data), so an empty buffer means nothing more was read; a
    /// chunk's data followed by anything but CRLF is refused, however the
    /// bytes arrive.
    #[test]
    fn a_whole_chunk_takes_its_crlf_and_a_wrong_one_is_refused() {
        let mut decoder = Decoder::Chunked(Chunk::Size(0));
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n"[..]);
        assert_eq!(
            decoder.step(&mut buf),
            Ok(Step::Data(Bytes::from_static(b"hello")))
        );
        assert!(buf.is_empty(), "{buf:?}");
        assert_eq!(decoder.step(&mut buf), Ok(Step::NeedMore));
        let wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n";
        for piece in [1, 2, 3, 7, wire.len()] {
            assert_eq!(
                decode(wire, piece).err(),
                Some("a chunk's data not followed by CRLF".to_owned()),
                "by {piece}"
            );
        }
    }

    #[test]
    fn a_head_trickled_a_byte_at_a_time_is_parsed_in_linear_work() {
        // A backend that sends its head a byte per read: each byte must not
        // make the reader parse everything held again.
        let mut wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..90 {
            wire.extend_from_slice(format!("x-filler-{i}: {}\r\n", "v".repeat(80)).as_bytes());
        }
        wire.extend_from_slice(b"content-length: 2\r\n\r\nok");
        let mut buf = BytesMut::new();
        let mut scan = HeadScan::default();
        let mut spans = Vec::new();
        let mut bytes = wire.iter();
        EXAMINED.with(|e| e.set(0));
        let head = loop {
            if let Some(head) = parse_head(&mut buf, &mut spans, &mut scan).expect("valid") {
                break head;
            }
            buf.extend_from_slice(&[*bytes.next().expect("the head ends")]);
        };
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.lines.iter().count(), 90);
        let looked = EXAMINED.with(std::cell::Cell::get);
        assert!(
            looked <= 8 * wire.len(),
            "{looked} bytes looked at for a head of {}",
            wire.len()
        );
    }

    #[test]
    fn a_chunked_body_trickled_a_byte_at_a_time_is_decoded_in_linear_work() {
        // Long chunk extensions and trailers, a byte per read: each byte
        // must not make the decoder search its line again.
        let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;".to_vec();
        wire.extend(std::iter::repeat_n(b'x', 3000));
        wire.extend_from_slice(b"\r\nhello\r\n0\r\n");
        for i in 0..10 {
            wire.extend_from_slice(format!("x-t{i}: {}\r\n", "v\r".repeat(500)).as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        EXAMINED.with(|e| e.set(0));
        let (body, decoder, left) = decode(&wire, 1).expect("decoded");
        assert_eq!(
            (&body[..], decoder, left),
            (&b"hello"[..], Decoder::Done, 0)
        );
        let looked = EXAMINED.with(std::cell::Cell::get);
        assert!(
            looked <= 4 * wire.len(),
            "{looked} bytes looked at for a body of {}",
            wire.len()
        );
    }

    #[test]
    fn a_response_is_reused_only_when_its_end_is_known_and_nobody_said_close() {
        let keep = |wire: &[u8]| {
            let mut buf = BytesMut::from(wire);
            parse_head(&mut buf, &mut Vec::new(), &mut HeadScan::default())
                .expect("valid")
                .expect("complete")
                .keep_alive
        };
        assert!(keep(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(keep(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        ));
        assert!(!keep(b"HTTP/1.1 200 OK\r\n\r\n"));
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"
        ));
        assert!(!keep(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(keep(
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_left_out_of_the_answer() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Private\r\nKeep-Alive: timeout=5\r\n\
               x-private: 1\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\
               Proxy-Authenticate: Basic\r\nconnection: , X-Other ,,bad name\r\nx-other: 2\r\n\
               Date: Tue, 01 Dec 2026 10:00:00 GMT\r\nX-Zonegate-Backend: forged\r\n\
               Content-Type: text/event-stream\r\nx-request-id: r1\r\nx-zonegatex: 3\r\n\r\n\
               5\r\nhello\r\n"[..],
        );
        let head = parse_head(&mut buf, &mut Vec::new(), &mut HeadScan::default())
            .expect("valid")
            .expect("complete");
        assert_eq!(
            head.lines.lines,
            &b"Date: Tue, 01 Dec 2026 10:00:00 GMT\r\nContent-Type: text/event-stream\r\nx-zonegatex: 3\r\n"[..],
            "passed on as the backend wrote them, in order; zonegate's own are zonegate's to write"
        );
        assert!(
            head.lines.event_stream,
            "an event stream, by its content type"
        );
        assert!(head.keep_alive, "still read: the connection is reusable");
        assert!(matches!(head.decoder, Decoder::Chunked(_)), "and chunked");
        assert_eq!(&buf[..], b"5\r\nhello\r\n", "the body's start stays");
    }

    #[test]
    fn an_answer_is_an_event_stream_by_the_first_content_type_the_client_gets() {
        let sse = |head: &str| {
            let mut buf = BytesMut::from(
                format!("HTTP/1.1 200 OK\r\n{head}content-length: 0\r\n\r\n").as_str(),
            );
            let head = parse_head(&mut buf, &mut Vec::new(), &mut HeadScan::default())
                .expect("valid")
                .expect("complete");
            head.lines.event_stream
        };
        assert!(sse("Content-Type: text/event-stream; charset=utf-8\r\n"));
        assert!(!sse(
            "content-type: application/json\r\ncontent-type: text/event-stream\r\n"
        ));
        // A type the backend named hop-by-hop never reaches the client.
        assert!(!sse(
            "connection: content-type\r\ncontent-type: text/event-stream\r\n"
        ));
        assert!(!sse(""));
    }

    #[test]
    fn a_content_coded_stream_is_passed_on_unread_not_as_events() {
        let head = |lines: &str| {
            let mut buf = BytesMut::from(
                format!("HTTP/1.1 200 OK\r\n{lines}transfer-encoding: chunked\r\n\r\n").as_str(),
            );
            parse_head(&mut buf, &mut Vec::new(), &mut HeadScan::default())
                .expect("valid")
                .expect("complete")
        };
        let gzip = head("content-type: text/event-stream\r\nContent-Encoding: gzip\r\n");
        assert!(!gzip.lines.event_stream, "never framed, parsed or spliced");
        assert_eq!(
            gzip.lines.get(b"content-encoding"),
            Some(&b"gzip"[..]),
            "and its coding reaches the client with it"
        );
        assert!(
            !head("content-encoding: identity, br\r\ncontent-type: text/event-stream\r\n")
                .lines
                .event_stream
        );
        assert!(
            head("content-encoding: identity\r\ncontent-type: text/event-stream\r\n")
                .lines
                .event_stream
        );
    }

    #[test]
    fn the_length_is_the_servers_to_write_and_the_date_is_passed_on() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nServer: vllm\r\ncontent-length: 2\r\ndate: x\r\n\r\nok"[..],
        );
        let head = parse_head(&mut buf, &mut Vec::new(), &mut HeadScan::default())
            .expect("valid")
            .expect("complete");
        assert_eq!(head.lines.lines, &b"Server: vllm\r\ndate: x\r\n"[..]);
        assert!(head.lines.dated);
        assert!(!head.lines.event_stream);
        assert_eq!(head.decoder, Decoder::Length(2));
    }

    #[test]
    fn broken_framing_is_an_error_never_a_short_success() {
        let cases: [&[u8]; 12] = [
            b"HTTP/1.1 999 Odd\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 600 Odd\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 099 Odd\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        ];
        for wire in cases {
            for piece in [1, wire.len()] {
                assert!(
                    decode(wire, piece).is_err(),
                    "{:?} by {piece}",
                    String::from_utf8_lossy(wire)
                );
            }
        }
        // Endless chunk extensions and trailers are cut off.
        let mut long = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;".to_vec();
        long.extend(std::iter::repeat_n(b'x', 8 * 1024));
        assert!(decode(&long, 1024).is_err());
        let mut trailers = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n".to_vec();
        for _ in 0..2000 {
            trailers.extend_from_slice(b"x-t: 1234567\r\n");
        }
        assert!(decode(&trailers, 4096).is_err());
    }

    #[test]
    fn any_mix_of_answer_fragments_decodes_as_it_would_at_once_or_fails_without_a_panic() {
        // A hostile backend's bytes: pieces of valid answers in any order,
        // cut anywhere. Every outcome is an error or a body whose end was
        // really seen; none is a panic.
        const PIECES: [&[u8]; 16] = [
            b"HTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"transfer-encoding: chunked\r\n",
            b"content-length: 5\r\n",
            b"content-length: 18446744073709551615\r\n",
            b"connection: close\r\n",
            b"\r\n",
            b"5\r\nhello\r\n",
            b"0\r\n\r\n",
            b"ffffffff\r\n",
            b";ext=\"x\"\r\n",
            b"hello",
            b"x-t: 1\r\n",
            b"\n",
            b"\x00\xff",
            b"HTTP/1.1 204 No Content\r\n",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };
        let (mut decoded, mut refused) = (0, 0);
        for _ in 0..3_000 {
            let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
            for _ in 0..next(12) {
                wire.extend_from_slice(PIECES[next(PIECES.len())]);
            }
            let piece = 1 + next(16);
            let shown = String::from_utf8_lossy(&wire);
            let by_pieces = decode(&wire, piece);
            // However the bytes arrive (the head and line searches resume
            // where they stopped), the outcome is the one of all at once.
            let at_once = decode(&wire, wire.len());
            assert_eq!(
                by_pieces.as_ref().map(|(body, ..)| body).ok(),
                at_once.as_ref().map(|(body, ..)| body).ok(),
                "{shown:?} by {piece}"
            );
            match by_pieces {
                Ok((_, decoder, _)) => {
                    assert_eq!(decoder, Decoder::Done, "{shown:?}");
                    decoded += 1;
                }
                Err(_) => refused += 1,
            }
        }
        assert!(
            decoded > 100 && refused > 100,
            "{decoded} decoded, {refused} refused"
        );
    }

    proptest::proptest! {
        /// Whatever headers a backend sends, the lines passed on are
        /// whole `name: value\r\n` lines, read back as exactly the
        /// headers kept, in order: none that frames or names the
        /// connection, none of zonegate's, no CR or LF inside a line.
        #[test]
        fn the_lines_passed_on_are_the_headers_kept_and_nothing_else(
            headers in crate::dataplane::request::headers::tests::arb_headers(&[
                "Content-Length", "date", "Connection", "keep-alive", "TE",
                "x-zonegate-route", "X-Request-Id", "x-listed", "content-type",
            ]),
        ) {
            let mut wire = b"HTTP/1.1 200 OK\r\nconnection: x-listed\r\n".to_vec();
            for (name, value) in &headers {
                wire.extend_from_slice(name.as_bytes());
                wire.extend_from_slice(b": ");
                // Latin-1 bytes, as a backend may send obs-text.
                wire.extend(value.chars().map(|c| c as u32 as u8));
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"\r\n");
            let mut buf = BytesMut::from(&wire[..]);
            let Ok(Some(head)) = parse_head(&mut buf, &mut Vec::new(), &mut HeadScan::default()) else {
                // Refused (a length httparse or the framing rules reject):
                // nothing is passed on then.
                return Ok(());
            };
            let lines = &head.lines.lines;
            proptest::prop_assert!(lines.is_empty() || lines.ends_with(b"\r\n"));
            for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let line = line.strip_suffix(b"\r").expect("CRLF");
                proptest::prop_assert!(!line.contains(&b'\r'));
            }
            // Names a `Connection` header lists are hop-by-hop too: the
            // head's own `x-listed`, and any a generated one names.
            let latin1 = |v: &str| v.chars().map(|c| c as u32 as u8).collect::<Vec<u8>>();
            let mut listed = vec![b"x-listed".to_vec()];
            for (name, value) in &headers {
                if name.eq_ignore_ascii_case("connection") {
                    let value = latin1(value);
                    listed.extend(list_items(&value).map(<[u8]>::to_ascii_lowercase));
                }
            }
            let dropped = |name: &str| {
                let name = name.to_ascii_lowercase();
                NOT_PASSED.iter().any(|n| n == &name.as_bytes())
                    || listed.iter().any(|l| l == name.as_bytes())
                    || is_zonegates(name.as_bytes())
            };
            let kept: Vec<(Vec<u8>, Vec<u8>)> = headers
                .iter()
                .filter(|(name, _)| !dropped(name))
                .map(|(name, value)| (name.as_bytes().to_vec(), latin1(value).trim_ascii().to_vec()))
                .collect();
            let read: Vec<(Vec<u8>, Vec<u8>)> =
                head.lines.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
            proptest::prop_assert_eq!(read, kept);
        }
    }

    #[test]
    fn the_request_head_is_the_callers_headers_then_the_bodys_length() {
        let mut out = Vec::new();
        let path = "/v1/chat/completions?x=1";
        let headers = |out: &mut Vec<u8>| {
            put_header(out, b"Content-Type", b"application/json");
            put_header(out, b"host", b"b:8000");
        };
        encode_request(&mut out, path, headers, 42);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nContent-Type: application/json\r\n\
             host: b:8000\r\naccept-encoding: identity\r\ncontent-length: 42\r\n\r\n"
        );
    }
}
