//! Runtime errors.
use tenax_core::InvalidInput;
use tenax_storage::StorageError;

use crate::config::ConfigError;

/// Why a client or worker call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The storage refused or failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Input that cannot be accepted.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// A context that does not encode as JSON.
    #[error("the context does not encode as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// A worker configuration that cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
}
