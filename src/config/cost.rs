//! Validation of prices (`[[models]] price`, `[[backends]] price`) and of
//! the tenants' budgets (`[[tenants]] budget`, `on_budget`) into a
//! [`CostConfig`]. Amounts are kept in nano-units of the currency (10⁻⁹)
//! as integers, so budgets split and sum exactly on every node.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use super::bounds;
use super::raw::{RawBackend, RawModel, RawTenant};
use super::{ConfigError, Validator};

/// Nano-units per base unit of a currency (1 USD = 10⁹ nano-USD).
pub const NANOS_PER_UNIT: f64 = 1e9;

/// The currency prices and budgets are in when no price names one.
pub const DEFAULT_CURRENCY: &str = "USD";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrice {
    #[serde(default)]
    input_per_mtok: f64,
    #[serde(default)]
    output_per_mtok: f64,
    currency: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    per_day: Option<f64>,
    per_month: Option<f64>,
}

/// What a tenant over its budget gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBudget {
    /// 429 `budget_exceeded` with `Retry-After` to the period's end.
    #[default]
    Reject,
    /// The cheapest model of the request's chain that meets its tier.
    Cheapest,
}

/// A price per million tokens, in nano-units per token (the same number:
/// 1 unit per 10⁶ tokens is 10³ nano-units per token).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    /// Nano-units per input (prompt) token.
    pub input_nanos: f64,
    /// Nano-units per output (completion) token.
    pub output_nanos: f64,
}

impl Price {
    /// A price from its per-million-token figures in base units.
    pub fn per_mtok(input: f64, output: f64) -> Self {
        Self {
            input_nanos: input * NANOS_PER_UNIT / 1e6,
            output_nanos: output * NANOS_PER_UNIT / 1e6,
        }
    }
}

/// A tenant's budget in nano-units per UTC day and per UTC month.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub per_day: Option<u64>,
    pub per_month: Option<u64>,
    pub on_budget: OnBudget,
}

impl Budget {
    /// Whether any period is limited.
    pub fn is_limited(&self) -> bool {
        self.per_day.is_some() || self.per_month.is_some()
    }
}

/// Prices and budgets, validated.
#[derive(Clone, Debug, Default)]
pub struct CostConfig {
    /// The one currency of every price and budget.
    pub currency: Arc<str>,
    /// Logical model → its price.
    pub models: HashMap<String, Price>,
    /// Backend → its price (for every model it serves), overriding the
    /// model's.
    pub backends: HashMap<String, Price>,
    /// Logical model → the highest price any of its backends charges
    /// (its own, or a backend's override), per kind of token: what a
    /// budget reserves at admission, before a backend is picked.
    pub ceilings: HashMap<String, Price>,
    /// Per tenant, in the order of `tenants`.
    pub budgets: Vec<Budget>,
}

impl CostConfig {
    /// The price of `model` answered by `backend`: the backend's override,
    /// else the model's; `None` when neither is priced (it costs nothing).
    pub fn price(&self, backend: &str, model: &str) -> Option<Price> {
        self.backends
            .get(backend)
            .or_else(|| self.models.get(model))
            .copied()
    }

    /// The most a token of `model` may cost on any of its backends.
    pub fn ceiling(&self, model: &str) -> Option<Price> {
        self.ceilings.get(model).copied()
    }
}

impl Validator<'_> {
    /// Takes the budgets out of the raw tenants and checks every price.
    pub(super) fn costs(
        &self,
        tenants: &mut [RawTenant],
        backends: &[RawBackend],
        models: &[RawModel],
    ) -> Result<CostConfig, ConfigError> {
        let mut currency: Option<(String, String)> = None;
        let mut price = |key: String, p: &RawPrice| -> Result<Price, ConfigError> {
            for (field, v) in [
                ("input_per_mtok", p.input_per_mtok),
                ("output_per_mtok", p.output_per_mtok),
            ] {
                self.real(&format!("{key}.{field}"), Some(v), 0.0, bounds::PRICE)?;
            }
            let c = p.currency.as_deref().unwrap_or(DEFAULT_CURRENCY);
            if c.len() != 3 || !c.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(self.err(
                    format!("{key}.currency"),
                    format!("`{c}` is not an ISO 4217 code such as \"USD\""),
                ));
            }
            match &currency {
                Some((first, at)) if first != c => {
                    return Err(self.err(
                        format!("{key}.currency"),
                        format!("`{c}` differs from `{first}` at {at}: spend and budgets are summed in one currency"),
                    ))
                }
                Some(_) => {}
                None => currency = Some((c.to_owned(), format!("{key}.currency"))),
            }
            Ok(Price::per_mtok(p.input_per_mtok, p.output_per_mtok))
        };
        let mut out = CostConfig::default();
        for (i, m) in models.iter().enumerate() {
            if let Some(p) = &m.price {
                out.models
                    .insert(m.name.clone(), price(format!("models[{i}].price"), p)?);
            }
        }
        for (i, b) in backends.iter().enumerate() {
            if let Some(p) = &b.price {
                out.backends
                    .insert(b.name.clone(), price(format!("backends[{i}].price"), p)?);
            }
        }
        for b in backends {
            for m in &b.models {
                let own = out.models.get(m).copied();
                let over = out.backends.get(&b.name).copied().or(own);
                let top = match (out.ceilings.get(m).copied().or(own), over) {
                    (Some(a), Some(b)) => Some(Price {
                        input_nanos: a.input_nanos.max(b.input_nanos),
                        output_nanos: a.output_nanos.max(b.output_nanos),
                    }),
                    (a, b) => a.or(b),
                };
                if let Some(p) = top {
                    out.ceilings.insert(m.clone(), p);
                }
            }
        }
        for (i, t) in tenants.iter_mut().enumerate() {
            let key = format!("tenants[{i}]");
            let on_budget = t.on_budget.take().unwrap_or_default();
            let mut budget = Budget {
                on_budget,
                ..Budget::default()
            };
            if let Some(b) = t.budget.take() {
                let amount = |field: &str, v: Option<f64>| -> Result<Option<u64>, ConfigError> {
                    v.map(|v| {
                        let v = self.real(
                            &format!("{key}.budget.{field}"),
                            Some(v),
                            0.0,
                            bounds::BUDGET,
                        )?;
                        Ok((v * NANOS_PER_UNIT).round() as u64)
                    })
                    .transpose()
                };
                budget.per_day = amount("per_day", b.per_day)?;
                budget.per_month = amount("per_month", b.per_month)?;
                if !budget.is_limited() {
                    return Err(
                        self.err(format!("{key}.budget"), "needs per_day, per_month or both")
                    );
                }
            } else if on_budget == OnBudget::Cheapest {
                return Err(self.err(format!("{key}.on_budget"), "needs a budget"));
            }
            out.budgets.push(budget);
        }
        out.currency = currency
            .map_or(DEFAULT_CURRENCY.to_owned(), |(c, _)| c)
            .into();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error_of, MINIMAL};
    use super::super::Config;
    use super::*;

    /// MINIMAL with `tenant` lines on its tenant, `backend` lines on its
    /// backend, and `rest` appended.
    fn with(tenant: &str, backend: &str, rest: &str) -> String {
        let text = MINIMAL
            .replace("priority = \"P0\"", &format!("priority = \"P0\"\n{tenant}"))
            .replace(
                "models = [\"qwen25-7b-instruct\"]",
                &format!("models = [\"qwen25-7b-instruct\"]\n{backend}"),
            );
        format!("{text}\n{rest}")
    }

    const MODEL_EUR: &str = "[[models]]\nname = \"qwen25-7b-instruct\"\nprice = { input_per_mtok = 0.5, output_per_mtok = 1.5, currency = \"EUR\" }";

    #[test]
    fn prices_and_budgets_are_read_in_nano_units() {
        let c = Config::parse(
            "t.toml",
            &with(
                "budget = { per_day = 50.0, per_month = 1000.0 }\non_budget = \"cheapest\"",
                "price = { input_per_mtok = 1.0, output_per_mtok = 2.0, currency = \"EUR\" }",
                MODEL_EUR,
            ),
        )
        .unwrap();
        let costs = &c.costs;
        let m = "qwen25-7b-instruct";
        assert_eq!(&*costs.currency, "EUR");
        assert_eq!(costs.price("other", m), Some(Price::per_mtok(0.5, 1.5)));
        assert_eq!(costs.price("qwen-a1", m), Some(Price::per_mtok(1.0, 2.0)));
        assert_eq!(costs.price("other", "unpriced"), None);
        // The admission ceiling is the dearest of the model and its backends.
        assert_eq!(costs.ceiling(m), Some(Price::per_mtok(1.0, 2.0)));
        assert_eq!(costs.ceiling("unpriced"), None);
        let b = costs.budgets[0];
        assert_eq!(b.per_day, Some(50_000_000_000));
        assert_eq!(b.per_month, Some(1_000_000_000_000));
        assert_eq!(b.on_budget, OnBudget::Cheapest);
        let c = Config::parse("t.toml", MINIMAL).unwrap();
        assert!(!c.costs.budgets[0].is_limited());
        assert_eq!(&*c.costs.currency, "USD");
    }

    #[test]
    fn mixed_currencies_and_empty_budgets_are_refused_with_their_key() {
        let e = error_of(&with(
            "",
            "price = { input_per_mtok = 1.0, output_per_mtok = 2.0 }",
            MODEL_EUR,
        ));
        assert_eq!(e.key, "backends[0].price.currency", "{e}");
        let e = error_of(&with(
            "",
            "price = { input_per_mtok = 1.0, output_per_mtok = 2.0, currency = \"usd\" }",
            "",
        ));
        assert_eq!(e.key, "backends[0].price.currency", "{e}");
        let e = error_of(&with("budget = {}", "", ""));
        assert_eq!(e.key, "tenants[0].budget", "{e}");
        let e = error_of(&with("on_budget = \"cheapest\"", "", ""));
        assert_eq!(e.key, "tenants[0].on_budget", "{e}");
        let e = error_of(&with("budget = { per_day = -1.0 }", "", ""));
        assert_eq!(e.key, "tenants[0].budget.per_day", "{e}");
    }
}
