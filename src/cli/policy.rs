//! `zonegate ctl rules` and `ctl shadows [NAME]`: the traffic policy as a
//! node sees it (`GET /admin/v1/rules`, `GET /admin/v1/shadows[/{name}]`):
//! each rule's configured against its realised share, each tenant's
//! allowed models and tags, each shadow's agreement and latency delta, and
//! one shadow's last disagreements.

use reqwest::Method;
use serde_json::Value;

use super::ctl::Api;

/// `ctl shadows [NAME]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShadowsCmd {
    /// One shadow, with its last disagreements.
    pub name: Option<String>,
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(s).collect::<Vec<_>>().join(","),
        v => v.to_string(),
    }
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    std::iter::once(line(&head))
        .chain(rows.iter().map(|r| line(r)))
        .collect()
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// The tables of `GET /admin/v1/rules`.
pub fn render_rules(v: &Value) -> String {
    let rules: Vec<Vec<String>> = list(&v["rules"])
        .iter()
        .map(|r| {
            vec![
                s(&r["name"]),
                s(&r["model"]),
                s(&r["route_to"]),
                s(&r["match"]["tenants"]),
                format!("{}%", s(&r["percent"])),
                match &r["realised_percent"] {
                    Value::Null => "-".into(),
                    p => format!("{p}%"),
                },
                format!("{}/{}", s(&r["matched"]), s(&r["evaluated"])),
            ]
        })
        .collect();
    let tenants: Vec<Vec<String>> = list(&v["tenants"])
        .iter()
        .map(|t| {
            let reach = t["reachable"]
                .as_object()
                .map(|m| m.values().map(|b| list(b).len()).sum::<usize>())
                .unwrap_or(0);
            vec![
                s(&t["name"]),
                match &t["models"] {
                    Value::Null => "any".into(),
                    m => s(m),
                },
                s(&t["require_tags"]),
                reach.to_string(),
            ]
        })
        .collect();
    format!(
        "{}\n{}",
        table(
            &[
                "RULE",
                "MODEL",
                "ROUTE_TO",
                "TENANTS",
                "PERCENT",
                "REALISED",
                "MATCHED/EVALUATED"
            ],
            &rules
        ),
        table(
            &["TENANT", "MODELS", "REQUIRE_TAGS", "REACHABLE_BACKENDS"],
            &tenants
        )
    )
}

fn shadow_row(x: &Value) -> Vec<String> {
    vec![
        s(&x["name"]),
        format!("{} -> {}", s(&x["model"]), s(&x["to"])),
        format!("{}%", s(&x["percent"])),
        format!("{}/{}", s(&x["in_flight"]), s(&x["max_in_flight"])),
        s(&x["sent"]),
        s(&x["skipped_in_flight"]),
        format!("{}/{}/{}", s(&x["ok"]), s(&x["errors"]), s(&x["timeouts"])),
        s(&x["agreement"]),
        s(&x["latency_delta_s"]["p50"]),
        s(&x["similarity"]["p50"]),
        x["spend"].as_f64().map_or("-".into(), |f| {
            format!("{f:.6} {}", x["currency"].as_str().unwrap_or(""))
        }),
    ]
}

const SHADOW_HEADER: [&str; 11] = [
    "SHADOW",
    "MODELS",
    "PERCENT",
    "IN_FLIGHT",
    "SENT",
    "SKIPPED",
    "OK/ERR/TIMEOUT",
    "AGREEMENT",
    "DELTA_P50_S",
    "SIMILARITY_P50",
    "SPEND",
];

/// The table of `GET /admin/v1/shadows`, or one shadow with its
/// disagreements.
pub fn render_shadows(v: &Value) -> String {
    if v.get("shadows").is_some() {
        let rows: Vec<Vec<String>> = list(&v["shadows"]).iter().map(shadow_row).collect();
        return table(&SHADOW_HEADER, &rows);
    }
    let rows: Vec<Vec<String>> = list(&v["disagreements"])
        .iter()
        .map(|d| {
            vec![
                s(&d["request_id"]),
                format!("{}/{}", s(&d["primary_status"]), s(&d["shadow_status"])),
                format!(
                    "{}/{}",
                    s(&d["primary_first_byte_ms"]),
                    s(&d["shadow_first_byte_ms"])
                ),
                s(&d["similarity"]),
                s(&d["reason"]),
            ]
        })
        .collect();
    format!(
        "{}\nlast disagreements (newest first):\n{}",
        table(&SHADOW_HEADER, &[shadow_row(v)]),
        table(
            &[
                "REQUEST_ID",
                "STATUS P/S",
                "FIRST_BYTE_MS P/S",
                "SIMILARITY",
                "REASON"
            ],
            &rows
        )
    )
}

/// Runs `ctl rules` (`shadows: None`) or `ctl shadows`.
pub(crate) async fn run(
    api: &Api,
    json_out: bool,
    shadows: Option<ShadowsCmd>,
) -> anyhow::Result<()> {
    let (path, render): (String, fn(&Value) -> String) = match &shadows {
        None => ("/admin/v1/rules".into(), render_rules),
        Some(ShadowsCmd { name: None }) => ("/admin/v1/shadows".into(), render_shadows),
        Some(ShadowsCmd { name: Some(n) }) => (
            format!("/admin/v1/shadows/{}", super::ctl::query(n)),
            render_shadows,
        ),
    };
    let v = api.call(Method::GET, &path, None).await?;
    if json_out {
        println!("{v}");
    } else {
        print!("{}", render(&v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_show_configured_against_realised_share() {
        let v = json!({"rules": [{"name": "gray", "model": "a", "route_to": "b", "match": {"tenants": []}, "percent": 5.0, "realised_percent": 4.87, "matched": 487, "evaluated": 10000}], "tenants": [{"name": "fin", "models": ["a*"], "require_tags": ["private"], "reachable": {"a": ["p1", "p2"]}}]});
        let out = render_rules(&v);
        assert!(
            out.contains("gray") && out.contains("5.0%") && out.contains("4.87%"),
            "{out}"
        );
        assert!(out.contains("487/10000"), "{out}");
        assert!(
            out.contains("fin") && out.contains("private") && out.contains("  2"),
            "{out}"
        );
    }

    #[test]
    fn shadows_show_what_their_copies_cost() {
        let v = json!({"shadows": [{"name": "sh", "model": "a", "to": "b", "percent": 10.0, "in_flight": 0, "max_in_flight": 8, "sent": 3, "skipped_in_flight": 0, "ok": 3, "errors": 0, "timeouts": 0, "agreement": 1.0, "latency_delta_s": {"p50": 0.1}, "similarity": {"p50": 1.0}, "spend": 0.072, "currency": "USD"}]});
        let out = render_shadows(&v);
        let header = out.lines().next().unwrap_or_default();
        assert!(header.ends_with("SPEND"), "{out}");
        assert!(out.contains("0.072000 USD"), "{out}");
    }
}
