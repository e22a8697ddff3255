//! TLS material (rustls, ring provider): server configs per listener that
//! reload when their PEM files change, the member identity carried in
//! certificates, and client configs for members and `https://` backends.
//!
//! Member identity: member N's certificate names it with the DNS SAN
//! `node-N.zonegate` ([`member_name`]). A server checks that the client
//! certificate of a call names the node id the call claims; a client checks
//! that the peer it dials presents the name of the member it meant, whatever
//! address it dialled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// The one crypto provider every config uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS error: which file (or part) and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{0}")]
    Config(String),
}

fn file_err(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// The most a PEM file (a certificate chain, a key, a CA bundle) may hold.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A PEM file's bytes: only a regular file (not a device such as
/// `/dev/zero`, a FIFO or a directory), of at most [`MAX_PEM_BYTES`], read
/// with a bounded read. Paths can come from replicated config, so a path
/// must never make a node read without end.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read as _;
    // Checked before opening: opening a FIFO for reading blocks.
    let meta = std::fs::metadata(path).map_err(|e| file_err(path, e))?;
    if !meta.is_file() {
        return Err(file_err(path, "not a regular file"));
    }
    let file = std::fs::File::open(path).map_err(|e| file_err(path, e))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| file_err(path, e))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(file_err(path, format!("larger than {MAX_PEM_BYTES} bytes")));
    }
    Ok(bytes)
}

/// Reads every certificate of a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// Reads the private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read_pem(path)?).map_err(|e| file_err(path, e))
}

/// A root store from a PEM file of CA certificates.
pub fn load_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| file_err(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// The DNS name a member's certificate carries: `node-N.zonegate`.
pub fn member_name(id: u64) -> String {
    format!("node-{id}.zonegate")
}

/// Whether an (already chain-verified) certificate names member `id`.
pub fn names_member(cert: &CertificateDer<'_>, id: u64) -> bool {
    let Ok(name) = ServerName::try_from(member_name(id)) else {
        return false;
    };
    webpki::EndEntityCert::try_from(cert)
        .is_ok_and(|ee| ee.verify_is_valid_for_subject_name(&name).is_ok())
}

/// Where a listener's certificate, key and optional client CA live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate chaining to it.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }

    /// Modification time and length of each file: a change of either
    /// means a reload.
    fn stamp(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.paths()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }
}

/// A listener's TLS: the current server config, swapped whole when its
/// files change. Connections keep the config they were accepted with.
pub struct ServerTls {
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    current: ArcSwap<ServerConfig>,
    stamp: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish()
    }
}

impl ServerTls {
    /// Loads the files; `alpn` lists the protocols offered (e.g. `h2`,
    /// `http/1.1`).
    pub fn load(files: TlsFiles, alpn: &[&[u8]]) -> Result<Arc<Self>, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let stamp = files.stamp();
        let config = build_server(&files, &alpn)?;
        Ok(Arc::new(Self {
            files,
            alpn,
            current: ArcSwap::from_pointee(config),
            stamp: Mutex::new(stamp),
        }))
    }

    /// The config new connections are accepted with.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Reloads when a file changed since the last load. `Ok(true)` when a
    /// new config is in place; on error the old one stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamp = self.files.stamp();
        if *self.stamp.lock() == stamp {
            return Ok(false);
        }
        self.reload()?;
        *self.stamp.lock() = stamp;
        Ok(true)
    }

    /// Rebuilds the config from the files now (SIGHUP).
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = build_server(&self.files, &self.alpn)?;
        self.current.store(Arc::new(config));
        Ok(())
    }
}

fn build_server(files: &TlsFiles, alpn: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
    let certs = load_certs(&files.cert)?;
    let key = load_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(load_roots(ca)?, provider())
                .build()
                .map_err(|e| file_err(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| file_err(&files.key, format!("does not fit the certificate: {e}")))?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// A client's certificate and key, and the CA it trusts: what a member
/// presents to and expects from other members.
#[derive(Clone, Debug)]
pub struct MemberTls {
    pub files: TlsFiles,
}

impl MemberTls {
    /// A client config that presents this member's certificate and
    /// accepts only a peer whose certificate chains to the cluster CA and
    /// names member `peer`, whatever address was dialled.
    pub fn client_for(&self, peer: u64) -> Result<ClientConfig, TlsError> {
        let ca = self.files.client_ca.as_ref().ok_or_else(|| {
            TlsError::Config("mutual TLS between members needs client_ca (the cluster CA)".into())
        })?;
        let roots = load_roots(ca)?;
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| file_err(ca, e))?;
        let name =
            ServerName::try_from(member_name(peer)).map_err(|e| TlsError::Config(e.to_string()))?;
        let verifier = Arc::new(MemberVerifier { inner, name });
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(load_certs(&self.files.cert)?, load_key(&self.files.key)?)
            .map_err(|e| file_err(&self.files.key, e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A stamp of the files, to notice rotated certificates.
    pub fn stamp(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.files.stamp()
    }
}

/// Verifies the chain as WebPKI does, against the member name expected
/// rather than the address dialled.
#[derive(Debug)]
struct MemberVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for MemberVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// How to reach an `https://` backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendTls {
    /// CA file to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// The name to verify (and send as SNI) instead of the URL's host.
    pub server_name: Option<String>,
    /// Accept any certificate. Only with an explicit key; logs a WARN.
    pub insecure_skip_verify: bool,
}

impl BackendTls {
    /// The client config for this backend (no ALPN set: the connector
    /// offers the protocols it speaks).
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let config = if self.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
                .with_no_client_auth()
        } else {
            let roots = match &self.ca {
                Some(ca) => load_roots(ca)?,
                None => system_roots()?,
            };
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        Ok(config)
    }
}

/// The system's CA certificates (as curl trusts them), read once per
/// process and shared: reading and parsing the store is ~19M instructions
/// (a few ms), and every data-plane thread's pool, the health prober and
/// the node each build a connector. A certificate added to the store later
/// is trusted after a restart (as before: connectors were built at start).
fn system_roots() -> Result<Arc<RootCertStore>, TlsError> {
    static ROOTS: std::sync::OnceLock<Result<Arc<RootCertStore>, String>> =
        std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err("no system CA certificates found: set the backend's tls.ca".into());
            }
            Ok(Arc::new(roots))
        })
        .clone()
        .map_err(TlsError::Config)
}

/// `insecure_skip_verify`: any certificate is accepted (signatures over
/// the handshake are still checked, so the session is still encrypted).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
