//! Bearer tokens, roles, and the layer that checks them before any handler runs.
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::openapi::{Access, DASHBOARD_ROUTES, ROUTES};
use crate::state::AppState;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, including operator actions (cancel, retry, bulk, schedules, queues and
    /// their limits, rate limits, event rules).
    Admin,
    /// Enqueue tasks and read them back (get, attempts, wait).
    Enqueue,
    /// Every `GET`.
    Read,
}

impl Role {
    /// Whether this role may use a route of the given access class.
    pub fn may(self, access: Access) -> bool {
        match access {
            Access::Open => true,
            Access::Admin => self == Role::Admin,
            Access::Read => matches!(self, Role::Admin | Role::Read),
            Access::Enqueue => matches!(self, Role::Admin | Role::Enqueue),
            Access::TaskRead => true,
        }
    }

    /// The role's name as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Enqueue => "enqueue",
            Role::Read => "read",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admin" => Ok(Role::Admin),
            "enqueue" => Ok(Role::Enqueue),
            "read" => Ok(Role::Read),
            other => Err(format!(
                "unknown role {other:?}: use admin, enqueue or read"
            )),
        }
    }
}

/// The hex SHA-256 of a token, as configured in `[[server.tokens]] sha256`.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Who made a request: the token's name (the audit actor) and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name, or `anonymous` when the server runs without tokens.
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Caller {
    /// Whether this caller may read a task enqueued under `created_by`: admin and read
    /// tokens read every task, an enqueue token only the tasks enqueued with a token of
    /// its own name (not those of the library, the CLI or a server without tokens).
    pub fn may_read(&self, created_by: Option<&str>) -> bool {
        self.role != Role::Enqueue || created_by == Some(self.name.as_str())
    }

    /// The name a task this caller enqueues is stored under: its token's name, or
    /// `None` on a server without tokens (whose callers are all `anonymous`).
    pub(crate) fn enqueuer(&self, state: &AppState) -> Option<String> {
        (!state.tokens().is_empty()).then(|| self.name.clone())
    }
}

/// The configured tokens, decoded once.
#[derive(Debug, Clone)]
pub(crate) struct Tokens {
    entries: Vec<([u8; 32], String, Role)>,
}

impl Tokens {
    pub(crate) fn new(config: &[crate::TokenConfig]) -> Self {
        let entries = config
            .iter()
            .filter_map(|t| {
                let bytes = hex::decode(t.sha256.to_ascii_lowercase()).ok()?;
                let hash: [u8; 32] = bytes.try_into().ok()?;
                Some((hash, t.name.clone(), t.role))
            })
            .collect();
        Self { entries }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a presented token belongs to. Every configured hash is compared, in
    /// constant time, whatever matches first.
    pub(crate) fn find(&self, token: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (hash, name, role) in &self.entries {
            if bool::from(hash.ct_eq(&presented)) && found.is_none() {
                found = Some(Caller {
                    name: name.clone(),
                    role: *role,
                });
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer <token>` header, if there is one.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The access class of a matched route (unknown routes need admin).
fn access_of(method: &Method, path: &str) -> Access {
    ROUTES
        .iter()
        .chain(DASHBOARD_ROUTES)
        .find(|r| r.method == method.as_str() && r.path == path)
        .map_or(Access::Admin, |r| r.access)
}

/// The route layer: 400 for more than one `Authorization` header, 401 without a valid
/// token, 403 for a role that may not; the caller
/// is put in the request's extensions for the handlers (audit actor).
pub(crate) async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let access = access_of(request.method(), &path);
    if access == Access::Open {
        return Ok(next.run(request).await);
    }
    // Two credentials are ambiguous: a proxy and this server could each read another.
    if request
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .count()
        > 1
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "more than one Authorization header: send exactly one",
        ));
    }
    let tokens = state.tokens();
    let caller = if tokens.is_empty() {
        Caller {
            name: "anonymous".to_owned(),
            role: Role::Admin,
        }
    } else {
        let Some(token) = bearer(request.headers()) else {
            return Err(ApiError::unauthorized(
                "missing bearer token: send `Authorization: Bearer <token>`",
            ));
        };
        match tokens.find(token) {
            Some(caller) => caller,
            None => return Err(ApiError::unauthorized("the bearer token is not valid")),
        }
    };
    if !caller.role.may(access) {
        return Err(ApiError::forbidden(format!(
            "token {:?} has role {} which may not {} {}",
            caller.name,
            caller.role.as_str(),
            request.method(),
            path
        )));
    }
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

#[cfg(test)]
#[path = "auth_timing.rs"]
mod timing;
