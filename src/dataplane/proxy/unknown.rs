//! A request naming no model the routes know: its alias
//! (`[[models]] aliases`), else an answer that says what to send instead:
//! the model whose backends answer to that name ("did you mean"), or the
//! models this key may use.

use crate::config::Config;
use crate::dataplane::error::ApiError;
use crate::dataplane::routing::Routes;
use crate::telemetry::metrics::bounded_label;

/// At most this many model names in the error message; `/v1/models` has
/// the rest.
const LISTED: usize = 8;

/// The 404 for `asked`, with the hint a client needs to fix its request;
/// `may_use` says which models the caller's tenant may use (`[[tenants]]
/// models`): no other is suggested or listed.
pub(crate) fn unknown_model(
    cfg: &Config,
    routes: &Routes,
    asked: &str,
    may_use: &dyn Fn(&str) -> bool,
) -> ApiError {
    let shown = match bounded_label(asked) {
        all if all.len() == asked.len() => all.to_owned(),
        cut => format!("{cut}…"),
    };
    let hint = match did_you_mean(cfg, routes, asked).filter(|m| may_use(m)) {
        Some(m) => format!("; did you mean `{m}`?"),
        None => {
            let names: Vec<_> = routes
                .model_names()
                .into_iter()
                .filter(|m| may_use(m))
                .collect();
            let mut list: Vec<String> = names
                .iter()
                .take(LISTED)
                .map(|m| format!("`{m}`"))
                .collect();
            if names.len() > LISTED {
                list.push(format!("and {} more", names.len() - LISTED));
            }
            if list.is_empty() {
                "; this node serves no model yet".to_owned()
            } else {
                format!(
                    "; models this key may use: {} (GET /v1/models lists them)",
                    list.join(", ")
                )
            }
        }
    };
    ApiError::UnknownModel { model: shown, hint }
}

/// The logical model a near-miss name means: a backend's own name for it
/// (`model_names`, e.g. `Qwen/Qwen2.5-7B-Instruct` from a client that
/// called vLLM directly), or a model or alias spelled in another case.
fn did_you_mean<'a>(cfg: &'a Config, routes: &Routes, asked: &str) -> Option<&'a str> {
    let same = |a: &str| a.eq_ignore_ascii_case(asked);
    let physical = cfg.backends.iter().find_map(|b| {
        b.model_names
            .iter()
            .find(|(_, own)| same(own))
            .map(|(logical, _)| logical.as_str())
    });
    physical
        .or_else(|| {
            cfg.models
                .iter()
                .find(|m| same(&m.name) || m.aliases.iter().any(|a| same(a)))
                .map(|m| m.name.as_str())
        })
        .filter(|m| routes.model(m).is_some())
}
