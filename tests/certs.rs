//! The certificate recipe (docs/src/certificates.md, deploy/certs.sh) makes
//! certificates zonegate accepts: the page's commands and the script are
//! run with openssl, `check-config` passes the member and admin TLS they
//! make, and `ctl` reaches an admin API over them with a client
//! certificate.
//!
//! openssl is installed by `.ci/run` (`ZONEGATE_REQUIRE_TOOLS=1` makes its
//! absence a failure); elsewhere the test is skipped with a note.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;

use support::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn have_openssl() -> bool {
    let found = StdCommand::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("ZONEGATE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "`openssl` is not installed but ZONEGATE_REQUIRE_TOOLS=1: run the install lines of .ci/run"
        );
        eprintln!("SKIPPED: `openssl` is not installed (.ci/run installs it)");
    }
    found
}

fn bash(dir: &Path, script: &str) {
    let out = StdCommand::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The blocks of `lang` of a Markdown file, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    text.split(&fence)
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_owned)
        .collect()
}

/// `check-config` on member `me`'s config with `tls` (relative paths in
/// `dir`): ok, with mutual TLS in its summary.
fn check_member(dir: &Path, me: usize, tls: &str) {
    let members = [
        MemberSpec::new(1, "az-a"),
        MemberSpec::new(2, "az-b"),
        MemberSpec::new(3, "az-c"),
    ];
    let rest = format!(
        "[[backends]]\nname = \"b\"\nzone = \"{}\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"m\"]\n\n{tls}",
        members[me].zone
    );
    let path = write_member_config(dir, &members[me], &members, &rest);
    let out = StdCommand::new(bin())
        .arg("check-config")
        .arg(&path)
        .env(
            "ZONEGATE_CLUSTER_SECRET",
            "a-cluster-secret-of-32-bytes-xxx",
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("(mutual TLS)"), "{text}");
    assert!(text.contains("TLS, client certificates required"), "{text}");
}

#[test]
fn the_guide_pages_openssl_steps_make_certificates_check_config_accepts() {
    if !have_openssl() {
        return;
    }
    let page = std::fs::read_to_string(root().join("docs/src/certificates.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    bash(dir.path(), &blocks(&page, "sh").join("\n"));
    let toml = blocks(&page, "toml");
    assert_eq!(toml.len(), 1, "one config block");
    check_member(dir.path(), 0, &toml[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_certs_sh_makes_member_admin_and_ctl_certificates_that_work() {
    if !have_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let script = root().join("deploy/certs.sh");
    bash(
        dir.path(),
        &format!("MEMBERS='1 2 3' {} {}", script.display(), certs.display()),
    );
    for f in [
        "ca.crt",
        "node-3.key",
        "admin.crt",
        "ctl.pem",
        "backend-ca-bundle.pem",
    ] {
        assert!(certs.join(f).is_file(), "{f} missing");
    }
    let c = |f: &str| certs.join(f).display().to_string();
    let member_tls = format!(
        "[cluster.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\n[admin.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
        c("node-2.crt"), c("node-2.key"), c("ca.crt"), c("admin.crt"), c("admin.key"), c("ca.crt")
    );
    check_member(dir.path(), 1, &member_tls);

    // The admin certificate names 127.0.0.1: ctl reaches the node over
    // HTTPS, trusting the CA and presenting its client certificate.
    let backend = format!(
        "[[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"https://127.0.0.1:9\"\nmodels = [\"m\"]\ntls = {{ ca = \"{}\" }}\n\n",
        c("backend-ca-bundle.pem")
    );
    let admin_tls = format!(
        "[admin.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
        c("admin.crt"),
        c("admin.key"),
        c("ca.crt")
    );
    let node = NodeProcess::start("az-a", &format!("{backend}{admin_tls}")).await;
    assert!(node.admin.starts_with("https://"), "{}", node.admin);
    let ctl = |client_cert: Option<String>| {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args([
            "ctl",
            "backends",
            "--admin",
            &node.admin,
            "--token",
            ADMIN_TOKEN,
        ])
        .env("ZONEGATE_CA_FILE", c("ca.crt"))
        .stdin(std::process::Stdio::null());
        match client_cert {
            Some(p) => cmd.env("ZONEGATE_CLIENT_CERT", p),
            None => cmd.env_remove("ZONEGATE_CLIENT_CERT"),
        };
        cmd.output()
    };
    let out = ctl(Some(c("ctl.pem"))).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("BACKEND"));
    let without = ctl(None).await.unwrap();
    assert!(
        !without.status.success(),
        "the admin API requires the client certificate"
    );
}
