//! What every handler shares.
use std::future::Future;
use std::sync::{Arc, RwLock};

use tenax::storage::Storage;
use tenax::Client;
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::config::{ConfigError, ServerConfig, TokenConfig};
use crate::error::ApiError;
use crate::pressure::PendingCache;

/// The storage, the configuration and the caches of one API instance. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) storage: Arc<dyn Storage>,
    /// The library's client over `storage`: every task the API enqueues goes in
    /// through it, as one enqueued from Rust does.
    client: Client,
    pub(crate) config: ServerConfig,
    /// Read by every request; swapped whole by [`AppState::reload_tokens`].
    tokens: RwLock<Arc<Tokens>>,
    pub(crate) pending: PendingCache,
    pub(crate) shutdown: CancellationToken,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("backend", &self.inner.storage.backend())
            .field("tokens", &self.inner.config.tokens.len())
            .finish()
    }
}

impl AppState {
    /// The API over a storage. The configuration is not validated here: call
    /// [`ServerConfig::validate`] first (the CLI does).
    pub fn new(storage: Arc<dyn Storage>, config: ServerConfig) -> Self {
        Self::with_shutdown(storage, config, CancellationToken::new())
    }

    /// The same, with a token whose cancellation ends long-polls at once (pass the one
    /// that stops [`serve`](crate::serve)).
    pub fn with_shutdown(
        storage: Arc<dyn Storage>,
        config: ServerConfig,
        shutdown: CancellationToken,
    ) -> Self {
        let tokens = RwLock::new(Arc::new(Tokens::new(&config.tokens)));
        Self {
            inner: Arc::new(Inner {
                client: Client::new(storage.clone()),
                storage,
                config,
                tokens,
                pending: PendingCache::default(),
                shutdown,
            }),
        }
    }

    /// The configuration it was started with (its tokens as they were then; see
    /// [`AppState::reload_tokens`]).
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Replace the accepted tokens, for every request that starts from now on (a
    /// request in flight keeps the caller it was admitted as). For a rotation: add the
    /// new token, move the clients to it, then remove the old one, each step a reload,
    /// and no request is refused. Returns how many tokens are now accepted.
    ///
    /// The list is checked as at start (unique names and hashes, 64 hex digits); on an
    /// error nothing changes. A server started with tokens keeps requiring one: an
    /// empty list is refused, since it would open every route to anyone (restart
    /// without tokens for that), and so is a first token on a server started without.
    pub fn reload_tokens(&self, tokens: &[TokenConfig]) -> Result<usize, ConfigError> {
        crate::config::validate_tokens(tokens)?;
        let started_with = !self.inner.config.tokens.is_empty();
        let reloaded_with = !tokens.is_empty();
        if started_with != reloaded_with {
            return Err(ConfigError {
                key: "tokens".into(),
                reason: if started_with {
                    "a reload cannot remove every token: that would accept every request \
                     unauthenticated; restart the server for that"
                        .into()
                } else {
                    "this server was started without tokens: restart it to require them".into()
                },
            });
        }
        let next = Arc::new(Tokens::new(tokens));
        *self.inner.tokens.write().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(tokens.len())
    }

    /// The tokens accepted now.
    pub(crate) fn tokens(&self) -> Arc<Tokens> {
        self.inner
            .tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.inner.storage
    }

    /// The client every enqueue goes through (over [`storage`](AppState::storage)).
    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Run one database call bounded by `db_timeout`: past it (an exhausted pool, a
    /// stalled database) the request answers 503 with `Retry-After` instead of hanging.
    pub(crate) async fn db<T, E, F>(&self, call: F) -> Result<T, ApiError>
    where
        F: Future<Output = Result<T, E>>,
        ApiError: From<E>,
    {
        match tokio::time::timeout(self.inner.config.db_timeout, call).await {
            Ok(result) => result.map_err(ApiError::from),
            Err(_) => {
                tracing::warn!(
                    timeout = ?self.inner.config.db_timeout,
                    "database call timed out (pool exhausted or database stalled)"
                );
                Err(ApiError::unavailable(
                    "the database did not answer in time; try again shortly",
                ))
            }
        }
    }
}
