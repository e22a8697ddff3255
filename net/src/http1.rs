//! What both of zonegate's HTTP/1.1 parsers share: the server's
//! (`listen`'s lean server for plain requests) and the backend client's
//! (`zonegate::dataplane::upstream`). One definition, so the two agree on
//! what a valid `Content-Length` is, and read their connections the same
//! way ([`poll_read`]).

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use smallvec::SmallVec;
use tokio::io::AsyncRead;

/// Free space a connection's read asks for.
pub const READ_SPACE: usize = 8 * 1024;

/// Reads into `buf`'s free space; 0 is the end of the stream. An empty
/// buffer nothing else shares starts over at its front, so a keep-alive
/// connection's requests (or answers) land on the same few cache lines
/// instead of walking through the whole buffer before it is reclaimed.
/// With less than `READ_SPACE / 2` free, it grows by `READ_SPACE`.
pub fn poll_read<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.is_empty() && buf.capacity() < READ_SPACE {
        // Past its front (or grown smaller by a split). Asking for more
        // than it has succeeds only by moving back to the front; it never
        // allocates.
        let _ = buf.try_reclaim(buf.capacity() + 1);
    }
    if buf.capacity() - buf.len() < READ_SPACE / 2 {
        buf.reserve(READ_SPACE);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// Whether the bytes of `buf` from `from` on (with the three before,
/// where an end may begin) hold an empty line: the end of a head (CRLF or
/// bare LF lines, as httparse takes them). A reader that parsed the first
/// `from` bytes of a head as incomplete parses again only when this says
/// the new bytes may end it: a head trickled a byte at a time then costs
/// linear work, not a parse of everything held per byte.
pub fn may_end_head(buf: &[u8], from: usize) -> bool {
    let tail = buf.get(from.saturating_sub(3)..).unwrap_or_default();
    tail.windows(2).any(|w| w == b"\n\n") || tail.windows(3).any(|w| w == b"\n\r\n")
}

/// Byte ranges of one header's name and value within a head.
pub type Span = (Range<usize>, Range<usize>);

/// A `Content-Length` value: digits only (surrounding blanks allowed), at
/// most 19 of them. No sign, no hex, no list: anything else is invalid.
pub fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The items of a comma-separated header value (the names `Connection`
/// lists, a `Transfer-Encoding`'s codings), blanks trimmed, empty ones
/// skipped.
pub fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty())
}

/// Whether `value` is header text as it is: visible ASCII, spaces and
/// tabs (what `HeaderValue::to_str` reads and `from_str` takes). Eight
/// bytes at a time; a word holding a tab (or anything else) is looked at
/// byte by byte.
pub fn is_header_text(value: &[u8]) -> bool {
    let text = |b: &u8| *b == b'\t' || (b' '..=b'~').contains(b);
    let mut words = value.chunks_exact(8);
    words.all(|w| all_visible(word(w)) || w.iter().all(text)) && words.remainder().iter().all(text)
}

/// Whether `name` is `lower`, a name in lower-case ASCII, in any case:
/// what `name.eq_ignore_ascii_case(lower)` says, eight bytes at a time.
/// A request compares its header names with a few dozen known ones (what
/// to forward, what frames a body); byte by byte that was ~1k of the
/// ~30k instructions a proxied request takes (callgrind).
#[inline]
pub fn name_is(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(
        lower
            .iter()
            .all(|b| b.is_ascii() && !b.is_ascii_uppercase()),
        "{lower:?} is not lower-case ASCII"
    );
    if name.len() != lower.len() {
        return false;
    }
    if name.len() < 8 {
        return name
            .iter()
            .zip(lower)
            .all(|(n, l)| n.to_ascii_lowercase() == *l);
    }
    // Whole words, then the last eight bytes (overlapping the last whole
    // word): a plain loop, which every caller inlines the same way (an
    // iterator chain here was a call per comparison in some callers).
    let mut at = 0;
    while at + 8 <= name.len() {
        if !folds_to(word(&name[at..]), word(&lower[at..])) {
            return false;
        }
        at += 8;
    }
    let last = name.len() - 8;
    at == name.len() || folds_to(word(&name[last..]), word(&lower[last..]))
}

/// The first eight bytes of `b` (which has eight or more) as a word.
fn word(b: &[u8]) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = ONES * 0x80;

/// Whether each byte of `n` equals the byte of `l` (lower-case ASCII) at
/// its place, a letter's in either case. A byte of `l` is below 0x80, so
/// adding to it carries into no other byte: its high bit then says
/// whether it is at least `a`, and whether it is past `z`.
fn folds_to(n: u64, l: u64) -> bool {
    let from_a = l.wrapping_add(ONES * u64::from(0x80 - b'a')) & HIGH;
    let past_z = l.wrapping_add(ONES * u64::from(0x80 - b'z' - 1)) & HIGH;
    // 0x20, the case bit, at each letter of `l`.
    let letters = (from_a & !past_z) >> 2;
    (n | letters) == l
}

/// Whether every byte of `w` is visible ASCII or a space (0x20..=0x7e):
/// no high bit, none below a space, none a DEL (the classic tests for a
/// byte below n and a zero byte, exact for "any").
fn all_visible(w: u64) -> bool {
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let del = w ^ (ONES * 0x7f);
    let has_del = del.wrapping_sub(ONES) & !del & HIGH;
    ((w & HIGH) | below_space | has_del) == 0
}

/// Where `part`, a slice of `whole` (a header name or value httparse
/// found in a buffer), lies in it: kept while the buffer is still
/// borrowed, then cut from the buffer's frozen bytes without a copy.
pub fn span(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    start..start + part.len()
}

/// The headers at `spans` of `head` (a head's frozen bytes), values
/// sharing them, in a map with room for `extra` more (the headers its
/// user adds, so that adding them never regrows and rehashes it); `None`
/// when `http` refuses a name or value httparse let through.
pub fn header_map(head: &Bytes, spans: &[Span], extra: usize) -> Option<HeaderMap> {
    let mut headers = HeaderMap::with_capacity(spans.len() + extra);
    for (name, value) in spans {
        let name = HeaderName::from_bytes(&head[name.clone()]).ok()?;
        let value = HeaderValue::from_maybe_shared(head.slice(value.clone())).ok()?;
        headers.append(name, value);
    }
    Some(headers)
}

/// A request's header fields where its head holds them: what the lean
/// server hands over, as a request extension with an empty header map,
/// for the POSTs a listener names (`ListenConfig::head_fields_for`). A
/// handler that reads a few headers and passes the rest on (the data
/// plane's inference endpoints) builds and drops no map per request.
///
/// Names and values are as httparse read them (values without their
/// surrounding blanks, names in the client's case), framing headers
/// included; httparse refuses a line break inside either. The first field
/// of a name is the one [`HeadFields::get`] finds, as in a header map.
#[derive(Clone, Debug, Default)]
pub struct HeadFields {
    head: Bytes,
    /// Each field's name and value, as start and end offsets in `head`.
    fields: SmallVec<[[u32; 4]; 12]>,
}

impl HeadFields {
    /// The fields at `spans` of `head` (a head's frozen bytes, see
    /// [`span`]); `None` if an offset does not fit in 32 bits.
    pub fn new(head: Bytes, spans: &[Span]) -> Option<Self> {
        let offset = |n: usize| u32::try_from(n).ok();
        let fields = spans
            .iter()
            .map(|(name, value)| {
                Some([
                    offset(name.start)?,
                    offset(name.end)?,
                    offset(value.start)?,
                    offset(value.end)?,
                ])
            })
            .collect::<Option<_>>()?;
        Some(Self { head, fields })
    }

    /// The header fields of `block`, a head's header lines each ended by
    /// CRLF or LF, with or without the empty line that ends the head;
    /// `None` if httparse refuses them.
    pub fn parse(block: Bytes) -> Option<Self> {
        if block.is_empty() {
            return Some(Self::default());
        }
        let mut raw = [httparse::EMPTY_HEADER; 100];
        // An empty line after the last, if there is none: parsed as a
        // whole head.
        let mut text = block.to_vec();
        text.extend_from_slice(b"\r\n");
        let httparse::Status::Complete((_, found)) =
            httparse::parse_headers(&text, &mut raw).ok()?
        else {
            return None;
        };
        let spans: Vec<Span> = found
            .iter()
            .map(|h| (span(&text, h.name.as_bytes()), span(&text, h.value)))
            .collect();
        Self::new(block, &spans)
    }

    /// Each field's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter().map(|&[ns, ne, vs, ve]| {
            let at = |s: u32, e: u32| &self.head[s as usize..e as usize];
            (at(ns, ne), at(vs, ve))
        })
    }

    /// The first value of the header `name` (in lower case, as a
    /// `HeaderName`'s text always is; the fields' names in any case). A
    /// field is compared only when its name has `name`'s length.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        let at = |s: u32, e: u32| &self.head[s as usize..e as usize];
        self.fields
            .iter()
            .find(|&&[ns, ne, ..]| name_is(at(ns, ne), name))
            .map(|&[.., vs, ve]| at(vs, ve))
    }

    /// `part` (a name or value this returned) as bytes that share the
    /// head's, without a copy.
    pub fn shared(&self, part: &[u8]) -> Bytes {
        self.head.slice_ref(part)
    }
}

/// Response headers kept as the lines they are written as, `name:
/// value\r\n` each, in a response's extensions: what a proxy passes on
/// (a backend's headers, its own) without building and dropping a header
/// map per answer. The lean server writes them after the response's map;
/// hyper's paths move them into the map first ([`HeadLines::fold_into`]).
///
/// The lines hold no framing (`content-length`, `transfer-encoding`) and
/// no `connection`: those are the server's to write, from the map and the
/// body. They hold a `date` only when `dated` says so (a backend's, passed
/// on); else the server adds its own. `event_stream` says what their
/// first `Content-Type` is, read once by whoever made them (a server
/// draining its streams asks). Their names and values are what
/// httparse accepts; one that `http` refuses is written by the lean
/// server and left out by hyper's paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeadLines {
    pub lines: Bytes,
    /// The lines hold a `date`.
    pub dated: bool,
    /// Their first `Content-Type` is `text/event-stream` (and, for a
    /// proxied answer, no content coding hides its events: a coded one is
    /// passed on as bytes, and a drain ends it without an error event).
    pub event_stream: bool,
}

impl HeadLines {
    /// Each line, without its CRLF.
    fn each(&self) -> impl Iterator<Item = &[u8]> {
        memchr::memchr_iter(b'\n', &self.lines).scan(0, |start, end| {
            let line = &self.lines[std::mem::replace(start, end + 1)..end];
            Some(line.strip_suffix(b"\r").unwrap_or(line))
        })
    }

    /// Each line's name and value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.each().filter_map(|line| {
            let colon = memchr::memchr(b':', line)?;
            Some((&line[..colon], line[colon + 1..].trim_ascii()))
        })
    }

    /// The first value of the header `name` (in lower case): a line is
    /// looked at only as far as `name` is long.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.each().find_map(|line| {
            let named = line.get(name.len()) == Some(&b':') && name_is(&line[..name.len()], name);
            named.then(|| line[name.len() + 1..].trim_ascii())
        })
    }

    /// Appends the lines to `headers`, values sharing these bytes.
    pub fn fold_into(self, headers: &mut HeaderMap) {
        for (name, value) in self.iter() {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(self.lines.slice_ref(value)),
            ) {
                headers.append(name, value);
            }
        }
    }
}

/// An answer as a server writes it: a status, a header map, the header
/// lines a proxy passes on as they came ([`HeadLines`], written after the
/// map), a body. What a [`Plain`](crate::listen::Plain) handler returns:
/// the lean server writes it without an `http::Response` around it (whose
/// extensions map, holding the lines, costs three allocations per
/// answer).
#[derive(Debug, Default)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub lines: HeadLines,
    pub body: Body,
}

impl From<Response> for Answer {
    /// The response's parts, its [`HeadLines`] extension (if any) as the
    /// lines.
    fn from(resp: Response) -> Self {
        let (mut parts, body) = resp.into_parts();
        Self {
            status: parts.status,
            lines: parts.extensions.remove::<HeadLines>().unwrap_or_default(),
            headers: parts.headers,
            body,
        }
    }
}

impl Answer {
    /// The answer as a response, its lines (if any) as its [`HeadLines`]
    /// extension: what a router's layers and hyper's paths take.
    pub fn into_response(self) -> Response {
        let mut resp = Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers;
        if self.lines != HeadLines::default() {
            resp.extensions_mut().insert(self.lines);
        }
        resp
    }

    /// Whether the answer is a server-sent event stream, by the
    /// `Content-Type` in its map or else its lines'.
    pub fn is_event_stream(&self) -> bool {
        match self.headers.get(http::header::CONTENT_TYPE) {
            Some(v) => v.as_bytes().starts_with(b"text/event-stream"),
            None => self.lines.event_stream,
        }
    }
}

thread_local! {
    /// [`written`]'s buffer, reused by this thread's calls.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What `write` writes, as bytes of their own: written into a buffer this
/// thread reuses, then copied into one allocation of the exact size. (A
/// `Vec` frozen with room to spare takes a second allocation for the
/// shared bytes' header, and one grown to size may have moved first.)
pub fn written(write: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut buf = SCRATCH.take();
    buf.clear();
    write(&mut buf);
    let bytes = Bytes::copy_from_slice(&buf);
    // An outsized buffer (a huge head) is not kept for the thread's life.
    if buf.capacity() <= 64 * 1024 {
        SCRATCH.set(buf);
    }
    bytes
}

/// Appends the header line `name: value`.
pub fn put_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in base 10 or 16 (a length, a chunk size), without
/// allocating.
pub fn put_number(out: &mut Vec<u8>, mut n: u64, base: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(n % base) as usize];
        n /= base;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lower-case names of every length up to 40, from letters, digits and
    /// the punctuation header names use.
    fn lower_names() -> Vec<Vec<u8>> {
        let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789-_.!#$%&'*+^`|~";
        let mut rng = fastrand::Rng::with_seed(16);
        (1..=40)
            .flat_map(|len| std::iter::repeat_n(len, 4))
            .map(|len| {
                (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect()
            })
            .collect()
    }

    #[test]
    fn name_is_says_what_eq_ignore_ascii_case_says() {
        for lower in lower_names() {
            // Every byte value at every place, in the name as sent and
            // with its letters in upper case.
            let upper = lower.to_ascii_uppercase();
            for base in [&lower, &upper] {
                assert!(name_is(base, &lower));
                for at in 0..base.len() {
                    for b in 0..=255u8 {
                        let mut name = base.clone();
                        name[at] = b;
                        assert_eq!(
                            name_is(&name, &lower),
                            name.eq_ignore_ascii_case(&lower),
                            "{:?} against {:?}",
                            String::from_utf8_lossy(&name),
                            String::from_utf8_lossy(&lower)
                        );
                    }
                }
            }
            // Other lengths never match.
            assert!(!name_is(&lower[1..], &lower));
            assert!(!name_is(&[&lower[..], b"a"].concat(), &lower));
        }
        assert!(name_is(b"", b""));
        assert!(name_is(b"Content-Length", b"content-length"));
        assert!(!name_is(b"Content-Lengtx", b"content-length"));
    }

    #[test]
    fn is_header_text_takes_visible_ascii_spaces_and_tabs_only() {
        let text = |v: &[u8]| v.iter().all(|b| *b == b'\t' || (b' '..=b'~').contains(b));
        for len in 0..=40 {
            let base: Vec<u8> = (0..len).map(|i| b' ' + (i * 7 % 95) as u8).collect();
            assert!(is_header_text(&base));
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut value = base.clone();
                    value[at] = b;
                    assert_eq!(is_header_text(&value), text(&value), "{value:?}");
                }
            }
        }
        assert!(is_header_text(b"Bearer \tk1 ~"));
        assert!(!is_header_text("Bearer réq".as_bytes()));
    }

    #[test]
    fn written_bytes_are_what_was_written_even_when_nested() {
        let outer = written(|out| {
            out.extend_from_slice(b"a: 1\r\n");
            let inner = written(|out| out.extend_from_slice(b"inner"));
            assert_eq!(&inner[..], b"inner");
            out.extend_from_slice(b"b: 2\r\n");
        });
        assert_eq!(&outer[..], b"a: 1\r\nb: 2\r\n");
        // The reused buffer starts empty each time.
        assert_eq!(&written(|out| out.push(b'x'))[..], b"x");
        assert!(written(|_| {}).is_empty());
    }

    /// Reads all of `from` with [`poll_read`] (a slice is always ready).
    fn read_all(mut from: &[u8], buf: &mut BytesMut) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while !from.is_empty() {
            match poll_read(&mut from, buf, &mut cx) {
                Poll::Ready(Ok(_)) => {}
                other => panic!("a slice read gave {other:?}"),
            }
        }
    }

    #[test]
    fn an_empty_buffer_nothing_shares_reads_at_its_front_again() {
        let mut buf = BytesMut::with_capacity(READ_SPACE);
        let front = buf.as_ptr();
        read_all(b"GET / HTTP/1.1\r\n\r\n", &mut buf);
        assert_eq!(buf.as_ptr(), front);
        drop(buf.split().freeze());
        read_all(b"second", &mut buf);
        assert_eq!(buf.as_ptr(), front, "the next request starts at the front");
        assert_eq!(&buf[..], b"second");

        // A request's bytes still held elsewhere stay where they are: the
        // next read goes after them, nothing is allocated or overwritten.
        let held = buf.split().freeze();
        read_all(b"third", &mut buf);
        assert_eq!(buf.as_ptr(), front.wrapping_add(held.len()));
        assert_eq!((&held[..], &buf[..]), (&b"second"[..], &b"third"[..]));

        // Not empty: what is there is never moved by a read.
        let at = buf.as_ptr();
        drop(held);
        read_all(b"!", &mut buf);
        assert_eq!((buf.as_ptr(), &buf[..]), (at, &b"third!"[..]));
    }

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
    fn numbers_are_written_in_base_10_and_16() {
        for (n, base, text) in [
            (0, 16, "0"),
            (255, 16, "ff"),
            (1234, 10, "1234"),
            (u64::MAX, 10, "18446744073709551615"),
        ] {
            let mut out = Vec::new();
            put_number(&mut out, n, base);
            assert_eq!(out, text.as_bytes());
        }
    }

    #[test]
    fn head_lines_are_read_and_folded_into_a_map_as_written() {
        let lines = HeadLines {
            lines: Bytes::from_static(
                b"Content-Type: text/event-stream\r\nx-a:1\r\nx-a: 2 \r\nbad name: v\r\n",
            ),
            ..HeadLines::default()
        };
        assert_eq!(lines.get(b"content-type"), Some(&b"text/event-stream"[..]));
        assert_eq!(lines.get(b"x-a"), Some(&b"1"[..]));
        assert_eq!(lines.get(b"x-b"), None);
        let mut map = HeaderMap::new();
        map.insert("x-own", HeaderValue::from_static("kept"));
        lines.fold_into(&mut map);
        assert_eq!(map["content-type"], "text/event-stream");
        let a: Vec<_> = map.get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert_eq!(map["x-own"], "kept");
        // A name `http` refuses is left out, not a failure.
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn an_answer_and_a_response_carry_the_same_parts() {
        let stream = HeadLines {
            lines: Bytes::from_static(b"content-type: text/event-stream\r\n"),
            event_stream: true,
            ..HeadLines::default()
        };
        let answer = Answer {
            status: StatusCode::CREATED,
            lines: stream.clone(),
            body: Body::from("b"),
            ..Answer::default()
        };
        assert!(answer.is_event_stream(), "by its lines");
        let resp = answer.into_response();
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(resp.extensions().get::<HeadLines>(), Some(&stream));
        let back = Answer::from(resp);
        assert_eq!((back.status, &back.lines), (StatusCode::CREATED, &stream));

        // The map's `Content-Type` speaks first; no lines, no extension.
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let answer = Answer {
            headers,
            lines: stream,
            ..Answer::default()
        };
        assert!(!answer.is_event_stream());
        assert!(Answer::default()
            .into_response()
            .extensions()
            .get::<HeadLines>()
            .is_none());
    }

    #[test]
    fn a_span_cuts_the_same_bytes_from_the_whole() {
        let whole = b"name: value\r\n";
        let part = &whole[6..11];
        assert_eq!(&whole[span(whole, part)], b"value");
    }
}
