//! Traffic policy on the request path: which models and backends a tenant
//! may use (`eligible`), gray-release rules that send a stable share of a
//! model's users to another model (`rules`), and shadow copies compared in
//! the background without touching the client's answer (`shadow`). The
//! config is `config::policy`; with no rule, shadow, `models` or
//! `require_tags` configured each stage is one emptiness check.

pub mod eligible;
pub mod rules;
pub mod shadow;

pub use eligible::allows_model;
pub use shadow::Shadows;
