//! Reliable delivery of Tenax's outcomes and events out of the process.
//!
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
//!
//! The HTTP client the senders use, and [`ConfigError`], are `tenax-kinds`'s.
#![forbid(unsafe_code)]

pub mod alerts;
pub mod callbacks;
pub mod config;
mod deliver;
mod deliveries;
pub mod events;
pub mod events_nats;
pub mod events_rabbitmq;
pub mod relay;
pub mod sign;

pub use config::{AlertsConfig, CallbacksConfig, ConfigError};
pub use deliveries::Deliveries;
