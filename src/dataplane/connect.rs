//! How the data plane reaches its backends: the connector that dials
//! `http://` in the clear and `https://` with rustls (per backend TLS
//! setting), and reading its errors (a refused connect; the whole chain of
//! causes). Shared by the attempts (`forward`), the client (`upstream`)
//! and the health probes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_rustls::{
    FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream,
};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use zonegate_net::tls::BackendTls;

/// Dials `http://` backends in the clear and `https://` ones with rustls.
pub type Connector = HttpsConnector<HttpConnector>;

/// A dialled connection, read and written with tokio's traits. The
/// connector hands out hyper's I/O traits over tokio's; a clear-text
/// connection is unwrapped back to its `TcpStream` here, so each read and
/// write of a backend's answer is the socket's own, not two conversions
/// around it (TLS keeps them: its own work dwarfs theirs).
pub enum Dialled {
    Tcp(TcpStream),
    /// Boxed: a TLS session is a few kilobytes, a socket a word.
    Tls(Box<TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>>),
}

impl From<MaybeHttpsStream<TokioIo<TcpStream>>> for Dialled {
    fn from(io: MaybeHttpsStream<TokioIo<TcpStream>>) -> Self {
        match io {
            MaybeHttpsStream::Http(tcp) => Dialled::Tcp(tcp.into_inner()),
            tls => Dialled::Tls(Box::new(TokioIo::new(tls))),
        }
    }
}

impl AsyncRead for Dialled {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Dialled::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Dialled::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Dialled {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Dialled::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Dialled::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Dialled::Tcp(s) => Pin::new(s).poll_flush(cx),
            Dialled::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Dialled::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Dialled::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// A connector for backends reached with `tls` (its CA, server name, or
/// no verification). One per distinct setting: `http://` backends share
/// the default one, whose TLS side is never used.
pub fn connector(connect_timeout: Duration, tls: &BackendTls) -> Connector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let config = tls.client_config().unwrap_or_else(|e| {
        // Validated at start; a CA file removed since is reported on
        // every connection this backend fails to make.
        tracing::error!("backend TLS: {e}; https:// connections with this setting will fail");
        no_roots()
    });
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http();
    let builder = match tls
        .server_name
        .as_deref()
        .and_then(|n| ServerName::try_from(n.to_owned()).ok())
    {
        Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(name)),
        None => builder,
    };
    builder.enable_http1().wrap_connector(http)
}

/// A TLS client that trusts nothing: what a failed setting falls back to.
fn no_roots() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(zonegate_net::tls::provider())
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        })
        .unwrap_or_else(|e| unreachable!("ring supports the default protocol versions: {e}"))
}

/// Whether `e`, or an error it wraps, is a refused TCP connect (nothing
/// listens at the address), as opposed to a timeout or a name that did not
/// resolve.
pub(crate) fn is_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

pub(crate) fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connect_is_told_apart_from_other_connect_failures() {
        // A port nothing listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut dial = connector(Duration::from_secs(2), &BackendTls::default());
        let uri: http::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
        let Err(e) = tower::Service::call(&mut dial, uri).await else {
            panic!("a connection to a closed port");
        };
        assert!(is_refused(&*e), "{}", source_chain(&*e));
        let other = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timeout");
        assert!(!is_refused(&other));
    }
}
