//! `zonegate ctl spend [--tenant T] [--since 24h]`: what each tenant spent
//! per model (`GET /admin/v1/spend`): the node's own answers, and asked of
//! the leader the cluster's; apart, what shadow copies cost; with each
//! budget, its grants and the spend recorded at the last rebalance.

use reqwest::Method;
use serde_json::Value;

use super::ctl::Api;

/// `ctl spend`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SpendCmd {
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// How far back, a duration (`24h`, `30m`, `7d`; at most 32 days,
    /// counted by the hour).
    #[arg(long, default_value = "24h")]
    pub since: String,
}

pub(crate) async fn run(api: &Api, json_out: bool, cmd: SpendCmd) -> anyhow::Result<()> {
    let mut path = format!("/admin/v1/spend?since={}", super::ctl::query(&cmd.since));
    if let Some(t) = &cmd.tenant {
        path.push_str(&format!("&tenant={}", super::ctl::query(t)));
    }
    let v = api.call(Method::GET, &path, None).await?;
    if json_out {
        println!("{v}");
    } else {
        print!("{}", render(&v));
    }
    Ok(())
}

/// The human table of an answer.
pub fn render(v: &Value) -> String {
    let currency = v["currency"].as_str().unwrap_or("");
    let mut out = String::new();
    // `who` names the line's owner: "tenant", or "shadow" for the copies.
    let mut table = |title: &str, tenants: &Value, who: &str| {
        out.push_str(title);
        out.push('\n');
        let rows = tenants.as_array().map(Vec::as_slice).unwrap_or_default();
        if rows.is_empty() {
            out.push_str("  (no spend)\n");
        }
        for t in rows {
            out.push_str(&format!(
                "  {:<20} {:>14.6} {currency}\n",
                t[who].as_str().unwrap_or("?"),
                t["spend"].as_f64().unwrap_or(0.0)
            ));
            for m in t["models"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                out.push_str(&format!(
                    "    {:<18} {:>14.6}\n",
                    m["model"].as_str().unwrap_or("?"),
                    m["spend"].as_f64().unwrap_or(0.0)
                ));
            }
        }
    };
    table(
        &format!(
            "spend on node {} ({})",
            v["node"],
            v["zone"].as_str().unwrap_or("?")
        ),
        &v["node_spend"],
        "tenant",
    );
    if v["leader"].as_bool() == Some(true) {
        table(
            "spend in the cluster (reported to this leader)",
            &v["cluster_spend"],
            "tenant",
        );
    }
    if v.get("shadow_spend").is_some() {
        table(
            "shadow copies on this node (apart: no tenant's spend, no budget)",
            &v["shadow_spend"],
            "shadow",
        );
    }
    for b in v["budgets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        for p in b["periods"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let num = |k: &str| p[k].as_f64().map_or("-".to_owned(), |x| format!("{x:.6}"));
            out.push_str(&format!(
                "budget {} per {}: limit {} {currency}, granted {}, recorded spent {} (on_budget {})\n",
                b["tenant"].as_str().unwrap_or("?"),
                p["period"].as_str().unwrap_or("?"),
                num("limit"),
                num("granted"),
                num("recorded_spent"),
                b["on_budget"].as_str().unwrap_or("?"),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn spend_renders_per_tenant_and_model_with_budgets() {
        let v = json!({
            "node": 1, "zone": "az-a", "currency": "USD", "leader": true,
            "node_spend": [{"tenant": "t", "spend": 1.5, "models": [{"model": "m", "spend": 1.5}]}],
            "cluster_spend": [],
            "shadow_spend": [{"shadow": "sh", "spend": 0.25, "models": [{"model": "new", "spend": 0.25}]}],
            "budgets": [{"tenant": "t", "on_budget": "reject", "periods": [
                {"period": "day", "limit": 50.0, "granted": 10.0, "recorded_spent": 1.0}
            ]}],
        });
        let text = super::render(&v);
        assert!(
            text.contains("t                          1.500000 USD"),
            "{text}"
        );
        assert!(
            text.contains("    m                        1.500000"),
            "{text}"
        );
        assert!(text.contains("spend in the cluster"), "{text}");
        assert!(
            text.contains("shadow copies on this node (apart: no tenant's spend, no budget)\n  sh                         0.250000 USD\n    new                      0.250000\n"),
            "{text}"
        );
        assert!(text.contains("  (no spend)"), "{text}");
        assert!(
            text.contains("budget t per day: limit 50.000000 USD, granted 10.000000"),
            "{text}"
        );
    }
}
