//! The command line: `check-config` on every example under `config/` and on
//! broken files, and the one-command `demo`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command as StdCommand;
use std::time::Duration;

use support::*;

fn config_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            config_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_example_under_config_is_valid() {
    let mut files = Vec::new();
    config_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config"),
        &mut files,
    );
    assert!(files.len() >= 2, "examples missing: {files:?}");
    for f in files {
        zonegate::config::Config::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let out = StdCommand::new(bin())
            .arg("check-config")
            .arg(&f)
            .env(
                "ZONEGATE_CLUSTER_SECRET",
                "an-example-secret-of-32-bytes-xx",
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn check_config_names_file_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/minimal.toml"))
            .unwrap()
            .replace(
                "url = \"http://127.0.0.1:8000\"",
                "url = \"http://127.0.0.1:8000\"\nweight = 0",
            );
    std::fs::write(&path, text).unwrap();
    let out = StdCommand::new(bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("backends[0].weight"), "{err}");
    assert!(err.contains("at least 1"), "{err}");

    let out = StdCommand::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve refuses an invalid config");
    let missing = StdCommand::new(bin())
        .args(["check-config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_starts_a_working_gateway_and_stops_on_sigterm() {
    let Demo {
        mut child,
        data,
        admin,
        api_key: key,
        admin_token: token,
        ..
    } = Demo::start("warn").await;
    let resp = client()
        .post(format!("{data}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&chat_body(4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A Claude-style model behind the same API (an Anthropic-format mock
    // with the demo's key from the environment).
    let mut claude = chat_body(4, false);
    claude["model"] = serde_json::json!("claude-demo");
    let resp = client()
        .post(format!("{data}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&claude)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(answer["model"], "claude-demo");
    let backends = get_json(&format!("{admin}/admin/v1/backends"), Some(&token)).await;
    assert_eq!(backends["backends"].as_array().unwrap().len(), 7);
    let cluster = get_json(&format!("{admin}/admin/v1/cluster"), Some(&token)).await;
    assert_eq!(cluster["control_plane"], "raft");
    assert_eq!(cluster["nodes"].as_array().unwrap().len(), 3);

    // SIGTERM: the demo stops its children and exits cleanly.
    let pid = child.id().unwrap().to_string();
    StdCommand::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    eventually(
        Duration::from_secs(20),
        "the demo's gateway to stop",
        || async {
            client()
                .get(format!("{data}/healthz"))
                .send()
                .await
                .is_err()
        },
    )
    .await;
}

/// A secret an example suggests must be one `serve` accepts (16 bytes or
/// more): `export ZONEGATE_CLUSTER_SECRET=change-me` was refused.
#[test]
fn no_example_suggests_a_cluster_secret_serve_refuses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    config_files(&root.join("config"), &mut files);
    files.extend(
        [
            "README.md",
            "docs/src/getting-started.md",
            "deploy/README.md",
        ]
        .map(|f| root.join(f)),
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("ZONEGATE_CLUSTER_SECRET=") {
            let value: String = text[i + "ZONEGATE_CLUSTER_SECRET=".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '`')
                .collect();
            let literal = value.trim_matches(['"', '\'']);
            assert!(
                literal.starts_with(['$', '%']) || literal == "..." || literal.len() >= 16,
                "{}: suggests ZONEGATE_CLUSTER_SECRET={value}, shorter than the 16 bytes serve needs",
                f.display()
            );
        }
    }
}

/// A CA and the member certificates of the five mistakes.
struct Pki {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Pki {
    fn ca(name: &str) -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Pki { cert, key }
    }

    /// Writes `member.crt`, `member.key` and this CA's `ca.crt` to `dir`.
    fn member(
        &self,
        dir: &Path,
        san: &str,
        ekus: &[rcgen::ExtendedKeyUsagePurpose],
        expired: bool,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![san.to_owned()]).unwrap();
        p.extended_key_usages = ekus.to_vec();
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        std::fs::write(dir.join("member.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("member.key"), key.serialize_pem()).unwrap();
    }
}

#[test]
fn check_config_names_the_fix_for_each_of_the_five_mistakes_serve_would_trip_on() {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let dir = tempfile::tempdir().unwrap();
    let members = [
        MemberSpec::new(1, "az-a"),
        MemberSpec::new(2, "az-b"),
        MemberSpec::new(3, "az-c"),
    ];
    let rest = "[[backends]]\nname = \"b1\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:8000\"\nmodels = [\"m\"]\n\n\
                [cluster.tls]\ncert = \"member.crt\"\nkey = \"member.key\"\nclient_ca = \"ca.crt\"\n";
    let path = write_member_config(dir.path(), &members[0], &members, rest);
    let ca = Pki::ca("cluster CA");
    std::fs::write(dir.path().join("ca.crt"), ca.cert.pem()).unwrap();
    let good_secret = Some("0123456789abcdef0123456789abcdef");
    let check = |secret: Option<&str>| {
        let mut cmd = StdCommand::new(bin());
        cmd.arg("check-config").arg(&path);
        match secret {
            Some(s) => cmd.env("ZONEGATE_CLUSTER_SECRET", s),
            None => cmd.env_remove("ZONEGATE_CLUSTER_SECRET"),
        };
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // Right: a summary of what the file holds.
    ca.member(
        dir.path(),
        "node-1.zonegate",
        &[ServerAuth, ClientAuth],
        false,
    );
    let (ok, out, err) = check(good_secret);
    assert!(ok, "{err}");
    for want in [
        ": ok",
        "node 1 in az-a, voter",
        "members: 1 (az-a, voter), 2 (az-b, voter), 3 (az-c, voter)",
        "(mutual TLS)",
        "backends: az-a: m ×1\n",
        "tenants: deptA (P0, no quota)",
        "admin tokens: operator: ops; viewer: watcher",
        "replicated sections: tenants, backends",
    ] {
        assert!(out.contains(want), "summary lacks {want:?}:\n{out}");
    }

    // Each mistake: exactly one line, naming the fix.
    let other = Pki::ca("another CA");
    type Mistake<'a> = (&'a str, Option<&'a str>, &'a dyn Fn(), &'a str);
    let mistakes: [Mistake; 6] = [
        (
            "no secret",
            None,
            &|| {},
            "export ZONEGATE_CLUSTER_SECRET=$(openssl rand -hex 32)",
        ),
        (
            "short secret",
            Some("change-me"),
            &|| {},
            "shorter than 16 bytes",
        ),
        (
            "wrong SAN",
            good_secret,
            &|| {
                ca.member(
                    dir.path(),
                    "node-2.zonegate",
                    &[ServerAuth, ClientAuth],
                    false,
                )
            },
            "needs the DNS SAN `node-1.zonegate`",
        ),
        (
            "server-only EKU",
            good_secret,
            &|| ca.member(dir.path(), "node-1.zonegate", &[ServerAuth], false),
            "reissue it with extendedKeyUsage = serverAuth, clientAuth",
        ),
        (
            "another CA",
            good_secret,
            &|| {
                other.member(
                    dir.path(),
                    "node-1.zonegate",
                    &[ServerAuth, ClientAuth],
                    false,
                )
            },
            "does not chain to",
        ),
        (
            "expired",
            good_secret,
            &|| {
                ca.member(
                    dir.path(),
                    "node-1.zonegate",
                    &[ServerAuth, ClientAuth],
                    true,
                )
            },
            "expired at 2021-01-01",
        ),
    ];
    for (what, secret, make, fix) in mistakes {
        make();
        let (ok, _, err) = check(secret);
        assert!(!ok, "{what}: check-config said ok");
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with(path.to_str().unwrap()))
            .collect();
        assert_eq!(lines.len(), 1, "{what}: one line naming the fix:\n{err}");
        assert!(lines[0].contains(fix), "{what}: {fix:?} not in:\n{err}");
        assert!(err.contains("1 problem(s)"), "{what}: {err}");
        // Undo this mistake for the next one.
        ca.member(
            dir.path(),
            "node-1.zonegate",
            &[ServerAuth, ClientAuth],
            false,
        );
    }
}
