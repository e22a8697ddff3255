//! Child processes of the `zonegate` binary that announce their addresses,
//! and how to start its nodes, mock backends and `ctl`: the drill's, and
//! (re-exported as `zonegate::tools::spawn`) the demo's, the black-box
//! tests' and the benchmarks'. It lives here, not in the `zonegate` package, because that
//! package's binary depends on this crate: one protocol, written once.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// A child process of ours that is killed when dropped, and the addresses
/// it announced on stdout.
pub struct Spawned {
    pub child: Child,
    pub urls: Vec<String>,
    /// The child's stdin; when we die this closes and a child started with
    /// `--exit-with-parent` exits too.
    pub stdin: Option<ChildStdin>,
}

/// Starts `cmd` (with `--exit-with-parent`, so it never outlives us) and waits (up to `timeout`) until it has printed `count`
/// lines containing `listening on http://`; returns those URLs. The rest of
/// its stdout is drained in the background so it never blocks on a pipe.
pub async fn spawn_listening(
    mut cmd: Command,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<Spawned> {
    // Its own process group: a terminal's Ctrl-C reaches only the parent
    // (the demo, the drill), which stops its children itself, in order.
    #[cfg(unix)]
    cmd.process_group(0);
    cmd.arg("--exit-with-parent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("cannot start child process")?;
    let stdin = child.stdin.take();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("child has no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut urls = Vec::new();
    let read = async {
        while urls.len() < count {
            match lines.next_line().await? {
                Some(line) => {
                    if let Some((_, url)) = line.split_once("listening on ") {
                        urls.push(url.trim().to_owned());
                    }
                }
                None => bail!("child exited before announcing its address"),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let status = child.wait().await.ok();
            bail!("{e} (exit status {status:?})");
        }
        Err(_) => bail!("child did not announce its address within {timeout:?}"),
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Spawned { child, urls, stdin })
}

/// A command running `exe` whose children log warnings and errors (when
/// the caller's `RUST_LOG` is unset).
pub fn child_command(exe: &Path) -> Command {
    // Peers that are still starting make openraft log connection
    // errors; the demo's console is for the operator's own output.
    child_command_logging(exe, "warn,openraft=off")
}

/// A command running `exe` with `RUST_LOG=filter` (when the caller's
/// `RUST_LOG` is unset; else the child inherits the caller's).
pub fn child_command_logging(exe: &Path, filter: &str) -> Command {
    let mut cmd = Command::new(exe);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", filter);
    }
    cmd
}

/// `zonegate ctl --admin <admin> --token <token>` from `exe`, free of the
/// caller's `ZONEGATE_ADMIN` and `ZONEGATE_ADMIN_TOKEN`: add the verb and
/// run it. The drill's `ctl` steps and the black-box tests run `ctl` here.
pub fn ctl_command(exe: &Path, admin: &str, token: &str) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["ctl", "--admin", admin, "--token", token])
        .env_remove("ZONEGATE_ADMIN")
        .env_remove("ZONEGATE_ADMIN_TOKEN");
    cmd
}

/// The environment variable that carries the cluster secret to `serve`.
pub const SECRET_ENV: &str = "ZONEGATE_CLUSTER_SECRET";

/// Starts `zonegate mock-backend` from `cmd` (e.g. [`child_command`]) on
/// 127.0.0.1 port 0 as backend `name` of `zone`, serving `models`; waits
/// up to `timeout` for its URL (`urls[0]`). The drill's local target, the
/// demo and the black-box tests start their mocks here.
pub async fn mock_backend<M: AsRef<str>>(
    cmd: Command,
    name: &str,
    zone: &str,
    models: &[M],
    timeout: Duration,
) -> anyhow::Result<Spawned> {
    mock_backend_with(cmd, name, zone, models, &[], timeout).await
}

/// [`mock_backend`] with extra `mock-backend` arguments (`--provider
/// anthropic`, `--expect-key K`, faults).
pub async fn mock_backend_with<M: AsRef<str>>(
    mut cmd: Command,
    name: &str,
    zone: &str,
    models: &[M],
    extra: &[&str],
    timeout: Duration,
) -> anyhow::Result<Spawned> {
    cmd.args([
        "mock-backend",
        "--listen",
        "127.0.0.1:0",
        "--name",
        name,
        "--zone",
        zone,
    ]);
    for m in models {
        cmd.args(["--model", m.as_ref()]);
    }
    cmd.args(extra);
    spawn_listening(cmd, 1, timeout)
        .await
        .with_context(|| format!("mock backend {name}"))
}

/// Starts `zonegate serve --config <config> <args>…` from `cmd`, with
/// `secret` (when given) as the cluster secret; waits up to `timeout` for
/// its data-plane and admin URLs (`urls[0]`, `urls[1]`). The drill's local
/// target, the demo and the black-box tests start their nodes here.
pub async fn serve(
    mut cmd: Command,
    config: &Path,
    secret: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> anyhow::Result<Spawned> {
    if let Some(secret) = secret {
        cmd.env(SECRET_ENV, secret);
    }
    cmd.arg("serve").arg("--config").arg(config).args(args);
    spawn_listening(cmd, 2, timeout).await
}

/// A loopback address with a port nobody uses right now; `127.0.0.1:0`
/// is resolved to a concrete port because cluster members must know each
/// other's addresses before they start.
///
/// The port is drawn below Linux's ephemeral range (32768+), where the
/// kernel never hands out ports for `bind(0)` or outgoing connections, so
/// between the check here and the child binding it, no other process's
/// port-0 listener or client socket can take it. Two processes drawing
/// ports at once (parallel test binaries, each starting clusters) could
/// still draw the same one; each drawn port is claimed by creating
/// `<temp>/zonegate-ports/<port>` first, and a claim counts for
/// `CLAIM_TTL`.
pub fn concrete_addr(addr: &str) -> anyhow::Result<String> {
    let parsed: std::net::SocketAddr = addr
        .parse()
        .with_context(|| format!("`{addr}` is not IP:port"))?;
    if parsed.port() != 0 {
        return Ok(addr.to_owned());
    }
    for _ in 0..64 {
        let mut candidate = parsed;
        candidate.set_port(fastrand::u16(20_000..32_000));
        if !claim(candidate.port()) {
            continue;
        }
        if let Ok(probe) = std::net::TcpListener::bind(candidate) {
            return Ok(probe.local_addr()?.to_string());
        }
    }
    let probe =
        std::net::TcpListener::bind(parsed).with_context(|| format!("cannot bind {addr}"))?;
    Ok(probe.local_addr()?.to_string())
}

/// How long a drawn port stays claimed against other processes' draws.
const CLAIM_TTL: Duration = Duration::from_secs(600);

/// Claims `port` for this process: false when another draw claimed it
/// less than `CLAIM_TTL` ago. Without a usable temp directory every port
/// is claimable (the draw is then only as safe as the bind probe).
fn claim(port: u16) -> bool {
    let dir = std::env::temp_dir().join("zonegate-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let path = dir.join(port.to_string());
    let fresh = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < CLAIM_TTL)
    };
    if fresh(&path) {
        return false;
    }
    // A stale claim is taken over; a race for it is settled by create_new.
    let _ = std::fs::remove_file(&path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drawn_port_is_not_drawn_again_while_claimed() {
        let addr = concrete_addr("127.0.0.1:0").expect("a port");
        let port: u16 = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        assert!((20_000..32_000).contains(&port), "{addr}");
        assert!(!claim(port), "a fresh claim holds against the next draw");
    }
}
