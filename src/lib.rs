//! zonegate: a multi-zone, active-active AI inference gateway.
//!
//! The data plane (`proxy` → `routing`/`balance` → `forward`) reads an
//! immutable route table and the control plane's latest `ClusterView`; it
//! never waits on the control plane. See ARCHITECTURE.md for the map.

pub mod admin;
pub mod affinity;
pub mod auth;
pub mod backend;
pub mod balance;
pub mod config;
pub mod ctl;
pub mod demo;
pub mod error;
pub mod events;
pub mod forward;
pub mod gateway;
pub mod health;
pub mod mock;
pub mod observe;
pub mod proxy;
pub mod request;
pub mod retry;
pub mod routing;
pub mod serve;
pub mod telemetry;
