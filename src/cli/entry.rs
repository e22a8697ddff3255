//! The long-running commands' futures, boxed in this crate for `main.rs`
//! to run. Awaited in the binary's crate, each command's whole future (a
//! node's start-up and serving, the demo, `ctl`, the mock backend, the
//! drill) was compiled again there: 93 s of a fresh `cargo build
//! --release` on 2 cores, for a 391-line `main.rs`. Boxed here, the
//! binary polls each through one vtable.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use crate::config::Config;

/// A command's future, as `main.rs` runs it.
pub type Command<T> = Pin<Box<dyn Future<Output = T>>>;

/// `zonegate serve`: loads the config file (an invalid one is the
/// error), then runs the node until a signal.
pub fn serve(config: &Path, opts: crate::node::start::ServeOptions) -> Command<anyhow::Result<()>> {
    let cfg = Config::load(config);
    Box::pin(async move { crate::node::start::run_with(cfg?, opts).await })
}

/// `zonegate demo`.
pub fn demo(opts: crate::tools::demo::DemoOptions) -> Command<anyhow::Result<()>> {
    Box::pin(crate::tools::demo::run(opts))
}

/// `zonegate ctl VERB` against `admin`.
pub fn ctl(
    admin: String,
    token: Option<String>,
    json: bool,
    verb: super::ctl::Verb,
) -> Command<anyhow::Result<()>> {
    Box::pin(async move { super::ctl::run(&admin, token.as_deref(), json, verb).await })
}

/// `zonegate mock-backend`.
pub fn mock(opts: crate::tools::mock::MockOptions) -> Command<anyhow::Result<()>> {
    Box::pin(crate::tools::mock::run(opts))
}

/// `zonegate drill`: its exit code.
pub fn drill(opts: zonegate_chaos::Options) -> Command<u8> {
    Box::pin(zonegate_chaos::run(opts))
}
