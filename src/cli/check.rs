//! `zonegate check-config FILE`: everything `serve` would refuse, and what
//! would only fail at run time (a member certificate a peer rejects), found
//! before start, one line each naming the fix; then a summary of what the
//! file holds.
//!
//! Beyond [`Config::load`] (every key, bound and file), it checks what
//! `serve` checks outside the file (the cluster secret when members are
//! configured) and what the TLS handshakes check later: each listener
//! certificate's validity dates and extended key usage, and for
//! `[cluster.tls]` the chain to `client_ca`, both key usages (members are
//! each other's servers and clients) and the SAN `node-N.zonegate`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use zonegate_net::tls::{load_certs, member_name, TlsFiles};

use crate::config::Config;

/// `zonegate check-config FILE`: validates the file, then the secret and
/// certificates `serve` needs; prints each problem on its own line (on
/// stderr) and fails, or prints the summary.
pub fn check_config(file: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(file)?;
    // What the node would build from it, within the same cost cap.
    crate::dataplane::routing::Routes::try_build(&cfg, None)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let secret = std::env::var(crate::node::start::SECRET_ENV).ok();
    let problems = problems(&cfg, secret.as_deref(), UnixTime::now());
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("{}: {p}", file.display());
        }
        anyhow::bail!(
            "{}: {} problem(s) above; `serve` would refuse this config or fail at run time",
            file.display(),
            problems.len()
        );
    }
    print!("{}", summary(&cfg));
    Ok(())
}

/// Every problem of a loaded config, one line each, naming the fix.
pub fn problems(cfg: &Config, secret: Option<&str>, now: UnixTime) -> Vec<String> {
    let mut out = Vec::new();
    if !cfg.members.is_empty() {
        out.extend(secret_problem(secret));
        if cfg.node.raft_listen.is_none() {
            out.push(
                "node.raft_listen: not set; a member needs it (host:port of its Raft listener, as in [[cluster.members]])".into(),
            );
        }
    }
    for (section, files) in [("node", &cfg.node.tls), ("admin", &cfg.admin.tls)] {
        if let Some(files) = files {
            out.extend(cert_problems(section, files, None, now));
        }
    }
    if let (Some(files), false) = (&cfg.cluster.tls, cfg.members.is_empty()) {
        out.extend(cert_problems("cluster", files, Some(cfg.node.id), now));
    }
    out.dedup();
    out
}

fn secret_problem(secret: Option<&str>) -> Option<String> {
    use zonegate_net::sign::{KeyError, KeyRing, Purpose};
    let env = crate::node::start::SECRET_ENV;
    let fix = format!(
        "set the same secret of at least 16 bytes on every node, e.g. `export {env}=$(openssl rand -hex 32)`"
    );
    let why = match KeyRing::derive(secret.unwrap_or_default(), Purpose::Raft) {
        Ok(_) => return None,
        Err(KeyError::Empty) => "is not set".to_owned(),
        Err(KeyError::TooShort(i)) => {
            format!("entry #{i} is shorter than 16 bytes")
        }
        Err(e) => e.to_string(),
    };
    Some(format!(
        "{env} {why}; `serve` refuses to start with [[cluster.members]]: {fix}"
    ))
}

/// The extended key usages a certificate must allow.
#[derive(Clone, Copy)]
enum Usage {
    Server,
    Client,
}

impl Usage {
    fn webpki(self) -> webpki::KeyUsage {
        match self {
            Usage::Server => webpki::KeyUsage::server_auth(),
            Usage::Client => webpki::KeyUsage::client_auth(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Usage::Server => "serverAuth",
            Usage::Client => "clientAuth",
        }
    }
}

/// One listener's certificate: dates and key usage; for a member (`member`
/// is its node id) also the chain to `client_ca`, both key usages and the
/// member name.
fn cert_problems(
    section: &str,
    files: &TlsFiles,
    member: Option<u64>,
    now: UnixTime,
) -> Vec<String> {
    let key = format!("{section}.tls.cert");
    let certs = match load_certs(&files.cert) {
        Ok(c) => c,
        Err(e) => return vec![format!("{key}: {e}")],
    };
    let Some((leaf, intermediates)) = certs.split_first() else {
        return vec![format!("{key}: no certificate in {}", files.cert.display())];
    };
    let ee = match webpki::EndEntityCert::try_from(leaf) {
        Ok(ee) => ee,
        Err(e) => return vec![format!("{key}: not a usable certificate ({e:?})")],
    };
    let mut out = Vec::new();
    let (usages, anchors): (&[Usage], Vec<CertificateDer<'static>>) = match member {
        None => (&[Usage::Server], Vec::new()),
        Some(_) => {
            let ca = files.client_ca.as_ref().and_then(|ca| load_certs(ca).ok());
            match ca {
                Some(ca) => (&[Usage::Server, Usage::Client], ca),
                None => {
                    out.push(format!("{section}.tls.client_ca: not set or unreadable; members verify each other against it: set it to the cluster CA's certificate"));
                    (&[Usage::Server, Usage::Client], Vec::new())
                }
            }
        }
    };
    let anchors: Vec<_> = anchors
        .iter()
        .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
        .collect();
    for usage in usages {
        let verified = ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            intermediates,
            now,
            usage.webpki(),
            None,
            None,
        );
        let err = match verified {
            Ok(_) => continue,
            // Without anchors (a listener's own certificate) the issuer
            // is the clients' business; the dates and usage were checked
            // before the issuer was looked for.
            Err(webpki::Error::UnknownIssuer) if member.is_none() => continue,
            Err(e) => e,
        };
        out.push(cert_problem(&key, files, *usage, member.is_some(), &err));
    }
    if let Some(id) = member {
        let name = member_name(id);
        let names = ServerName::try_from(name.clone())
            .is_ok_and(|n| ee.verify_is_valid_for_subject_name(&n).is_ok());
        if !names {
            out.push(format!(
                "{key}: does not name this member: node {id}'s certificate needs the DNS SAN `{name}` (subjectAltName = DNS:{name}); peers refuse it otherwise"
            ));
        }
    }
    out
}

fn cert_problem(
    key: &str,
    files: &TlsFiles,
    usage: Usage,
    member: bool,
    err: &webpki::Error,
) -> String {
    let date = |t: &UnixTime| {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.as_secs());
        humantime::format_rfc3339_seconds(at).to_string()
    };
    match err {
        webpki::Error::CertExpired { not_after, .. } => format!(
            "{key}: expired at {}: issue a new certificate (the file is reloaded when it changes)",
            date(not_after)
        ),
        webpki::Error::CertNotValidYet { not_before, .. } => format!(
            "{key}: not valid before {}: check this machine's clock or reissue it",
            date(not_before)
        ),
        webpki::Error::UnknownIssuer => format!(
            "{key}: does not chain to {}: sign it with the cluster CA in client_ca (or put its intermediate after it in the cert file)",
            files.client_ca.as_deref().unwrap_or(Path::new("client_ca")).display()
        ),
        webpki::Error::RequiredEkuNotFoundContext(_) => {
            let need = if member {
                "extendedKeyUsage = serverAuth, clientAuth (members are each other's servers and clients)".to_owned()
            } else {
                "extendedKeyUsage = serverAuth".to_owned()
            };
            format!(
                "{key}: its extended key usage does not allow {}: reissue it with {need}",
                usage.name()
            )
        }
        other => format!("{key}: rejected for {}: {other}", usage.name()),
    }
}

/// What the file holds: node, role, members, listeners, backends per zone
/// and model, tenants with quotas, tokens by role, replicated sections.
pub fn summary(cfg: &Config) -> String {
    let mut s = format!("{}: ok\n", cfg.file);
    let me = cfg.members.iter().find(|m| m.id == cfg.node.id);
    let role = match me {
        Some(m) => m.role.name().to_owned(),
        None => "standalone (no [[cluster.members]])".to_owned(),
    };
    let _ = writeln!(s, "  node {} in {}, {role}", cfg.node.id, cfg.node.zone);
    if !cfg.members.is_empty() {
        let list: Vec<String> = cfg
            .members
            .iter()
            .map(|m| format!("{} ({}, {})", m.id, m.zone, m.role.name()))
            .collect();
        let _ = writeln!(s, "  members: {}", list.join(", "));
    }
    let tls = |t: &Option<TlsFiles>| match t {
        Some(f) if f.client_ca.is_some() => "TLS, client certificates required",
        Some(_) => "TLS",
        None => "plain",
    };
    let _ = write!(
        s,
        "  listeners: data {} ({}), admin {} ({})",
        cfg.node.listen,
        tls(&cfg.node.tls),
        cfg.node.admin_listen,
        tls(&cfg.admin.tls)
    );
    match (cfg.node.raft_listen, cfg.members.is_empty()) {
        (Some(raft), false) => {
            let how = match &cfg.cluster.tls {
                Some(_) => "mutual TLS",
                None if cfg.cluster.allow_plaintext => "plain, allow_plaintext",
                None => "plain",
            };
            let _ = writeln!(s, ", raft {raft} ({how})");
        }
        _ => s.push('\n'),
    }
    let mut by_zone: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for b in &cfg.backends {
        for m in &b.models {
            *by_zone
                .entry(b.zone.as_str())
                .or_default()
                .entry(m.as_str())
                .or_default() += 1;
        }
    }
    let zones: Vec<String> = by_zone
        .iter()
        .map(|(zone, models)| {
            let models: Vec<String> = models.iter().map(|(m, n)| format!("{m} ×{n}")).collect();
            format!("{zone}: {}", models.join(", "))
        })
        .collect();
    let _ = writeln!(
        s,
        "  backends: {}",
        if zones.is_empty() {
            "none".to_owned()
        } else {
            zones.join("; ")
        }
    );
    let tenants: Vec<String> = cfg
        .tenants
        .iter()
        .zip(&cfg.tenant_quotas)
        .map(|(t, q)| {
            let limits: Vec<String> = [
                ("rpm", q.global.rpm),
                ("tpm", q.global.tpm),
                ("concurrency", q.global.concurrency),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k} {v}")))
            .collect();
            let quota = if limits.is_empty() {
                "no quota".to_owned()
            } else {
                limits.join(", ")
            };
            format!("{} ({:?}, {quota})", t.name, t.priority)
        })
        .collect();
    let _ = writeln!(s, "  tenants: {}", tenants.join("; "));
    let mut roles: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for t in &cfg.admin.tokens {
        roles
            .entry(format!("{:?}", t.role).to_lowercase())
            .or_default()
            .push(&t.name);
    }
    let tokens: Vec<String> = roles
        .iter()
        .map(|(role, names)| format!("{role}: {}", names.join(", ")))
        .collect();
    let _ = writeln!(
        s,
        "  admin tokens: {}",
        if tokens.is_empty() {
            "none (the admin API refuses every call)".to_owned()
        } else {
            tokens.join("; ")
        }
    );
    let sections: Vec<&str> = cfg
        .text
        .parse::<toml::Table>()
        .map(|t| {
            crate::config::replicated::REPLICATED
                .iter()
                .copied()
                .filter(|k| t.contains_key(*k))
                .collect()
        })
        .unwrap_or_default();
    let seeds = if cfg.members.is_empty() {
        "this node's routing config"
    } else {
        "seed the cluster's config; `ctl config apply` changes them at run time"
    };
    let _ = writeln!(
        s,
        "  replicated sections: {} ({seeds})",
        sections.join(", ")
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_short_cluster_secret_names_the_fix() {
        let missing = secret_problem(None).unwrap_or_default();
        assert!(missing.contains("is not set"), "{missing}");
        assert!(missing.contains("openssl rand -hex 32"), "{missing}");
        let short = secret_problem(Some("change-me")).unwrap_or_default();
        assert!(short.contains("shorter than 16 bytes"), "{short}");
        assert!(secret_problem(Some("0123456789abcdef0123")).is_none());
    }
}
