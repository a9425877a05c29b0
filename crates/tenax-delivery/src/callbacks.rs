//! Completion callbacks: the outbox's `callback` rows, each POSTed to its task's
//! `callback_url`, signed, until the receiver answers 2xx or the row's maximum age
//! passes.
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tenax_core::outbound::HostAllowList;
use tenax_kinds::outbound;
use tenax_storage::{
    OutboxClaimParams, OutboxKind, OutboxOutcome, OutboxRecord, OutboxSettleParams, Storage,
    StorageError,
};
use tokio_util::sync::CancellationToken;

use crate::config::{CallbacksConfig, ConfigError};
use crate::deliver::{self, Posted};

/// Rows claimed at once.
const BATCH: u32 = 50;
/// Deliveries in flight at once.
const IN_FLIGHT: usize = 8;

/// Delivers completion callbacks; run one (or more, on several nodes) with
/// [`CallbackSender::run`].
pub struct CallbackSender {
    storage: Arc<dyn Storage>,
    client: reqwest::Client,
    config: CallbacksConfig,
    allow: HostAllowList,
    secret: Vec<u8>,
}

impl CallbackSender {
    /// A sender with these settings (validated here).
    pub fn new(storage: Arc<dyn Storage>, config: CallbacksConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let client = outbound::client(config.timeout).map_err(|e| {
            crate::config::config_err("callbacks", format!("cannot build an HTTP client: {e}"))
        })?;
        Ok(Self {
            storage,
            client,
            allow: HostAllowList::new(config.allow_hosts.clone()),
            secret: config.secret.clone().unwrap_or_default().into_bytes(),
            config,
        })
    }

    /// Deliver until `shutdown`, looking for due callbacks every poll interval when
    /// idle. A storage error is logged and retried at the next poll.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut presence = deliver::Presence::new(vec![OutboxKind::Callback]);
        loop {
            presence.renew(self.storage.as_ref()).await;
            let busy = match self.deliver_due().await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming callbacks failed; retrying");
                    false
                }
            };
            if busy && !shutdown.is_cancelled() {
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
    }

    /// One round: claim due callbacks and attempt each once. Returns how many were
    /// claimed.
    pub async fn deliver_due(&self) -> Result<usize, StorageError> {
        let rows = self
            .storage
            .outbox_claim(&OutboxClaimParams {
                kind: OutboxKind::Callback,
                limit: BATCH,
                // Longer than the attempts of a batch can take.
                lease: self.config.timeout * 2 + Duration::from_secs(30),
                now: None,
            })
            .await?;
        let n = rows.len();
        futures::stream::iter(rows)
            .for_each_concurrent(IN_FLIGHT, |row| self.deliver_one(row))
            .await;
        Ok(n)
    }

    async fn deliver_one(&self, row: OutboxRecord) {
        let outcome = match row.url.as_deref().map(|url| self.allow.check(url)) {
            None => OutboxOutcome::Expire {
                error: "no callback URL".into(),
            },
            Some(Err(refused)) => OutboxOutcome::Expire {
                error: format!("refused: {refused}"),
            },
            Some(Ok(_)) => {
                let url = row.url.as_deref().unwrap_or_default();
                let posted = deliver::post(
                    &self.client,
                    url,
                    &row.body,
                    &row.delivery_id,
                    Some(&self.secret),
                )
                .await;
                match posted {
                    Posted::Acknowledged => OutboxOutcome::Delivered,
                    Posted::Failed(error, after) => {
                        let delay = deliver::backoff(
                            row.attempts,
                            self.config.backoff_base,
                            self.config.backoff_cap,
                        );
                        OutboxOutcome::Retry {
                            delay: after
                                .map_or(delay, |a| a.max(delay))
                                .min(self.config.max_age),
                            max_age: self.config.max_age,
                            error,
                        }
                    }
                }
            }
        };
        match &outcome {
            OutboxOutcome::Delivered => {
                tracing::debug!(delivery_id = %row.delivery_id, task = %row.task_id, "callback delivered");
            }
            OutboxOutcome::Retry { delay, error, .. } => {
                tracing::info!(delivery_id = %row.delivery_id, task = %row.task_id, attempts = row.attempts, ?delay, %error, "callback failed; retrying");
            }
            OutboxOutcome::Expire { error } => {
                tracing::warn!(delivery_id = %row.delivery_id, task = %row.task_id, %error, "callback dropped");
            }
        }
        let settled = self
            .storage
            .outbox_settle(&OutboxSettleParams {
                claims: vec![row.claim()],
                outcome: outcome.clone(),
                now: None,
            })
            .await;
        if let Ok(n) = &settled {
            deliver::count(OutboxKind::Callback, &outcome, *n);
        }
        if let Err(e) = settled {
            // The claim lapses and the row is attempted again, under the same id.
            tracing::warn!(delivery_id = %row.delivery_id, error = %e, "recording a callback attempt failed");
        }
    }
}
