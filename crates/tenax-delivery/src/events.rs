//! Task events: the sequencer that gives committed events their stream positions, and
//! the retention of delivered events.
//!
//! Every node runs a [`Sequencer`]; one at a time holds the `sequencer` lease in the
//! database and does the work, the others stand by and take over when its lease
//! lapses (a crashed holder delays events by at most the lease's length, and loses
//! none: the events wait in their table). Each sequencing step is one transaction
//! fenced on the lease's epoch, so a holder that lost its lease writes nothing.
use std::sync::Arc;
use std::time::Duration;

use tenax_storage::{
    EventLease, EventLeaseParams, EventPruneParams, EventSequenceParams, Storage, SEQUENCER_LEASE,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How the sequencer and the retention run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// Time between looks for new events when there were none. Defaults to 200 ms.
    #[serde(deserialize_with = "crate::config::duration")]
    pub poll_interval: Duration,
    /// Length of the sequencer's lease: how long a crashed holder delays events.
    /// Defaults to 15 s.
    #[serde(deserialize_with = "crate::config::duration")]
    pub lease_ttl: Duration,
    /// Events sequenced per transaction. Defaults to 1000.
    pub batch: u32,
    /// Delivered events older than this are deleted. Defaults to 7 days.
    #[serde(deserialize_with = "crate::config::duration")]
    pub retention: Duration,
    /// Time between two prunes. Defaults to 1 minute.
    #[serde(deserialize_with = "crate::config::duration")]
    pub prune_interval: Duration,
    /// The NATS JetStream relay (`[events.nats]`), off when absent.
    pub nats: Option<crate::events_nats::NatsConfig>,
    /// The RabbitMQ relay (`[events.rabbitmq]`), off when absent.
    pub rabbitmq: Option<crate::events_rabbitmq::RabbitMqConfig>,
    /// Secret payload fields, masked in the results the relays publish (set from the
    /// top-level `[secrets]`, not under `[events]`).
    #[serde(skip)]
    pub secrets: tenax_core::Secrets,
}

impl EventsConfig {
    /// Default of [`EventsConfig::poll_interval`].
    pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_millis(200);
    /// Default of [`EventsConfig::lease_ttl`].
    pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(15);
    /// Default of [`EventsConfig::batch`].
    pub const BATCH_DEFAULT: u32 = 1000;
    /// Default of [`EventsConfig::retention`].
    pub const RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
    /// Default of [`EventsConfig::prune_interval`].
    pub const PRUNE_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

    /// Check the settings.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad =
            |key: &str, why: &str| Err(crate::config::config_err(format!("events.{key}"), why));
        if self.poll_interval.is_zero() || self.poll_interval > Duration::from_secs(60) {
            return bad("poll_interval", "must be above zero and at most 60s");
        }
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl > Duration::from_secs(600) {
            return bad("lease_ttl", "must be between 1s and 10m");
        }
        if self.batch == 0 || self.batch > tenax_storage::EVENT_BATCH_MAX {
            return bad("batch", "must be between 1 and 10000");
        }
        if self.prune_interval.is_zero() {
            return bad("prune_interval", "must be above zero");
        }
        if let Some(nats) = &self.nats {
            nats.validate()?;
        }
        if let Some(rabbitmq) = &self.rabbitmq {
            rabbitmq.validate()?;
        }
        Ok(())
    }
}

impl EventsConfig {
    /// The lease names of the configured relays: the pruner keeps every event until
    /// each of them delivered it.
    pub fn relays(&self) -> Vec<String> {
        let mut relays = Vec::new();
        if self.nats.is_some() {
            relays.push(crate::events_nats::NatsConfig::LEASE.to_owned());
        }
        if self.rabbitmq.is_some() {
            relays.push(crate::events_rabbitmq::RabbitMqConfig::LEASE.to_owned());
        }
        relays
    }
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            poll_interval: Self::POLL_INTERVAL_DEFAULT,
            lease_ttl: Self::LEASE_TTL_DEFAULT,
            batch: Self::BATCH_DEFAULT,
            retention: Self::RETENTION_DEFAULT,
            prune_interval: Self::PRUNE_INTERVAL_DEFAULT,
            nats: None,
            rabbitmq: None,
            secrets: tenax_core::Secrets::default(),
        }
    }
}

/// Gives committed events their positions while it holds the `sequencer` lease, and
/// prunes delivered events past the retention.
pub struct Sequencer {
    storage: Arc<dyn Storage>,
    holder: String,
    config: EventsConfig,
    relays: Vec<String>,
}

impl Sequencer {
    /// A sequencer for this node (`holder` names it in the lease), keeping events until
    /// each of `relays` (their lease names) delivered them.
    pub fn new(
        storage: Arc<dyn Storage>,
        holder: impl Into<String>,
        config: EventsConfig,
        relays: Vec<String>,
    ) -> Self {
        Self {
            storage,
            holder: holder.into(),
            config,
            relays,
        }
    }

    /// Run until `shutdown`. Storage errors are logged and retried after a pause.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut lease: Option<EventLease> = None;
        let mut renewed_at = Instant::now();
        let mut pruned_at: Option<Instant> = None;
        loop {
            // Take or renew the lease a third of the way through it.
            if lease.is_none() || renewed_at.elapsed() >= self.config.lease_ttl / 3 {
                let asked = Instant::now();
                match self
                    .storage
                    .event_lease(&EventLeaseParams {
                        name: SEQUENCER_LEASE.to_owned(),
                        holder: self.holder.clone(),
                        ttl: self.config.lease_ttl,
                        now: None,
                    })
                    .await
                {
                    Ok(Some(held)) => {
                        if lease.as_ref().map(|l| l.epoch) != Some(held.epoch) {
                            tracing::info!(epoch = held.epoch, "holding the event sequencer lease");
                        }
                        lease = Some(held);
                        renewed_at = asked;
                    }
                    Ok(None) => lease = None,
                    Err(e) => {
                        tracing::warn!(error = %e, "taking the event sequencer lease failed");
                        lease = None;
                    }
                }
            }
            let mut busy = false;
            if let Some(held) = &lease {
                match self
                    .storage
                    .event_sequence(&EventSequenceParams {
                        lease: held.clone(),
                        limit: self.config.batch,
                        now: None,
                    })
                    .await
                {
                    Ok(Some(n)) => {
                        busy = n >= u64::from(self.config.batch);
                        if n > 0 {
                            metrics::counter!("tenax_events_sequenced_total").increment(n);
                        }
                    }
                    Ok(None) => {
                        tracing::info!("the event sequencer lease was lost");
                        lease = None;
                    }
                    Err(e) => tracing::warn!(error = %e, "sequencing events failed; retrying"),
                }
                if pruned_at.is_none_or(|t| t.elapsed() >= self.config.prune_interval) {
                    pruned_at = Some(Instant::now());
                    match self
                        .storage
                        .event_prune(&EventPruneParams {
                            older_than: self.config.retention,
                            relays: self.relays.clone(),
                            now: None,
                        })
                        .await
                    {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(events = n, "pruned delivered events"),
                        Err(e) => tracing::warn!(error = %e, "pruning events failed"),
                    }
                }
            }
            let pause = if busy {
                Duration::ZERO
            } else if lease.is_some() {
                self.config.poll_interval
            } else {
                self.config.lease_ttl / 3
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}
