//! What every handler shares.
use std::future::Future;
use std::sync::Arc;

use tenax::storage::Storage;
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::pressure::PendingCache;

/// The storage, the configuration and the caches of one API instance. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) config: ServerConfig,
    pub(crate) tokens: Tokens,
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
        let tokens = Tokens::new(&config.tokens);
        Self {
            inner: Arc::new(Inner {
                storage,
                config,
                tokens,
                pending: PendingCache::default(),
                shutdown,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.inner.storage
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
