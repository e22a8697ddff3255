//! zonegate: a multi-zone, active-active AI inference gateway.
//!
//! The folders are the planes: `dataplane` (the request path) reads an
//! immutable route table and the control plane's latest `ClusterView` and
//! never waits on the control plane; `health` scores backends; `admin` is
//! the operators' API; `node` starts a node and holds its shared state;
//! `cli` and `tools` are the other subcommands. See ARCHITECTURE.md.

pub mod admin;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dataplane;
pub mod health;
pub mod node;
pub mod telemetry;
pub mod tools;
