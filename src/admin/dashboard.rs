//! `GET /dashboard`: one self-contained page for on-call (zones, cluster,
//! backends with score sparklines, decisions, events; failover and
//! failback behind a dry run and a confirm step for operator tokens). Its
//! HTML, CSS and script are embedded in the binary: no CDN, no build step.
//!
//! The page itself is public and holds no data; it asks for a token
//! (kept in the browser's local storage, never in a URL) and reads the
//! admin API with it every 2 s, so the API's own token check guards
//! everything. A strict Content-Security-Policy allows only this origin's
//! script, style and API.

use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header;

const HTML: &str = include_str!("dashboard/index.html");
const CSS: &str = include_str!("dashboard/app.css");
const JS: &str = include_str!("dashboard/app.js");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; form-action 'none'; \
    frame-ancestors 'none'; base-uri 'none'";

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/dashboard",
            get(|| async { asset("text/html; charset=utf-8", HTML) }),
        )
        .route(
            "/dashboard/app.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
        .route(
            "/dashboard/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn page_and_assets_are_served_with_a_strict_policy() {
        for (path, ty) in [
            ("/dashboard", "text/html"),
            ("/dashboard/app.css", "text/css"),
            ("/dashboard/app.js", "text/javascript"),
        ] {
            let resp = router::<()>()
                .oneshot(
                    http::Request::get(path)
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            let h = resp.headers();
            assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(ty));
            assert!(h[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("script-src 'self'"));
        }
    }

    /// Self-contained: nothing is loaded from another origin, no inline
    /// script (the policy would block it), and data is never written as
    /// HTML.
    #[test]
    fn assets_load_nothing_from_elsewhere() {
        for text in [HTML, CSS, JS] {
            // The SVG namespace is a name, not something loaded.
            let text = text.replace("http://www.w3.org/2000/svg", "");
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        assert!(!HTML.contains("<script>"), "inline script");
        assert!(
            !JS.contains("innerHTML"),
            "data must go through textContent"
        );
    }
}
