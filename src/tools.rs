//! Subcommands that are not a node: the mock backend, the demo, and the
//! child-process helpers the demo, tests and benchmarks share. Nothing in
//! the request path imports them.

pub mod demo;
pub mod mock;
pub mod mock_anthropic;
pub mod spawn;
