//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: a field is missing, of the wrong type or out of range.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("invalid_value"),
        }
    }

    /// 400: the body is not a JSON object.
    pub fn bad_body(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_json"),
        }
    }

    /// 413: the request body is over the server's limit (OpenAI's error body instead of
    /// axum's plain text).
    pub fn request_too_large(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// A body that could not be read for a reason other than its size (cut short before
    /// its `Content-Length`, malformed chunks), with the status axum chose.
    pub fn invalid_body(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind: "invalid_request_error", param: None, code: Some("invalid_body") }
    }

    /// 400: the prompt (plus at least one generated token) does not fit a slot's context.
    pub fn context_length(prompt_tokens: usize, n_ctx: usize) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "the prompt has {prompt_tokens} tokens, but this server's context holds {n_ctx} per sequence \
                 (prompt plus at least one generated token); shorten the prompt"
            ),
            kind: "invalid_request_error",
            param: Some("messages".into()),
            code: Some("context_length_exceeded"),
        }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid API key: send the server's key as `Authorization: Bearer KEY`".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 403: a browser page of an origin the server does not allow (CORS) sent a request
    /// that needs no preflight (a form-style POST): refused before it runs.
    pub fn origin_not_allowed(origin: &str) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            message: format!(
                "requests from web pages at {origin} are refused; to allow that origin, start the server with --cors-origin {origin}"
            ),
            kind: "permission_error",
            param: None,
            code: Some("origin_not_allowed"),
        }
    }

    /// 404: a model this server does not serve.
    pub fn unknown_model(asked: &str, served: &[&str]) -> Self {
        let names = served.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{asked}` does not exist: this server serves {names} (see GET /v1/models)"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404: no such endpoint.
    pub fn no_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "no endpoint {path}: try POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings or GET /v1/models"
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// 405: a known path asked with the wrong method.
    pub fn wrong_method(method: &axum::http::Method, path: &str) -> Self {
        let want = if matches!(path.trim_end_matches('/'), "/health" | "/metrics") || path.contains("/models") { "GET" } else { "POST" };
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{path} takes {want} requests, not {method}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        }
    }

    /// 429: the waiting queue is full (backpressure); the client should retry later.
    pub fn queue_full(limit: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("the server is busy: its queue of {limit} waiting requests is full; retry later"),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 500: the engine failed on this request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into(), kind: "server_error", param: None, code: None }
    }

    /// 503: the engine has stopped.
    pub fn unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the inference engine has stopped; the server is shutting down".into(),
            kind: "server_error",
            param: None,
            code: Some("engine_stopped"),
        }
    }

    /// 503: a device of the group failed while this request was in flight (the message
    /// names it); the server goes on over the devices left, so a retry may succeed.
    pub fn device_failed(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("worker_failed"),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A refusal that a retry may get past says when to retry: OpenAI's clients wait
        // `Retry-After` seconds before their next try (a slot frees within about a second
        // of decode; a failed device's replan takes about as long).
        let retry = matches!(self.code, Some("queue_full" | "worker_failed"));
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if retry {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_a_retry_may_pass_say_when_to_retry() {
        let retry_after = |e: ApiError| e.into_response().headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(retry_after(ApiError::queue_full(4)).as_deref(), Some("1"));
        assert_eq!(retry_after(ApiError::device_failed("node 1 failed")).as_deref(), Some("1"));
        // Control: errors a retry cannot fix carry none.
        assert_eq!(retry_after(ApiError::invalid("n", "bad")), None);
        assert_eq!(retry_after(ApiError::unavailable()), None);
    }
}
