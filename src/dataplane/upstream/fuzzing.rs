//! Entry points for the fuzz targets in `fuzz/`, not an API (hidden from
//! the docs): the backend response reader (`wire`) as `send` and
//! `UpstreamBody` drive it, with nothing of their I/O.

use bytes::BytesMut;

use super::wire::{parse_head, Chunk, Decoder, HeadScan, Step};

/// A response read to its end.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    pub status: u16,
    /// The header lines passed on.
    pub lines: Vec<u8>,
    pub event_stream: bool,
    pub keep_alive: bool,
    pub body: Vec<u8>,
    /// Bytes left after the body ended (a reused connection's next answer).
    pub left: usize,
}

/// Reads the response in `wire`, arriving in pieces of the sizes
/// `pieces` gives (at least 1 byte each; the last takes the rest), then
/// the backend's close: the response, or the error that ended it.
pub fn read_response(wire: &[u8], pieces: impl Iterator<Item = usize>) -> Result<Read, String> {
    let mut feed = Feed::new(wire, pieces);
    let mut buf = BytesMut::new();
    let mut spans = Vec::new();
    let mut scan = HeadScan::default();
    let head = loop {
        if let Some(head) = parse_head(&mut buf, &mut spans, &mut scan)? {
            break head;
        }
        if !feed.next_into(&mut buf) {
            return Err("the backend closed the connection in the head".into());
        }
    };
    let (body, left) = body(head.decoder, &mut buf, &mut feed)?;
    Ok(Read {
        status: head.status.as_u16(),
        lines: head.lines.lines.to_vec(),
        event_stream: head.lines.event_stream,
        keep_alive: head.keep_alive,
        body,
        left,
    })
}

/// Decodes the chunked body in `wire`, arriving as [`read_response`]'s
/// does: its bytes and the bytes left after it, or the error.
pub fn read_chunked(
    wire: &[u8],
    pieces: impl Iterator<Item = usize>,
) -> Result<(Vec<u8>, usize), String> {
    let mut feed = Feed::new(wire, pieces);
    body(
        Decoder::Chunked(Chunk::Size(0)),
        &mut BytesMut::new(),
        &mut feed,
    )
}

fn body(
    mut decoder: Decoder,
    buf: &mut BytesMut,
    feed: &mut Feed<'_, impl Iterator<Item = usize>>,
) -> Result<(Vec<u8>, usize), String> {
    let mut body = Vec::new();
    loop {
        match decoder.step(buf)? {
            Step::Data(d) => body.extend_from_slice(&d),
            Step::Done => break,
            Step::NeedMore => {
                if !feed.next_into(buf) {
                    decoder.eof()?;
                    break;
                }
            }
        }
    }
    Ok((body, buf.len() + feed.rest.len()))
}

/// The bytes of `wire` as reads hand them over.
struct Feed<'a, P> {
    rest: &'a [u8],
    pieces: P,
}

impl<'a, P: Iterator<Item = usize>> Feed<'a, P> {
    fn new(rest: &'a [u8], pieces: P) -> Self {
        Self { rest, pieces }
    }

    /// The next read into `buf`; false at the end of the stream.
    fn next_into(&mut self, buf: &mut BytesMut) -> bool {
        if self.rest.is_empty() {
            return false;
        }
        let n = self
            .pieces
            .next()
            .unwrap_or(self.rest.len())
            .clamp(1, self.rest.len());
        buf.extend_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        true
    }
}
