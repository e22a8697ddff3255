//! What a request cost, pure: the tokens an answer used (its `usage`, else
//! the estimate the quota stage charged) times the price of the backend
//! that produced each part of it (a continued stream has a part per
//! backend). Amounts are nano-units of the config's one currency
//! (`config::cost::NANOS_PER_UNIT` per base unit), as integers.

use smallvec::SmallVec;

use crate::config::cost::Price;
use crate::dataplane::sse::Usage;

/// Tokens in (prompt) and out (completion).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

impl From<Usage> for Tokens {
    fn from(u: Usage) -> Self {
        Self {
            input: u.prompt_tokens,
            output: u.completion_tokens,
        }
    }
}

/// `tokens` at `price` in nano-units, rounded to the nearest; an unpriced
/// part costs nothing. Saturates rather than overflows.
pub fn cost_nanos(tokens: Tokens, price: Option<Price>) -> u64 {
    let Some(p) = price else { return 0 };
    let c = tokens.input as f64 * p.input_nanos + tokens.output as f64 * p.output_nanos;
    if c.is_finite() && c > 0.0 {
        // `as` saturates at u64::MAX.
        c.round() as u64
    } else {
        0
    }
}

/// What the quota stage estimated at admission: the prompt from the body's
/// size, and the output the request asked for at most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    pub prompt: u64,
    pub max_output: u64,
}

impl Estimate {
    /// The tokens of an answer without `usage`: the estimated prompt, and
    /// the output from the bytes delivered (about four a token), never
    /// above the output asked for (as the quota's settlement).
    pub fn tokens(&self, delivered: u64) -> Tokens {
        Tokens {
            input: self.prompt,
            output: (delivered / crate::dataplane::quota::BYTES_PER_TOKEN).min(self.max_output),
        }
    }

    /// The most the request may cost at `price`: its prompt and the whole
    /// output it may ask for (what a budget reserves at admission).
    pub fn ceiling(&self, price: Option<Price>) -> u64 {
        cost_nanos(
            Tokens {
                input: self.prompt,
                output: self.max_output,
            },
            price,
        )
    }
}

/// One part of a continued answer that ended before the last: the output
/// it delivered (its text events) and the price of its backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    pub output: u64,
    pub price: Option<Price>,
}

/// The parts before the last of one answer (none for most).
pub type Parts = SmallVec<[Part; 1]>;

/// The cost of a whole answer: each earlier part's delivered output and
/// the estimated prompt (each backend read the prompt) at its backend's
/// price; the last part gets what the answer's `usage` (which counts both
/// parts) leaves after the earlier parts, or without `usage` the estimate
/// from the bytes the client got after them, at the last backend's price.
pub fn answer_cost(
    usage: Option<Usage>,
    estimate: Estimate,
    delivered: u64,
    earlier: &[Part],
    last: Option<Price>,
) -> u64 {
    let mut total = 0u64;
    let mut earlier_out = 0u64;
    for p in earlier {
        let t = Tokens {
            input: estimate.prompt,
            output: p.output,
        };
        total = total.saturating_add(cost_nanos(t, p.price));
        earlier_out = earlier_out.saturating_add(p.output);
    }
    let last_tokens = match usage {
        Some(u) => {
            let t = Tokens::from(u);
            // A continued answer's usage may count every prompt: the
            // earlier parts were charged theirs already.
            let prompts = (earlier.len() as u64).saturating_mul(estimate.prompt);
            Tokens {
                input: if earlier.is_empty() {
                    t.input
                } else {
                    t.input
                        .saturating_sub(prompts)
                        .max(estimate.prompt.min(t.input))
                },
                output: t.output.saturating_sub(earlier_out),
            }
        }
        None => {
            let all = estimate.tokens(delivered);
            Tokens {
                input: all.input,
                output: all.output.saturating_sub(earlier_out),
            }
        }
    };
    total.saturating_add(cost_nanos(last_tokens, last))
}

/// What a shadow copy's answer cost, counted apart from the client's
/// spend (`zonegate_shadow_spend_total`, never a tenant's budget): its
/// `usage` (else the estimate from the `delivered` text bytes) at `price`,
/// the price of the target backend that answered it. A copy that got no
/// status (timed out before its head, refused) or an error without
/// `usage` costs nothing, as a client's error answer does.
pub fn shadow_cost(
    status: Option<u16>,
    usage: Option<Usage>,
    estimate: Estimate,
    delivered: u64,
    price: Option<Price>,
) -> u64 {
    match status {
        None => 0,
        Some(s) if usage.is_none() && !(200..300).contains(&s) => 0,
        Some(_) => answer_cost(usage, estimate, delivered, &[], price),
    }
}

/// Nano-units as base units (for metrics and the admin API).
pub fn units(nanos: u64) -> f64 {
    nanos as f64 / crate::config::cost::NANOS_PER_UNIT
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(p: u64, c: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: p,
            completion_tokens: c,
        })
    }

    #[test]
    fn cost_table() {
        // $0.50 in, $1.50 out per million tokens.
        let cheap = Some(Price::per_mtok(0.5, 1.5));
        // A backend override at $1 / $2.
        let over = Some(Price::per_mtok(1.0, 2.0));
        let est = Estimate {
            prompt: 100,
            max_output: 256,
        };
        let part = |output, price| Part { output, price };
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, Option<Usage>, u64, &[Part], Option<Price>, u64)] = &[
            // 1M in at 0.5 + 1M out at 1.5 = 2.0 units = 2e9 nanos.
            (
                "usage, model price",
                usage(1_000_000, 1_000_000),
                0,
                &[],
                cheap,
                2_000_000_000,
            ),
            (
                "usage, backend override",
                usage(1_000_000, 1_000_000),
                0,
                &[],
                over,
                3_000_000_000,
            ),
            // 10 in × 500 + 20 out × 1500 nanos.
            ("small usage", usage(10, 20), 0, &[], cheap, 35_000),
            ("unpriced costs nothing", usage(10, 20), 0, &[], None, 0),
            ("zero usage", usage(0, 0), 0, &[], cheap, 0),
            // No usage: 100 prompt (estimate) + 400 bytes / 4 = 100 out.
            (
                "missing usage: estimate",
                None,
                400,
                &[],
                cheap,
                100 * 500 + 100 * 1500,
            ),
            // No usage: output capped at max_output (256).
            (
                "missing usage: capped",
                None,
                1_000_000,
                &[],
                cheap,
                100 * 500 + 256 * 1500,
            ),
            // Continued: 30 tokens by the override backend, then the rest
            // of usage's 50 (20) by the cheap one; the usage counts both
            // prompts (200), the earlier part paid its 100.
            (
                "continuation, both parts",
                usage(200, 50),
                0,
                &[part(30, over)],
                cheap,
                (100 * 1000 + 30 * 2000) + (100 * 500 + 20 * 1500),
            ),
            // Continued without usage: 200 bytes = 50 out, 30 of them
            // before the break.
            (
                "continuation, missing usage",
                None,
                200,
                &[part(30, over)],
                cheap,
                (100 * 1000 + 30 * 2000) + (100 * 500 + 20 * 1500),
            ),
            // A usage smaller than the earlier part's deltas: nothing is
            // negative.
            (
                "continuation, short usage",
                usage(10, 5),
                0,
                &[part(30, cheap)],
                cheap,
                (100 * 500 + 30 * 1500) + 10 * 500,
            ),
        ];
        for (name, u, delivered, earlier, last, want) in cases {
            assert_eq!(
                answer_cost(*u, est, *delivered, earlier, *last),
                *want,
                "{name}"
            );
        }
    }

    #[test]
    fn shadow_cost_table() {
        // The target model's price, and a target backend's override.
        let model = Some(Price::per_mtok(0.5, 1.5));
        let over = Some(Price::per_mtok(1.0, 2.0));
        let est = Estimate {
            prompt: 100,
            max_output: 256,
        };
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, Option<u16>, Option<Usage>, u64, Option<Price>, u64)] = &[
            (
                "usage, model price",
                Some(200),
                usage(10, 20),
                0,
                model,
                35_000,
            ),
            (
                "usage, target backend override",
                Some(200),
                usage(10, 20),
                0,
                over,
                10 * 1000 + 20 * 2000,
            ),
            // No usage: the estimated prompt and 400 bytes / 4 = 100 out.
            (
                "missing usage: estimate",
                Some(200),
                None,
                400,
                model,
                100 * 500 + 100 * 1500,
            ),
            (
                "missing usage: capped at the output asked for",
                Some(200),
                None,
                1_000_000,
                model,
                100 * 500 + 256 * 1500,
            ),
            ("error without usage", Some(500), None, 400, model, 0),
            (
                "error with usage is charged",
                Some(500),
                usage(10, 0),
                0,
                model,
                10 * 500,
            ),
            ("timed out before its head", None, None, 400, model, 0),
            ("unpriced target", Some(200), usage(10, 20), 0, None, 0),
        ];
        for (name, status, u, delivered, price, want) in cases {
            assert_eq!(
                shadow_cost(*status, *u, est, *delivered, *price),
                *want,
                "{name}"
            );
        }
    }

    #[test]
    fn huge_token_counts_saturate_instead_of_overflowing() {
        let p = Some(Price::per_mtok(1_000_000.0, 1_000_000.0));
        let t = Tokens {
            input: u64::MAX,
            output: u64::MAX,
        };
        assert_eq!(cost_nanos(t, p), u64::MAX);
        let est = Estimate {
            prompt: u64::MAX,
            max_output: u64::MAX,
        };
        assert_eq!(est.ceiling(p), u64::MAX);
        let parts = [Part {
            output: u64::MAX,
            price: p,
        }];
        assert_eq!(
            answer_cost(usage(u64::MAX, u64::MAX), est, u64::MAX, &parts, p),
            u64::MAX
        );
    }

    #[test]
    fn the_ceiling_reserves_the_whole_output_asked_for() {
        let est = Estimate {
            prompt: 10,
            max_output: 100,
        };
        assert_eq!(
            est.ceiling(Some(Price::per_mtok(1.0, 2.0))),
            10 * 1000 + 100 * 2000
        );
        assert_eq!(est.ceiling(None), 0);
    }
}
