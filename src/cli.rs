//! The operators' command line: `zonegate ctl` (`ctl`, tables in
//! `render`) and `zonegate check-config` (`check`).

pub mod check;
pub mod config;
pub mod ctl;
pub mod entry;
pub mod members;
pub mod policy;
pub mod spend;

pub use check::check_config;

/// Env var naming a PEM file of CA certificates the command line trusts
/// for `https://` admin URLs, besides the system's roots.
pub const CA_FILE_ENV: &str = "ZONEGATE_CA_FILE";

/// Env var naming a PEM file with the command line's client certificate
/// and its key, for an admin API that requires client certificates
/// (`[admin.tls] client_ca`).
pub const CLIENT_CERT_ENV: &str = "ZONEGATE_CLIENT_CERT";

/// The command line's HTTP client: the system's CA certificates plus those
/// of `ZONEGATE_CA_FILE`, for admin APIs served over `[admin.tls]`; and
/// the client certificate of `ZONEGATE_CLIENT_CERT`, when set.
pub(crate) fn http_client(timeout: std::time::Duration) -> anyhow::Result<reqwest::Client> {
    use anyhow::Context as _;
    let mut builder = reqwest::Client::builder().timeout(timeout);
    for cert in rustls_native_certs::load_native_certs().certs {
        if let Ok(c) = reqwest::Certificate::from_der(&cert) {
            builder = builder.add_root_certificate(c);
        }
    }
    if let Ok(path) = std::env::var(CA_FILE_ENV) {
        let pem =
            std::fs::read(&path).with_context(|| format!("{CA_FILE_ENV}={path}: cannot read"))?;
        for c in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("{CA_FILE_ENV}={path}: not PEM certificates"))?
        {
            builder = builder.add_root_certificate(c);
        }
    }
    if let Ok(path) = std::env::var(CLIENT_CERT_ENV) {
        let pem = std::fs::read(&path)
            .with_context(|| format!("{CLIENT_CERT_ENV}={path}: cannot read"))?;
        let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
            format!("{CLIENT_CERT_ENV}={path}: not a PEM certificate with its private key")
        })?;
        builder = builder.identity(identity);
    }
    builder.build().context("cannot build an HTTP client")
}
