//! Notifications sent in batches: a [`BatchCommand`] whose tasks, one per
//! notification, reach the gateway 200 at a time.
//!
//! Each notification is a task of its own, enqueued as `Batched<SendNotifications>`:
//! it has its own attempts, backoff and dead state. The worker claims up to 200 due
//! notifications of one channel together and hands them to one
//! [`execute_batch`](BatchCommand::execute_batch) call, which makes one gateway call
//! and answers per notification: delivered, try again later (the recipient's inbox
//! was full) or never (the address does not exist).
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax::{BatchCommand, BatchItem, CommandError, RetryPolicy, TaskContext};

/// One notification.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    /// `"email"` or `"sms"`: the gateway takes one channel per call.
    pub channel: String,
    /// The recipient's address.
    pub to: String,
    /// The text.
    pub text: String,
}

/// What the gateway answers for one message of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Delivered, with the gateway's message id.
    Delivered(u64),
    /// Not now (inbox full, throttled): ask again later.
    Later,
    /// Never (no such address).
    Refused,
}

/// The notification gateway: one call sends many messages of one channel.
pub trait Gateway: Send + Sync + 'static {
    /// Send `messages` (recipient, text, idempotency key) in one call; one answer per
    /// message, in order.
    fn send(&self, channel: &str, messages: &[(String, String, String)]) -> Vec<Delivery>;
}

/// A gateway that records its calls: it refuses addresses without `@` or `+`, and
/// answers "later" the first time it sees an address starting with `full`.
#[derive(Default)]
pub struct RecordingGateway {
    calls: Mutex<Vec<(String, usize)>>,
    seen_full: Mutex<std::collections::HashSet<String>>,
}

impl RecordingGateway {
    /// Each call made: its channel and how many messages it held.
    pub fn calls(&self) -> Vec<(String, usize)> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

impl Gateway for RecordingGateway {
    fn send(&self, channel: &str, messages: &[(String, String, String)]) -> Vec<Delivery> {
        let Ok(mut calls) = self.calls.lock() else {
            return vec![Delivery::Later; messages.len()];
        };
        calls.push((channel.to_owned(), messages.len()));
        let id = calls.len() as u64 * 1000;
        drop(calls);
        messages
            .iter()
            .enumerate()
            .map(|(i, (to, _, _))| {
                if !to.contains('@') && !to.starts_with('+') {
                    Delivery::Refused
                } else if to.starts_with("full")
                    && self
                        .seen_full
                        .lock()
                        .map(|mut seen| seen.insert(to.clone()))
                        .unwrap_or(true)
                {
                    Delivery::Later
                } else {
                    Delivery::Delivered(id + i as u64)
                }
            })
            .collect()
    }
}

/// Sends notifications through a [`Gateway`], 200 per call, one channel per call.
pub struct SendNotifications {
    /// The gateway.
    pub gateway: Arc<dyn Gateway>,
}

impl BatchCommand for SendNotifications {
    const TYPE: &'static str = "SEND_NOTIFICATIONS";
    const MAX_BATCH: u32 = 200;
    /// A notification waits at most half a second for others to share its call.
    const MAX_WAIT: Duration = Duration::from_millis(500);
    const MAX_ATTEMPTS: u32 = 6;
    type Context = Notification;
    /// The gateway's message id.
    type Output = u64;

    fn batch_key(&self, notification: &Notification) -> Option<String> {
        Some(notification.channel.clone())
    }

    async fn execute_batch(
        &self,
        items: Vec<BatchItem<Notification>>,
    ) -> Vec<Result<u64, CommandError>> {
        let Some(channel) = items.first().map(|i| i.context.channel.clone()) else {
            return Vec::new();
        };
        // The idempotency key goes with each message, so a message sent by a call
        // whose answer was lost is recognised by the gateway when it is sent again.
        let messages: Vec<(String, String, String)> = items
            .iter()
            .map(|i| {
                (
                    i.context.to.clone(),
                    i.context.text.clone(),
                    i.task.idempotency_key().to_owned(),
                )
            })
            .collect();
        self.gateway
            .send(&channel, &messages)
            .into_iter()
            .map(|delivery| match delivery {
                Delivery::Delivered(id) => Ok(id),
                Delivery::Later => Err(CommandError::retryable("recipient cannot take it now")),
                Delivery::Refused => Err(CommandError::permanent("no such recipient")),
            })
            .collect()
    }

    async fn compensate(
        &self,
        notification: Notification,
        _: &TaskContext,
    ) -> Result<(), CommandError> {
        // Nothing was sent; a real system might flag the address here.
        let _ = notification;
        Ok(())
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(60))
    }
}
