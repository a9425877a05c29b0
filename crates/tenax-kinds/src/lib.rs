//! Built-in Tenax command kinds that need no Rust code, and reliable outbound delivery.
//!
//! - [`http::HttpKind`] (`http`): calls an endpoint declared by name in the
//!   configuration; a task names the target and carries the body, never a URL.
//! - [`exec::ExecKind`] (`exec`): runs an allow-listed program with an argument
//!   array, never through a shell.
//! - [`callbacks::CallbackSender`]: POSTs a task's final outcome to its
//!   `callback_url`, signed ([`sign`]), from the outbox the database fills in the
//!   transaction that finishes the task.
//! - [`alerts::DeathAlerter`]: tells a webhook about dead tasks, every death in
//!   exactly one message, a storm summarised.
//! - [`events::Sequencer`]: gives task events their stream positions under a
//!   database lease, and prunes delivered events.
//! - [`relay::Relay`]: publishes sequenced task events through a [`relay::Broker`]
//!   under a database lease, written once; [`events_nats`] and [`events_rabbitmq`]
//!   hold the brokers for NATS JetStream and RabbitMQ (cargo features `nats` and
//!   `rabbitmq`).
//! - [`Deliveries`]: all of the senders above, configured once and run beside a
//!   worker ([`tenax_runtime::Worker::with_service`]); `tenax worker` and `tenax serve`
//!   run theirs this way.
#![forbid(unsafe_code)]

pub mod alerts;
pub mod callbacks;
pub mod config;
mod deliver;
mod deliveries;
pub mod events;
pub mod events_nats;
pub mod events_rabbitmq;
pub mod exec;
pub mod http;
pub mod outbound;
pub mod relay;
pub mod sign;

pub use config::{
    AlertsConfig, CallbacksConfig, ConfigError, ExecConfig, HttpCompensate, HttpConfig, HttpTarget,
};
pub use deliveries::Deliveries;
pub use outbound::{client, install_tls_provider};
