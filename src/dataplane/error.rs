//! The one place errors become HTTP: OpenAI's error JSON
//! (`{"error":{"message","type","param","code"}}`) with the right status.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde_json::json;

/// Everything the data plane can answer with instead of a backend response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing API key: send `Authorization: Bearer <key>`")]
    MissingKey,
    #[error("incorrect API key provided")]
    WrongKey,
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// `model_not_found` with what to send instead (a near-miss name, or
    /// the models the key may use).
    #[error("the model `{model}` does not exist{hint}")]
    UnknownModel { model: String, hint: String },
    #[error("unknown path {0}")]
    UnknownPath(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    #[error("the request body was not received within {0:?}")]
    BodyTimeout(std::time::Duration),
    #[error("{0}")]
    ZoneUnavailable(String),
    #[error("{message}")]
    NoBackend { message: String },
    #[error("{message}")]
    AllBusy { message: String, retry_after_s: u64 },
    /// Over the tenant's allocation on this node or a model's limit
    /// (`kind` is OpenAI's `type`: `requests` or `tokens`), with the
    /// tenant's `x-ratelimit-*` headers.
    #[error("{message}")]
    RateLimited {
        message: String,
        kind: &'static str,
        retry_after_s: u64,
        headers: Box<crate::dataplane::quota::headers::RateHeaders>,
    },
    /// Shed for zone capacity: a lower priority than the zone can still
    /// carry (429), or the zone is full even for P0 (`full`, 503).
    #[error("{message}")]
    CapacityExceeded {
        message: String,
        full: bool,
        retry_after_s: u64,
        headers: Box<crate::dataplane::quota::headers::RateHeaders>,
    },
    /// Over the tenant's budget (`dataplane::budget`): 429 with
    /// `Retry-After` to the period's end (or, while the cluster still has
    /// budget this node was not yet granted, to the next rebalance).
    #[error("{message}")]
    BudgetExceeded { message: String, retry_after_s: u64 },
    #[error("{message}")]
    UpstreamFailed { message: String },
    #[error("{message}")]
    UpstreamTimeout { message: String },
    #[error("{0}")]
    NotReady(String),
    /// Every model that could answer is below the tier the request needs.
    #[error("{0}")]
    NoCapableModel(String),
    /// The tenant's `require_tags` left no backend that could answer.
    #[error("{0}")]
    NoEligibleBackend(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// A backend's 400 `context_length_exceeded`, passed on as it sent it
    /// when no larger-context model could take the request.
    #[error("the prompt exceeds the context length of every model that could take it")]
    ContextLength(bytes::Bytes),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::ContextLength(_) => StatusCode::BAD_REQUEST,
            ApiError::MissingKey | ApiError::WrongKey => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_)
            | ApiError::UnknownModel { .. }
            | ApiError::UnknownPath(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::ZoneUnavailable(_)
            | ApiError::NoBackend { .. }
            | ApiError::NotReady(_)
            | ApiError::NoCapableModel(_)
            | ApiError::NoEligibleBackend(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::AllBusy { .. }
            | ApiError::RateLimited { .. }
            | ApiError::BudgetExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::CapacityExceeded { full: true, .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::CapacityExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` field.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_)
            | ApiError::ContextLength(_)
            | ApiError::ModelNotFound(_)
            | ApiError::UnknownModel { .. }
            | ApiError::UnknownPath(_)
            | ApiError::MethodNotAllowed(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::BodyTimeout(_) => "invalid_request_error",
            ApiError::MissingKey | ApiError::WrongKey => "authentication_error",
            ApiError::AllBusy { .. } => "rate_limit_error",
            ApiError::BudgetExceeded { .. } => "insufficient_quota",
            ApiError::RateLimited { kind, .. } => kind,
            ApiError::CapacityExceeded { full: false, .. } => "rate_limit_error",
            _ => "server_error",
        }
    }

    /// OpenAI's `code` field; also the `outcome` label of request metrics.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "invalid_request",
            ApiError::MissingKey => "missing_api_key",
            ApiError::WrongKey => "invalid_api_key",
            ApiError::ModelNotFound(_) | ApiError::UnknownModel { .. } => "model_not_found",
            ApiError::UnknownPath(_) => "unknown_url",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::BodyTimeout(_) => "request_timeout",
            ApiError::ZoneUnavailable(_) => "zone_unavailable",
            ApiError::NoBackend { .. } => "no_backend_available",
            ApiError::AllBusy { .. } => "backends_busy",
            ApiError::RateLimited { .. } => "rate_limit_exceeded",
            ApiError::CapacityExceeded { .. } => "capacity_exceeded",
            ApiError::BudgetExceeded { .. } => "budget_exceeded",
            ApiError::UpstreamFailed { .. } => "upstream_error",
            ApiError::UpstreamTimeout { .. } => "upstream_timeout",
            ApiError::NotReady(_) => "not_ready",
            ApiError::NoCapableModel(_) => "no_capable_model",
            ApiError::NoEligibleBackend(_) => "no_eligible_backend",
            ApiError::Internal(_) => "internal_error",
            ApiError::ContextLength(_) => "context_length_exceeded",
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::AllBusy { retry_after_s, .. }
            | ApiError::RateLimited { retry_after_s, .. }
            | ApiError::CapacityExceeded { retry_after_s, .. }
            | ApiError::BudgetExceeded { retry_after_s, .. } => Some((*retry_after_s).max(1)),
            ApiError::ZoneUnavailable(_) | ApiError::NoBackend { .. } => Some(5),
            _ => None,
        }
    }
}

/// The OpenAI error object, for bodies and for SSE error events.
pub fn error_body(message: &str, kind: &str, code: &str) -> serde_json::Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::ContextLength(body) = self {
            let mut resp = (StatusCode::BAD_REQUEST, body).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return resp;
        }
        let body = error_body(&self.to_string(), self.kind(), self.code());
        let mut resp = (self.status(), axum::Json(body)).into_response();
        if let Some(s) = self.retry_after() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let ApiError::RateLimited { headers, .. } | ApiError::CapacityExceeded { headers, .. } =
            &self
        {
            crate::dataplane::quota::headers::set_headers(resp.headers_mut(), headers);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn renders_openai_error_shape() {
        let resp = ApiError::ModelNotFound("gpt-9".into()).into_response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
    }

    #[tokio::test]
    async fn quota_refusals_are_openai_rate_limit_errors_with_headers() {
        let headers: crate::dataplane::quota::headers::RateHeaders = [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
        ]
        .into_iter()
        .map(|(n, v)| {
            (
                http::HeaderName::from_static(n),
                HeaderValue::from_static(v),
            )
        })
        .collect();
        let resp = ApiError::RateLimited {
            message: "Rate limit reached".into(),
            kind: "requests",
            retry_after_s: 2,
            headers: Box::new(headers.clone()),
        }
        .into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        for (name, value) in &headers {
            assert_eq!(&resp.headers()[name], value);
        }
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert_eq!(v["error"]["type"], "requests");
        assert!(v["error"]["param"].is_null());
        let shed = |full| ApiError::CapacityExceeded {
            message: "shed".into(),
            full,
            retry_after_s: 1,
            headers: Box::default(),
        };
        assert_eq!(shed(false).status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(shed(true).status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(shed(true).code(), "capacity_exceeded");
        assert!(shed(true)
            .into_response()
            .headers()
            .contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn busy_and_unavailable_carry_retry_after() {
        let resp = ApiError::AllBusy {
            message: "busy".into(),
            retry_after_s: 3,
        }
        .into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
        let resp = ApiError::ZoneUnavailable("z".into()).into_response();
        assert!(resp.headers().contains_key(header::RETRY_AFTER));
    }
}
