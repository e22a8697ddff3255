//! The request path, one stage per module: `auth` → `request` (read) →
//! `routing` (resolve, plan zones) → `affinity` (pin) → `quota` (admit) →
//! `balance` (pick) →
//! `forward` (with `retry`'s budget, over `upstream`'s pooled connections) → respond (`relay` streams the body,
//! `sse` reads event streams); `proxy` strings the stages together and
//! `error` is where its errors become HTTP. `backend` holds
//! each backend's live signals, `observe` the per-zone results the node
//! reports to the leader.

pub mod affinity;
pub mod auth;
pub mod backend;
pub mod balance;
pub mod budget;
pub mod connect;
pub mod cost;
pub mod error;
pub mod forward;
pub mod observe;
pub mod policy;
pub mod provider;
pub mod proxy;
pub mod quota;
pub mod relay;
pub mod request;
pub mod retry;
pub mod routing;
pub mod spend;
pub mod sse;
pub mod upstream;
