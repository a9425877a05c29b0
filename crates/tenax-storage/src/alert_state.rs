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
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

pub(crate) fn validate_transition(params: &AlertTransitionParams) -> Result<()> {
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
