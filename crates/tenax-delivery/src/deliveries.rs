//! Every outbound delivery of one process, run beside a worker: completion callbacks,
//! death and backlog alerts, and the event sequencer with its relays.
//!
//! ```no_run
//! # async fn run(storage: std::sync::Arc<dyn tenax_storage::Storage>, registry: tenax_core::Registry) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tenax_delivery::{AlertsConfig, CallbacksConfig, Deliveries};
//! use tenax_runtime::{Worker, WorkerConfig};
//!
//! let deliveries = Deliveries::new()
//!     .with_callbacks(CallbacksConfig {
//!         allow_hosts: vec!["hooks.example.com".into()],
//!         secret: Some("a secret of at least 16 bytes".into()),
//!         ..CallbacksConfig::default()
//!     })?
//!     .with_alerts(AlertsConfig {
//!         webhook_url: Some("https://hooks.example.com/tenax".into()),
//!         ..AlertsConfig::default()
//!     })?;
//! Worker::new(storage, registry, WorkerConfig::default())?
//!     .with_service(Arc::new(deliveries))
//!     .run(tokio_util::sync::CancellationToken::new())
//!     .await?;
//! # Ok(()) }
//! ```
use std::sync::Arc;

use futures::future::BoxFuture;
use tenax_storage::{OutboxKind, Storage};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::alerts::{BacklogAlerter, DeathAlerter};
use crate::callbacks::CallbackSender;
use crate::events::{EventsConfig, Sequencer};
use crate::{AlertsConfig, CallbacksConfig, ConfigError};

/// The senders of one process, each configured and checked; a
/// [`tenax_runtime::Service`] for [`tenax_runtime::Worker::with_service`]. Each
/// runs only when configured: callbacks with an allowed host, alerts with a webhook,
/// the event sequencer (and its relays) with [`Deliveries::with_events`].
#[derive(Clone)]
pub struct Deliveries {
    callbacks: CallbacksConfig,
    alerts: AlertsConfig,
    /// The sequencer takes part in the event lease, and prunes events by its
    /// settings, so it runs only where asked for: every node that runs one must
    /// know the relays.
    events: Option<EventsConfig>,
    /// This node's name in the event lease.
    holder: String,
}

impl std::fmt::Debug for Deliveries {
    /// The kinds and hosts only: the configurations hold secrets (the signing key,
    /// the webhook URL, broker credentials).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliveries")
            .field("kinds", &self.kinds())
            .field("callback_hosts", &self.callbacks.allow_hosts)
            .field("events", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for Deliveries {
    fn default() -> Self {
        Self::new()
    }
}

impl Deliveries {
    /// Nothing yet; add senders with the `with_` methods.
    pub fn new() -> Self {
        Self {
            callbacks: CallbacksConfig::default(),
            alerts: AlertsConfig::default(),
            events: None,
            holder: format!(
                "{}-{}-{:08x}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "node".to_owned()),
                std::process::id(),
                rand::random::<u32>()
            ),
        }
    }

    /// Deliver completion callbacks (on when some host is allowed).
    pub fn with_callbacks(mut self, callbacks: CallbacksConfig) -> Result<Self, ConfigError> {
        callbacks.validate()?;
        check_client("callbacks", callbacks.timeout)?;
        self.callbacks = callbacks;
        Ok(self)
    }

    /// Send death alerts, and queue threshold alerts where thresholds are set (on
    /// when a webhook is given).
    pub fn with_alerts(mut self, alerts: AlertsConfig) -> Result<Self, ConfigError> {
        alerts.validate()?;
        check_client("alerts", alerts.timeout)?;
        self.alerts = alerts;
        Ok(self)
    }

    /// Sequence task events with these settings, and relay them where a relay is set
    /// (a relay needs the cargo feature of its broker). Every node that runs a
    /// sequencer must be given the same relays: the one holding the lease prunes
    /// events no configured relay still needs.
    pub fn with_events(mut self, events: EventsConfig) -> Result<Self, ConfigError> {
        events.validate()?;
        #[cfg(not(feature = "nats"))]
        if events.nats.is_some() {
            return Err(crate::config::config_err(
                "events.nats",
                "this build has no NATS support (cargo feature `nats`)",
            ));
        }
        #[cfg(not(feature = "rabbitmq"))]
        if events.rabbitmq.is_some() {
            return Err(crate::config::config_err(
                "events.rabbitmq",
                "this build has no RabbitMQ support (cargo feature `rabbitmq`)",
            ));
        }
        self.events = Some(events);
        Ok(self)
    }

    /// The outbox kinds this process sends.
    pub fn kinds(&self) -> Vec<OutboxKind> {
        let mut kinds = Vec::new();
        if self.callbacks.enabled() {
            kinds.push(OutboxKind::Callback);
        }
        if self.alerts.webhook_url.is_some() {
            kinds.extend([OutboxKind::Death, OutboxKind::Alert]);
        }
        kinds
    }

    /// Run every configured sender until `stop`, and wait for each to finish its last
    /// attempt. A sender that cannot start is logged; the others run.
    pub async fn run_until(self, storage: Arc<dyn Storage>, stop: CancellationToken) {
        let mut senders = JoinSet::new();
        self.spawn_events(&storage, &stop, &mut senders);
        if self.callbacks.enabled() {
            match CallbackSender::new(storage.clone(), self.callbacks.clone()) {
                Ok(sender) => {
                    tracing::info!(hosts = ?self.callbacks.allow_hosts, "delivering completion callbacks");
                    senders.spawn(sender.run(stop.clone()));
                }
                Err(e) => tracing::error!(error = %e, "completion callbacks cannot start"),
            }
        }
        match DeathAlerter::new(storage.clone(), self.alerts.clone(), None) {
            Ok(Some(alerter)) => {
                tracing::info!("sending death alerts");
                senders.spawn(alerter.run(stop.clone()));
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "death alerts cannot start"),
        }
        match BacklogAlerter::new(storage.clone(), self.alerts.clone()) {
            Ok(Some(alerter)) => {
                tracing::info!(queues = ?self.alerts.queues.keys().collect::<Vec<_>>(), "checking queue thresholds");
                senders.spawn(alerter.run(stop.clone()));
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "queue threshold alerts cannot start"),
        }
        while let Some(done) = senders.join_next().await {
            if let Err(e) = done {
                tracing::warn!(error = %e, "a delivery sender stopped abnormally");
            }
        }
    }

    /// The event sequencer, and the relays configured.
    fn spawn_events(
        &self,
        storage: &Arc<dyn Storage>,
        stop: &CancellationToken,
        senders: &mut JoinSet<()>,
    ) {
        let Some(events) = &self.events else {
            return;
        };
        #[cfg(feature = "nats")]
        if let Some(nats) = events.nats.clone() {
            tracing::info!(url = %nats.url, stream = %nats.stream, "relaying task events to NATS");
            let relay = crate::events_nats::NatsRelay::new(
                storage.clone(),
                self.holder.clone(),
                events.clone(),
                nats,
            );
            senders.spawn(relay.run(stop.clone()));
        }
        #[cfg(feature = "rabbitmq")]
        if let Some(rabbit) = events.rabbitmq.clone() {
            tracing::info!(
                url = %rabbit.redacted_url(),
                exchange = %rabbit.exchange,
                queue = ?rabbit.queue,
                "relaying task events to RabbitMQ"
            );
            let relay = crate::events_rabbitmq::RabbitMqRelay::new(
                storage.clone(),
                self.holder.clone(),
                events.clone(),
                rabbit,
            );
            senders.spawn(relay.run(stop.clone()));
        }
        let sequencer = Sequencer::new(
            storage.clone(),
            self.holder.clone(),
            events.clone(),
            events.relays(),
        );
        senders.spawn(sequencer.run(stop.clone()));
    }
}

/// Build the HTTP client a sender will use, so that a configuration it cannot run
/// with is refused before the worker starts.
fn check_client(table: &str, timeout: std::time::Duration) -> Result<(), ConfigError> {
    tenax_kinds::outbound::client(timeout)
        .map(drop)
        .map_err(|e| crate::config::config_err(table, format!("cannot build an HTTP client: {e}")))
}

impl tenax_runtime::Service for Deliveries {
    fn name(&self) -> &str {
        "deliveries"
    }

    fn ready(&self, storage: Arc<dyn Storage>) -> BoxFuture<'static, ()> {
        let kinds = self.kinds();
        Box::pin(async move {
            if kinds.is_empty() {
                return;
            }
            if let Err(e) = crate::deliver::record_senders(storage.as_ref(), &kinds).await {
                tracing::warn!(error = %e, ?kinds, "recording the senders before the first claim failed; they record themselves when they start");
            }
        })
    }

    fn run(
        self: Arc<Self>,
        storage: Arc<dyn Storage>,
        stop: CancellationToken,
    ) -> BoxFuture<'static, ()> {
        let deliveries = Arc::unwrap_or_clone(self);
        Box::pin(deliveries.run_until(storage, stop))
    }
}
