//! Child processes of the `zonegate` binary that announce their addresses:
//! the drill's nodes and mock backends, and (re-exported as
//! `zonegate::tools::spawn`) the demo's, the black-box tests' and the
//! benchmarks'. It lives here, not in the `zonegate` package, because that
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

pub fn child_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    if std::env::var_os("RUST_LOG").is_none() {
        // Peers that are still starting make openraft log connection
        // errors; the demo's console is for the operator's own output.
        cmd.env("RUST_LOG", "warn,openraft=off");
    }
    cmd
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
