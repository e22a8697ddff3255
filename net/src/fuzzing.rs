//! Entry points for the fuzz targets in `fuzz/`, not an API (hidden from
//! the docs): the lean server's request-head decision exactly as
//! `server::serve` reaches it, with nothing of its I/O.

use axum::body::Body;
use http::uri::PathAndQuery;

use crate::app::{Plain, PlainRequest};
use crate::http1::Answer;
use crate::server::{self, Parse};

/// What the lean server decides for the bytes at the front of its buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Head {
    /// A request it serves: its method and target, where its head ends,
    /// how many body bytes follow it, and whether it closes after.
    Ours {
        method: String,
        target: Vec<u8>,
        head_len: usize,
        body_len: usize,
        close: bool,
    },
    /// Not a whole head yet: it reads more.
    Partial,
    /// Hyper's from here, every byte read.
    Hyper,
}

/// A [`Plain`] handler with the data plane's inference paths.
struct Paths([PathAndQuery; 2]);

impl Plain for Paths {
    fn paths(&self) -> &[PathAndQuery] {
        &self.0
    }

    fn call(&self, _: PlainRequest) -> impl std::future::Future<Output = Answer> + Send {
        std::future::ready(Answer::default())
    }
}

/// The decision for `buf` read at once; `plain`: the listener has a
/// [`Plain`] handler (the data plane's POST paths), else only its app.
pub fn request_head(buf: &[u8], plain: bool) -> Head {
    let mut spans = Vec::new();
    let parsed = match server::parse(buf, &mut spans) {
        Parse::Complete(p) => p,
        Parse::Partial => return Head::Partial,
        Parse::NotOurs => return Head::Hyper,
    };
    let head = bytes::Bytes::copy_from_slice(&buf[..parsed.head_len]);
    let paths = Paths([
        PathAndQuery::from_static("/v1/chat/completions"),
        PathAndQuery::from_static("/v1/completions"),
    ]);
    // As `serve`: a head `http` refuses a part of is handed to hyper.
    if server::call(
        &parsed,
        &head,
        &spans,
        plain.then_some(&paths),
        Body::empty(),
    )
    .is_none()
    {
        return Head::Hyper;
    }
    Head::Ours {
        method: parsed.method.to_string(),
        target: head[parsed.path.clone()].to_vec(),
        head_len: parsed.head_len,
        body_len: parsed.body_len,
        close: parsed.close,
    }
}

/// The decision as `serve` reaches it when `bytes` arrive in pieces of
/// the sizes `pieces` gives (at least 1 byte each; the last takes the
/// rest): an incomplete head is parsed again only once the new bytes may
/// end it.
pub fn request_head_in_pieces(
    bytes: &[u8],
    mut pieces: impl Iterator<Item = usize>,
    plain: bool,
) -> Head {
    let mut buf = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    let mut checked = 0;
    loop {
        let found = if buf.is_empty() || (checked > 0 && !server::may_end_head(&buf, checked)) {
            Head::Partial
        } else {
            request_head(&buf, plain)
        };
        if found != Head::Partial {
            return found;
        }
        if rest.is_empty() {
            return Head::Partial;
        }
        checked = buf.len();
        let n = pieces.next().unwrap_or(rest.len()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}
