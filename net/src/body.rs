//! Reading a request body whole, within a size limit and a time.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes};

/// head) is returned as it is, without a copy; a longer one is gathered
/// into one buffer. A declared length over `limit` is refused unread.
pub async fn read_body(
    mut body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<axum::body::Bytes, BodyError> {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    let gather = async {
        let mut first = Bytes::new();
        let mut more: Option<bytes::BytesMut> = None;
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
            // Trailers carry no body bytes.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            len = len.saturating_add(data.len());
            if len > limit {
                return Err(BodyError::TooLarge);
            }
            match &mut more {
                Some(all) => all.extend_from_slice(&data),
                None if first.is_empty() => first = data,
                None => {
                    let mut all = bytes::BytesMut::with_capacity(len);
                    all.extend_from_slice(&first);
                    all.extend_from_slice(&data);
                    more = Some(all);
                }
            }
        }
        Ok(more.map_or(first, bytes::BytesMut::freeze))
    };
    // A body that came with its head is whole at the first poll: it costs
    // no clock read and no timer.
    let mut gather = std::pin::pin!(gather);
    if let Poll::Ready(done) =
        std::future::poll_fn(|cx| Poll::Ready(gather.as_mut().poll(cx))).await
    {
        return done;
    }
    tokio::time::timeout(timeout, gather)
        .await
        .unwrap_or(Err(BodyError::Timeout))
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body was not received in time")]
    Timeout,
    #[error("the request body is larger than this endpoint accepts")]
    TooLarge,
    #[error("reading the request body failed: {0}")]
    Read(String),
}
