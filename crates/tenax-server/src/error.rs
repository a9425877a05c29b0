//! The one error shape of the API:
//! `{"error": {"code": "snake_case", "field": "tasks[3].priority", "message": "..."}}`,
//! `field` present only when the request field at fault is known.
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tenax::storage::StorageError;

/// An error answer: a status, a machine-readable code, a message for people, and for
/// 429 and 503 the seconds to wait before trying again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable snake_case code (see the HTTP API guide's table).
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// The request field at fault, when known: a dotted path into the JSON body
    /// (`task_no`, `tasks[3].payload`), or a query or path parameter's name.
    pub field: Option<String>,
    /// `Retry-After` seconds, if the request may succeed later.
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    message: &'a str,
}

/// `field` under `place`: `tasks[3]` and `priority` give `tasks[3].priority`, `tasks` and
/// `[3]` give `tasks[3]`.
fn join_field(place: &str, field: &str) -> String {
    if field.starts_with('[') {
        format!("{place}{field}")
    } else {
        format!("{place}.{field}")
    }
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    /// The same error, naming the request field at fault.
    pub(crate) fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The same error, its field put under `place` (`priority` becomes
    /// `tasks[3].priority`; no field becomes `tasks[3]`).
    pub(crate) fn within(mut self, place: &str) -> Self {
        self.field = Some(match &self.field {
            Some(field) => join_field(place, field),
            None => place.to_owned(),
        });
        self
    }

    /// The same error, its message prefixed with where in the request it arose
    /// (`tasks[3]: ...`) and its field put under that place.
    pub(crate) fn at(mut self, place: &str) -> Self {
        self.message = format!("{place}: {}", self.message);
        self.within(place)
    }

    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).retry_after(1)
    }

    /// The JSON body of an error of this status with no better message (used to rewrite
    /// plain-text errors of lower layers).
    pub(crate) fn for_status(status: StatusCode) -> Self {
        let (code, message) = match status {
            StatusCode::PAYLOAD_TOO_LARGE => (
                "payload_too_large",
                "the request body is over the configured limit",
            ),
            StatusCode::METHOD_NOT_ALLOWED => (
                "method_not_allowed",
                "this route does not accept that method",
            ),
            StatusCode::NOT_FOUND => ("not_found", "no such route"),
            StatusCode::REQUEST_TIMEOUT => ("timeout", "the request took too long"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => (
                "unsupported_media_type",
                "send `Content-Type: application/json`",
            ),
            s if s.is_server_error() => ("internal", "internal error; see the server log"),
            _ => ("bad_request", "the request cannot be processed"),
        };
        Self::new(status, code, message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Inner {
                code: self.code,
                field: self.field.as_deref(),
                message: &self.message,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        Self::from(&e)
    }
}

impl From<&StorageError> for ApiError {
    fn from(e: &StorageError) -> Self {
        match e {
            StorageError::TaskNoConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "task_no_conflict", e.to_string())
            }
            StorageError::NotFound(_) => Self::not_found(e.to_string()),
            StorageError::InvalidState { .. } => {
                Self::new(StatusCode::CONFLICT, "invalid_state", e.to_string())
            }
            // The store cannot tell which request field a value came from (a NUL refused by
            // PostgreSQL is reported as `text`), so no field is named.
            StorageError::Invalid(_) => Self::invalid(e.to_string()),
            StorageError::Transient(_) => {
                tracing::warn!(error = %e, "database unavailable");
                Self::unavailable("the database is unavailable; try again shortly")
            }
            _ => {
                tracing::error!(error = %e, "storage error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error; see the server log",
                )
            }
        }
    }
}

/// A client call's error is answered as the storage error or the refusal it wraps
/// would be on its own: a store refusing through the client answers as one called
/// directly.
impl From<tenax::Error> for ApiError {
    fn from(e: tenax::Error) -> Self {
        Self::from(&e)
    }
}

/// The same, for an error the caller keeps (an `Enqueue` builder's refusal, read
/// through `Enqueue::params`).
impl From<&tenax::Error> for ApiError {
    fn from(e: &tenax::Error) -> Self {
        match e {
            tenax::Error::Storage(e) => e.into(),
            tenax::Error::Invalid(e) => e.clone().into(),
            other => Self::invalid(other.to_string()),
        }
    }
}

impl From<tenax::InvalidInput> for ApiError {
    fn from(e: tenax::InvalidInput) -> Self {
        let error = Self::invalid(e.to_string());
        // Validation in the core names fields as the request does (`task_no`, `queue`);
        // a library-only name with a space in it (`max attempts`) is not a request field.
        if e.field
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            error.field(e.field)
        } else {
            error
        }
    }
}
