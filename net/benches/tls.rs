//! The CPU cost of one TLS handshake (TLS 1.3, ECDSA P-256 certificate,
//! the ring provider), client and server together over an in-memory pipe:
//! what every new connection to an HTTPS listener costs.
//!
//! ```sh
//! cargo bench -p zonegate-net --bench tls
//! ```

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use rustls::pki_types::ServerName;
use zonegate_net::tls::{ServerTls, TlsFiles};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let (cert_path, key_path) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("write");
    std::fs::write(&key_path, key.serialize_pem()).expect("write");
    let server = ServerTls::load(
        TlsFiles {
            cert: cert_path,
            key: key_path,
            client_ca: None,
        },
        &[b"http/1.1"],
    )
    .expect("server config");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(zonegate_net::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    c.bench_function("tls_handshake/tls13_p256", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let (a, z) = tokio::io::duplex(64 * 1024);
                let acceptor = tokio_rustls::TlsAcceptor::from(server.config());
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(&client));
                let name = ServerName::try_from("localhost").expect("name");
                let (s, c) = tokio::join!(acceptor.accept(a), connector.connect(name, z));
                s.expect("server side");
                c.expect("client side");
            })
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
