//! The built-in kinds that need no Rust code (`http`, `exec`) and outbound delivery
//! (completion callbacks, death alerts), as `tenax.toml` configures them for
//! `tenax worker` and `tenax serve`.

use tenax::Registry;
use tenax_delivery::events::EventsConfig;
use tenax_delivery::events_rabbitmq::RabbitMqConfig;
use tenax_delivery::{AlertsConfig, CallbacksConfig, Deliveries};
use tenax_kinds::exec::ExecKind;
use tenax_kinds::http::HttpKind;
use tenax_kinds::{ExecConfig, HttpConfig};

use crate::config::FileConfig;

/// The environment variable that overrides `[callbacks] secret`.
pub(crate) const CALLBACKS_SECRET_ENV: &str = "TENAX_CALLBACKS_SECRET";

/// The kinds and senders of one process, validated.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kinds {
    pub(crate) http: HttpConfig,
    pub(crate) exec: ExecConfig,
    pub(crate) callbacks: CallbacksConfig,
    pub(crate) alerts: AlertsConfig,
    pub(crate) events: EventsConfig,
    /// Secret payload fields (`[secrets]`), masked by the worker, the server and the
    /// relays.
    pub(crate) secrets: tenax::Secrets,
    /// Retry policies and attempt budgets per command type (`[retry."TYPE"]`).
    pub(crate) retry: std::collections::BTreeMap<String, crate::config::CommandRetry>,
}

impl Kinds {
    /// From the file, with the environment's secret; every table validated.
    pub(crate) fn from_file(file: &FileConfig) -> anyhow::Result<Self> {
        let mut callbacks = file.callbacks.clone().unwrap_or_default();
        if let Ok(secret) = std::env::var(CALLBACKS_SECRET_ENV) {
            if !secret.is_empty() {
                callbacks.secret = Some(secret);
            }
        }
        let secrets = file.secrets()?;
        let mut events = file.events.clone().unwrap_or_default();
        events.secrets = secrets.clone();
        let kinds = Self {
            http: file.http.clone().unwrap_or_default(),
            exec: file.exec.clone().unwrap_or_default(),
            callbacks,
            alerts: file.alerts.clone().unwrap_or_default(),
            events,
            secrets,
            retry: crate::config::retry_policies(&file.retry)?,
        };
        kinds.http.validate()?;
        kinds.exec.validate()?;
        // The senders' tables, and the brokers this build can reach.
        kinds.deliveries()?;
        Ok(kinds)
    }

    /// The kinds configured: `http` with targets, `exec` with an allow-list.
    pub(crate) fn command_types(&self) -> Vec<&'static str> {
        let mut types = Vec::new();
        if !self.http.targets.is_empty() {
            types.push(tenax_kinds::http::TYPE);
        }
        if !self.exec.allow.is_empty() {
            types.push(tenax_kinds::exec::TYPE);
        }
        types
    }

    /// Register the configured kinds.
    pub(crate) fn register(&self, registry: &mut Registry) -> anyhow::Result<()> {
        if !self.http.targets.is_empty() {
            registry.register(HttpKind::new(self.http.clone())?)?;
        }
        if !self.exec.allow.is_empty() {
            registry.register(ExecKind::new(self.exec.clone())?)?;
        }
        Ok(())
    }

    /// Give the handlers of `registry` the retry policies of `[retry."TYPE"]`. A table
    /// for a type this process runs no handler of only sets the attempt budget where
    /// tasks are enqueued.
    pub(crate) fn apply_retry(&self, registry: &mut Registry) -> anyhow::Result<()> {
        for (command_type, retry) in &self.retry {
            let Some(policy) = &retry.policy else {
                continue;
            };
            if registry.get(command_type).is_none() {
                tracing::info!(
                    command_type,
                    "retry.{command_type:?}: no handler of this type runs here; its policy applies where one does"
                );
                continue;
            }
            registry.set_retry_policy(command_type, policy.clone())?;
        }
        Ok(())
    }

    /// The configured senders and the event sequencer, to run beside the worker.
    pub(crate) fn deliveries(&self) -> anyhow::Result<Deliveries> {
        Ok(Deliveries::new()
            .with_callbacks(self.callbacks.clone())?
            .with_alerts(self.alerts.clone())?
            .with_events(self.events.clone())?)
    }

    /// The event sequencer and relays alone, for a node that runs no worker.
    pub(crate) fn deliveries_of_events(&self) -> anyhow::Result<Deliveries> {
        Ok(Deliveries::new().with_events(self.events.clone())?)
    }
}

/// The `[http]`, `[exec]`, `[callbacks]` and `[alerts]` keys, for the configuration
/// reference.
pub(crate) fn reference() -> Vec<crate::config::Key> {
    let h = HttpConfig::default();
    let c = CallbacksConfig::default();
    let a = AlertsConfig::default();
    let e = EventsConfig::default();
    let secs = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let key = |key, env, default: String, doc| crate::config::Key {
        key,
        env,
        flag: "",
        default,
        doc,
    };
    vec![
        key("secrets.<type>", "", "none".into(),
            "Secret payload fields of a command type: `card.number`, `cards[].number` (each element), or a key holding dots. Masked as `\"***\"` in every answer, the dashboard and `tenax tasks`; the worker masks them, and every literal copy of their values, in results and errors before storing them, so events, relays, callbacks and alerts never carry them."),
        key("http.targets.<name>.base_url", "", "none".into(),
            "Scheme, host, port and path prefix of a target of the `http` kind; a task names the target and may only append a `path` (no `..`, `//`, `@`, scheme). With targets, `http` is registered and accepted by the API, which refuses unknown targets (422)."),
        key("http.targets.<name>.method", "", "POST".into(), "GET, POST, PUT, PATCH or DELETE."),
        key("http.targets.<name>.headers", "", "none".into(),
            "Headers sent on every request to the target (a task cannot replace them)."),
        key("http.targets.<name>.timeout", "", "30s".into(), "Longest one request may take."),
        key("http.targets.<name>.compensate", "", "none".into(),
            "`{ path, method }`: the request that undoes a dead task's call, with the same body and `Idempotency-Key`."),
        key("http.max_response", "", h.max_response.to_string(),
            "Largest response body kept as the task's result, in bytes."),
        key("http.backoff_base", "", secs(h.backoff_base),
            "First retry delay of a failed call (doubling, full jitter); a `Retry-After` replaces it."),
        key("http.backoff_cap", "", secs(h.backoff_cap), "Longest retry delay of a failed call."),
        key("exec.allow.<name>", "", "none".into(),
            "Absolute path of a program the `exec` kind may run under this name. Without any, `exec` is not registered."),
        key("exec.permanent_exit_codes", "", "[]".into(),
            "Exit codes that end the task at once (dead); other non-zero codes are retried."),
        key("exec.timeout", "", secs(ExecConfig::TIMEOUT_DEFAULT),
            "Longest a run may take; then its whole process group is killed and the attempt retried."),
        key("exec.max_output", "", ExecConfig::MAX_OUTPUT_DEFAULT.to_string(),
            "Bytes of standard output and of standard error kept each (at most 1 MiB)."),
        key("exec.env", "", "[]".into(),
            "Names of the worker's environment variables every run receives; all others are withheld."),
        key("exec.working_dir", "", "the temporary directory".into(), "Working directory of every run."),
        key("exec.backoff_base", "", "1s".into(), "First retry delay of a failed run."),
        key("exec.backoff_cap", "", "10m".into(), "Longest retry delay of a failed run."),
        key("callbacks.allow_hosts", "", "[]".into(),
            "Hosts a task's `callback_url` may name (`hooks.example.com`, `host:port`, `*.example.com`). Empty: callbacks are off and the API refuses `callback_url` (422)."),
        key("callbacks.secret", CALLBACKS_SECRET_ENV, "none".into(),
            "HMAC-SHA256 key of the `Tenax-Signature` header (at least 16 bytes; required with hosts)."),
        key("callbacks.timeout", "", secs(c.timeout), "Longest one delivery attempt may take."),
        key("callbacks.max_age", "", secs(c.max_age), "A callback not acknowledged within this is dropped (expired)."),
        key("callbacks.backoff_base", "", secs(c.backoff_base), "First retry delay (doubling, with jitter); a receiver's `Retry-After` can lengthen it."),
        key("callbacks.backoff_cap", "", secs(c.backoff_cap), "Longest retry delay."),
        key("callbacks.poll_interval", "", secs(c.poll_interval), "Time between looks for due callbacks when idle."),
        key("alerts.webhook_url", "", "none".into(),
            "Where death alerts and queue threshold alerts are POSTed (Slack-style `{\"text\": ...}`). Without it, none is sent."),
        key("alerts.death_window", "", secs(a.death_window), "How long deaths gather before a message, so a storm makes few messages."),
        key("alerts.death_listed", "", a.death_listed.to_string(), "Deaths named one by one per message; the rest are counted by command type."),
        key("alerts.timeout", "", secs(a.timeout), "Longest one alert attempt may take."),
        key("alerts.max_age", "", secs(a.max_age), "An alert not acknowledged within this is dropped."),
        key("alerts.backoff_base", "", secs(a.backoff_base), "First retry delay of a failed alert."),
        key("alerts.backoff_cap", "", secs(a.backoff_cap), "Longest retry delay of a failed alert."),
        key("alerts.poll_interval", "", secs(a.poll_interval), "Time between looks for deaths when idle."),
        key("alerts.queues.<name>.max_backlog", "", "none".into(),
            "Alert when more tasks than this are due and unclaimed in the queue, and again when it is back under (once across nodes; the message is kept in the outbox until the webhook acknowledges it)."),
        key("alerts.queues.<name>.max_oldest_age", "", "none".into(),
            "Alert when the queue's oldest due task has waited longer than this, and again when it is back under."),
        key("alerts.check_interval", "", secs(a.check_interval), "Time between two checks of the queue thresholds."),
        key("events.poll_interval", "", secs(e.poll_interval), "Time between the sequencer's looks for new task events when there were none (and between an SSE stream's looks)."),
        key("events.lease_ttl", "", secs(e.lease_ttl), "Length of the sequencer's database lease: how long a crashed holder can delay events."),
        key("events.batch", "", e.batch.to_string(), "Task events given their stream position per transaction."),
        key("events.retention", "", secs(e.retention), "Task events older than this, and delivered by every relay, are deleted."),
        key("events.prune_interval", "", secs(e.prune_interval), "Time between two prunes of task events."),
        key("events.nats.url", "", "none".into(),
            "NATS server (`nats://` or `tls://`) the relay publishes task events to with JetStream acknowledgements; the relay runs when this table is set (builds with the `nats` feature)."),
        key("events.nats.stream", "", "TENAX_EVENTS".into(),
            "JetStream stream the relay publishes into; created when missing, holding `<subject_prefix>.>`."),
        key("events.nats.subject_prefix", "", "tenax.events".into(),
            "Events go to `<subject_prefix>.<queue>.<event>`, with the event's id as `Nats-Msg-Id` so JetStream drops a republished copy."),
        key("events.nats.ack_timeout", "", "5s".into(), "Longest wait for one publish acknowledgement."),
        key("events.rabbitmq.url", "", "none".into(),
            "RabbitMQ broker (`amqp://user:password@host:port/vhost` or `amqps://`) the relay publishes task events to, persistent and with publisher confirms; the relay runs when this table is set (builds with the `rabbitmq` feature)."),
        key("events.rabbitmq.exchange", "", RabbitMqConfig::EXCHANGE_DEFAULT.into(),
            "Durable topic exchange the relay declares and publishes to."),
        key("events.rabbitmq.routing_key_prefix", "", RabbitMqConfig::ROUTING_KEY_PREFIX_DEFAULT.into(),
            "Events are routed with `<routing_key_prefix>.<queue>.<event>`; `message_id` is the event's id, for consumers to deduplicate on."),
        key("events.rabbitmq.queue", "", "none".into(),
            "Durable quorum queue the relay declares and binds with `<routing_key_prefix>.#`, so events are kept before any consumer exists. Without it (and without a queue bound by others) messages are unroutable and the relay waits."),
        key("events.rabbitmq.confirm_timeout", "", secs(RabbitMqConfig::CONFIRM_TIMEOUT_DEFAULT),
            "Longest wait for the broker's confirms of one published page; then the relay reconnects and publishes again from its cursor."),
    ]
}
