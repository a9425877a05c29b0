//! Alerts to a webhook, all delivered through the outbox.
//!
//! Death alerts: the outbox's `death` rows, gathered for a short window and sent to the
//! webhook as one Slack-style message (`{"text": ...}`) per batch. A batch names its
//! first deaths one by one and counts the rest by command type, so a storm of deaths
//! makes a few messages, not thousands. All rows of a message are settled by one
//! conditional statement: every death appears in exactly one acknowledged message
//! (unless a sender's claim lapses while its webhook hangs longer than the lease, when
//! the message may be repeated; its `tenax.delivery_ids` let a receiver tell).
//!
//! Queue threshold alerts: the outbox's `alert` rows, one message each, written with the
//! recorded change of a threshold's state ([`BacklogAlerter`]) and posted by the same
//! sender ([`DeathAlerter::deliver_queue_alerts`]).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tenax_kinds::outbound;
use tenax_storage::{
    AlertTransitionParams, OutboxClaimParams, OutboxKind, OutboxListParams, OutboxOutcome,
    OutboxRecord, OutboxSettleParams, OutboxStatus, Storage, StorageError, OUTBOX_BATCH_MAX,
};
use tokio_util::sync::CancellationToken;

use crate::config::{config_err, AlertsConfig, ConfigError};
use crate::deliver::{self, Posted};

/// Sends death alerts; run it with [`DeathAlerter::run`].
pub struct DeathAlerter {
    storage: Arc<dyn Storage>,
    client: reqwest::Client,
    config: AlertsConfig,
    url: String,
    secret: Option<Vec<u8>>,
}

impl DeathAlerter {
    /// An alerter for these settings, or `None` without a webhook. Messages are
    /// signed as callbacks are when `secret` is given.
    pub fn new(
        storage: Arc<dyn Storage>,
        config: AlertsConfig,
        secret: Option<String>,
    ) -> Result<Option<Self>, ConfigError> {
        config.validate()?;
        let Some(url) = config.webhook_url.clone() else {
            return Ok(None);
        };
        let client = outbound::client(config.timeout)
            .map_err(|e| config_err("alerts", format!("cannot build an HTTP client: {e}")))?;
        Ok(Some(Self {
            storage,
            client,
            config,
            url,
            secret: secret.map(String::into_bytes),
        }))
    }

    /// Send alerts until `shutdown`: death alerts, and the queue threshold alerts
    /// that [`BacklogAlerter`] writes to the outbox. A storage error is logged and
    /// retried.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut presence = deliver::Presence::new(vec![OutboxKind::Death, OutboxKind::Alert]);
        loop {
            presence.renew(self.storage.as_ref()).await;
            let sent_alerts = match self.deliver_queue_alerts().await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming queue alerts failed; retrying");
                    false
                }
            };
            let wait = match self.alert_due().await {
                Ok(Some(wait)) => wait,
                Ok(None) => self.config.poll_interval,
                Err(e) => {
                    tracing::warn!(error = %e, "reading deaths to alert failed; retrying");
                    self.config.poll_interval
                }
            };
            let wait = if sent_alerts { Duration::ZERO } else { wait };
            if wait.is_zero() && !shutdown.is_cancelled() {
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One round of queue threshold alerts: claim the due `alert` rows and post each
    /// once, as its own message under its own delivery id. Returns how many were
    /// claimed.
    pub async fn deliver_queue_alerts(&self) -> Result<usize, StorageError> {
        let rows = self
            .storage
            .outbox_claim(&OutboxClaimParams {
                kind: OutboxKind::Alert,
                limit: 50,
                lease: self.config.timeout * 2 + Duration::from_secs(30),
                now: None,
            })
            .await?;
        for row in &rows {
            let posted = deliver::post(
                &self.client,
                &self.url,
                &row.body,
                &row.delivery_id,
                self.secret.as_deref(),
            )
            .await;
            let outcome = self.outcome(posted, row.attempts, "queue alert");
            let settled = self
                .storage
                .outbox_settle(&OutboxSettleParams {
                    claims: vec![row.claim()],
                    outcome: outcome.clone(),
                    now: None,
                })
                .await;
            match settled {
                Ok(n) => deliver::count(OutboxKind::Alert, &outcome, n),
                // The claim lapses and the row is posted again, under the same id.
                Err(e) => {
                    tracing::warn!(delivery_id = %row.delivery_id, error = %e, "recording a queue alert failed");
                }
            }
        }
        Ok(rows.len())
    }

    /// The outbox outcome of one POST: delivered, or retried after the backoff of
    /// its attempt (longer if the receiver asked), until the maximum age.
    fn outcome(&self, posted: Posted, attempts: u32, what: &str) -> OutboxOutcome {
        match posted {
            Posted::Acknowledged => OutboxOutcome::Delivered,
            Posted::Failed(error, after) => {
                let delay =
                    deliver::backoff(attempts, self.config.backoff_base, self.config.backoff_cap);
                tracing::warn!(%error, ?delay, "{what} failed; retrying");
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

    /// One round. Returns `None` when no death waits, else how long to wait before the
    /// next round (zero when a message was just sent and more may be due).
    pub async fn alert_due(&self) -> Result<Option<Duration>, StorageError> {
        // Let a burst gather: wait until the oldest waiting death is a window old.
        let oldest = self
            .storage
            .outbox_list(&OutboxListParams {
                kind: Some(OutboxKind::Death),
                status: Some(OutboxStatus::Pending),
                task_id: None,
                limit: 1,
            })
            .await?;
        let Some(oldest) = oldest.first() else {
            return Ok(None);
        };
        let now = self.storage.now().await?;
        let ready_at = oldest.created_at
            + chrono::Duration::from_std(self.config.death_window).unwrap_or_default();
        if ready_at > now {
            return Ok(Some(
                (ready_at - now)
                    .to_std()
                    .unwrap_or(self.config.poll_interval),
            ));
        }
        let rows = self
            .storage
            .outbox_claim(&OutboxClaimParams {
                kind: OutboxKind::Death,
                limit: OUTBOX_BATCH_MAX,
                lease: self.config.timeout * 2 + Duration::from_secs(30),
                now: None,
            })
            .await?;
        if rows.is_empty() {
            // The oldest is waiting for its retry time.
            return Ok(Some(self.config.poll_interval));
        }
        let message = death_message(&rows, self.config.death_listed);
        let body = message.to_string();
        let attempts = rows.iter().map(|r| r.attempts).max().unwrap_or(1);
        let posted = deliver::post(
            &self.client,
            &self.url,
            &body,
            &rows[0].delivery_id,
            self.secret.as_deref(),
        )
        .await;
        let outcome = self.outcome(posted, attempts, "death alert");
        let delivered = outcome == OutboxOutcome::Delivered;
        let claims = rows.iter().map(OutboxRecord::claim).collect();
        let settled = self
            .storage
            .outbox_settle(&OutboxSettleParams {
                claims,
                outcome: outcome.clone(),
                now: None,
            })
            .await?;
        deliver::count(OutboxKind::Death, &outcome, settled);
        if delivered {
            tracing::info!(deaths = rows.len(), settled, "death alert sent");
            Ok(Some(Duration::ZERO))
        } else {
            Ok(Some(self.config.poll_interval))
        }
    }
}

/// The Slack-style message for a batch of deaths.
pub fn death_message(rows: &[OutboxRecord], listed: usize) -> Value {
    let summaries: Vec<Value> = rows
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap_or(Value::Null))
        .collect();
    let text_of = |v: &Value, key: &str| v[key].as_str().unwrap_or("?").to_owned();
    let mut lines = vec![if rows.len() == 1 {
        "1 task died".to_owned()
    } else {
        format!("{} tasks died", rows.len())
    }];
    for (row, summary) in rows.iter().zip(&summaries).take(listed) {
        let error: String = text_of(summary, "error").chars().take(300).collect();
        lines.push(format!(
            "• task {} `{}` ({}, queue {}) after {} attempt(s): {}",
            row.task_id,
            text_of(summary, "task_no"),
            text_of(summary, "command_type"),
            text_of(summary, "queue"),
            summary["attempt"].as_u64().unwrap_or(0),
            error
        ));
    }
    if rows.len() > listed {
        let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
        for summary in summaries.iter().skip(listed) {
            *by_type.entry(text_of(summary, "command_type")).or_default() += 1;
        }
        let counts: Vec<String> = by_type.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
        lines.push(format!(
            "…and {} more: {}",
            rows.len() - listed,
            counts.join(", ")
        ));
    }
    json!({
        "text": lines.join("\n"),
        "tenax": {
            "kind": "deaths",
            "count": rows.len(),
            "task_ids": rows.iter().map(|r| r.task_id.0).collect::<Vec<_>>(),
            "delivery_ids": rows.iter().map(|r| r.delivery_id.clone()).collect::<Vec<_>>(),
        },
    })
}

/// Thresholds of one queue (`[alerts.queues.<name>]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueThresholds {
    /// Alert while more tasks than this are due and unclaimed.
    pub max_backlog: Option<u64>,
    /// Alert while the oldest due task has waited longer than this.
    #[serde(default, deserialize_with = "crate::config::duration_opt")]
    pub max_oldest_age: Option<Duration>,
}

/// Records when a queue's backlog or oldest due age passes its threshold, and when it
/// is back under: on transitions only, recorded in the database so that one node
/// reports each. The message of each change is written to the outbox in the same
/// transaction ([`Storage::alert_transition`]), and [`DeathAlerter`] delivers it to the
/// webhook with retries, so a change reported while the webhook is down is sent when
/// it is back. Run it with [`BacklogAlerter::run`].
pub struct BacklogAlerter {
    storage: Arc<dyn Storage>,
    config: AlertsConfig,
}

impl BacklogAlerter {
    /// An alerter, or `None` without a webhook or without thresholds.
    pub fn new(
        storage: Arc<dyn Storage>,
        config: AlertsConfig,
    ) -> Result<Option<Self>, ConfigError> {
        config.validate()?;
        if config.webhook_url.is_none() || config.queues.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self { storage, config }))
    }

    /// Check every `check_interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            if let Err(e) = self.check_once().await {
                tracing::warn!(error = %e, "checking queue thresholds failed; retrying");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.config.check_interval) => {}
            }
        }
    }

    /// One check: read the queues' statistics and record each threshold's state,
    /// with the message of each change. Returns how many changes this node recorded.
    pub async fn check_once(&self) -> Result<usize, StorageError> {
        let stats = self
            .storage
            .queue_stats(&tenax_storage::QueueStatsParams { now: None })
            .await?;
        let mut recorded = 0;
        for (queue, limits) in &self.config.queues {
            let stat = stats.iter().find(|s| &s.queue == queue);
            let backlog = stat.map_or(0, |s| s.backlog);
            let age = stat.and_then(|s| s.oldest_due_age).unwrap_or_default();
            let mut checks = Vec::new();
            if let Some(max) = limits.max_backlog {
                checks.push((
                    "backlog",
                    backlog > max,
                    format!("backlog is {backlog} tasks (threshold {max})"),
                ));
            }
            if let Some(max) = limits.max_oldest_age {
                checks.push((
                    "oldest_age",
                    age > max,
                    format!(
                        "oldest due task has waited {} (threshold {})",
                        humantime::format_duration(Duration::from_secs(age.as_secs())),
                        humantime::format_duration(max)
                    ),
                ));
            }
            for (alert, firing, detail) in checks {
                let text = if firing {
                    format!("Queue `{queue}`: {detail}")
                } else {
                    format!("Resolved: queue `{queue}` {detail}")
                };
                let message = json!({
                    "text": text,
                    "tenax": {"kind": alert, "queue": queue, "firing": firing,
                              "backlog": backlog, "oldest_due_age_seconds": age.as_secs_f64()},
                })
                .to_string();
                let params = AlertTransitionParams {
                    queue: queue.clone(),
                    alert: alert.to_owned(),
                    firing,
                    message: Some(message),
                    now: None,
                };
                if self.storage.alert_transition(&params).await? {
                    tracing::info!(%queue, alert, firing, "queue threshold alert recorded");
                    recorded += 1;
                }
            }
        }
        Ok(recorded)
    }
}
