//! The state of threshold alerts: whether each alert of each queue is firing, so that
//! senders on any number of nodes report a change once.
use chrono::{DateTime, Utc};
use tenax_core::InvalidInput;

use crate::error::Result;

/// [`Storage::alert_transition`](crate::Storage::alert_transition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertTransitionParams {
    /// The queue.
    pub queue: String,
    /// The alert's name (`backlog`, `oldest_age`): lower-case letters, digits and
    /// `_`, at most 64 bytes.
    pub alert: String,
    /// Whether the condition holds now.
    pub firing: bool,
    /// The message reporting the change (JSON text, at most
    /// [`ALERT_MESSAGE_MAX_BYTES`]). When given and the change is recorded, it is written
    /// to the outbox as an [`OutboxKind::Alert`](crate::OutboxKind::Alert) row in the same
    /// transaction, for the alert sender to deliver.
    pub message: Option<String>,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// Longest alert message, in bytes.
pub const ALERT_MESSAGE_MAX_BYTES: usize = 64 * 1024;

pub(crate) fn validate_transition(params: &AlertTransitionParams) -> Result<()> {
    if let Some(message) = &params.message {
        if message.len() > ALERT_MESSAGE_MAX_BYTES {
            return Err(InvalidInput::new("message", "at most 64 KiB").into());
        }
        if serde_json::from_str::<serde::de::IgnoredAny>(message).is_err() {
            return Err(InvalidInput::new("message", "must be JSON").into());
        }
    }
    tenax_core::QueueName::new(params.queue.clone())?;
    let ok = !params.alert.is_empty()
        && params.alert.len() <= 64
        && params
            .alert
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(InvalidInput::new("alert", "1 to 64 lower-case letters, digits or _").into());
    }
    Ok(())
}

/// A fresh delivery id for an alert row.
pub(crate) fn alert_delivery_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
