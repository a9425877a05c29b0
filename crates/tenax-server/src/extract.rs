//! Extractors whose rejections are API errors (never axum's plain-text bodies), naming
//! the request field at fault when it is known.
//!
//! JSON bodies and query strings are decoded through `serde_path_to_error`, which keeps
//! the path of the value being decoded when an error arises (`tasks[3].priority`);
//! serde's own errors carry only a line and column.
use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body.
#[derive(Debug)]
pub(crate) struct ApiJson<T>(pub(crate) T);

/// Path parameters.
#[derive(Debug)]
pub(crate) struct ApiPath<T>(pub(crate) T);

/// Query parameters.
#[derive(Debug)]
pub(crate) struct ApiQuery<T>(pub(crate) T);

/// `application/json` or any `application/*+json`, parameters (`charset`) allowed.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json") || subtype.to_ascii_lowercase().ends_with("+json"))
}

/// The field a decode error is about: the path where it arose, followed, for the errors
/// serde raises about an object as a whole (`duplicate field `x``, `missing field `x``),
/// by the field they name. (An unknown field's path already ends with its name.)
fn field_of(path: &serde_path_to_error::Path, message: &str) -> Option<String> {
    let at = dotted(path);
    let named = ["duplicate field `", "missing field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name)
        .filter(|name| !name.is_empty());
    let field = match (at, named) {
        (Some(at), Some(name)) => format!("{at}.{name}"),
        (Some(at), None) => at,
        (None, Some(name)) => name.to_owned(),
        (None, None) => return None,
    };
    // Keys come from the client: a long one is not echoed whole.
    Some(if field.chars().count() > FIELD_MAX_CHARS {
        let mut cut: String = field.chars().take(FIELD_MAX_CHARS).collect();
        cut.push('…');
        cut
    } else {
        field
    })
}

/// A path as `tasks[3].priority`, up to its first segment of unknown name (a key that
/// was cut off or is not a string); `None` for the root.
fn dotted(path: &serde_path_to_error::Path) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => break,
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The longest `field` echoed from a client's keys, in characters.
const FIELD_MAX_CHARS: usize = 200;

/// The message of a decode error, led by its field when known.
fn located(field: Option<&str>, message: &str) -> String {
    match field {
        Some(field) => format!("{field}: {message}"),
        None => message.to_owned(),
    }
}

/// Decode a JSON body: syntax errors (truncated, invalid UTF-8, a byte-order mark,
/// trailing bytes, numbers out of range) are 400 `invalid_json`; a well-formed body of
/// the wrong shape (wrong type, unknown, missing or duplicate field) is 422
/// `invalid_input`.
pub(crate) fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.starts_with("\u{feff}".as_bytes()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body starts with a byte-order mark: send UTF-8 JSON without one",
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let inner = e.inner();
        let text = inner.to_string();
        let field = field_of(e.path(), &text);
        let message = located(field.as_deref(), &text);
        let error = match inner.classify() {
            serde_json::error::Category::Data => ApiError::invalid(message),
            _ => ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", message),
        };
        match field {
            Some(field) => error.field(field),
            None => error,
        }
    })?;
    deserializer.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("after the JSON value: {e}"),
        )
    })?;
    Ok(value)
}

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(request.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with `Content-Type: application/json`",
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|e| ApiError::from(JsonRejection::from(e)))?;
        decode_json(&bytes).map(ApiJson)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = rejection.status();
        let message = rejection.body_text();
        match rejection {
            JsonRejection::JsonSyntaxError(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", message)
            }
            JsonRejection::JsonDataError(_) => ApiError::invalid(message),
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with `Content-Type: application/json`",
            ),
            _ if status == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                status,
                "payload_too_large",
                "the request body is over the configured limit",
            ),
            _ => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message),
        }
    }
}

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => {
                let field = path_field(&rejection, parts, state).await;
                let error = ApiError::from(rejection);
                Err(match field {
                    Some(field) => error.field(field),
                    None => error,
                })
            }
        }
    }
}

/// The name of the path parameter a rejection is about: the key it names, or the only
/// parameter of the route.
async fn path_field<S: Send + Sync>(
    rejection: &PathRejection,
    parts: &mut Parts,
    state: &S,
) -> Option<String> {
    use axum::extract::path::ErrorKind;
    if let PathRejection::FailedToDeserializePathParams(e) = rejection {
        match e.kind() {
            ErrorKind::ParseErrorAtKey { key, .. }
            | ErrorKind::InvalidUtf8InPathParam { key }
            | ErrorKind::DeserializeError { key, .. } => return Some(key.clone()),
            _ => {}
        }
    }
    let params = RawPathParams::from_request_parts(parts, state).await.ok()?;
    let mut keys = params.iter().map(|(key, _)| key);
    match (keys.next(), keys.next()) {
        (Some(only), None) => Some(only.to_owned()),
        _ => None,
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            rejection.body_text(),
        )
    }
}

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(ApiQuery)
            .map_err(|e| {
                let text = e.inner().to_string();
                let field = field_of(e.path(), &text);
                let error = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    match &field {
                        Some(field) => format!("{field}: {text}"),
                        None => format!("query string: {text}"),
                    },
                );
                match field {
                    Some(field) => error.field(field),
                    None => error,
                }
            })
    }
}
