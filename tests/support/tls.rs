//! Test certificates made with rcgen: a CA, and leaf certificates it signs
//! (members carry the DNS SAN `node-<id>.zonegate`, and every leaf
//! `127.0.0.1` and `localhost`).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A leaf certificate and its key, as PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA certificate");
        Self { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf for `names` (DNS names or IP addresses) plus loopback.
    pub fn issue(&self, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let sans: Vec<String> = names
            .iter()
            .map(|s| s.to_string())
            .chain(["127.0.0.1".into(), "localhost".into()])
            .collect();
        let params = CertificateParams::new(sans).expect("leaf params");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// Writes `<stem>.crt`, `<stem>.key` and `ca.crt` into `dir`.
    pub fn write(&self, dir: &Path, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let leaf = self.issue(names);
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, leaf.cert).expect("write cert");
        std::fs::write(&key, leaf.key).expect("write key");
        std::fs::write(dir.join("ca.crt"), self.pem()).expect("write ca");
        (cert, key)
    }
}
