//! What the three backends do alike, written once: each file holds a `macro_rules!`
//! that a backend's module of that topic invokes with its own types, as
//! `crate::flow_sql` does for the workflows, so every expansion is checked against one
//! backend's concrete sqlx types (no "any database" bounds). What the dialects spell
//! differently comes from [`Dialect`](crate::dialect::Dialect) and from small traits
//! of a file's own; each backend keeps by hand only what really differs there (a plan,
//! a lock, a list binding, a capability).
pub(crate) mod actions;
pub(crate) mod alert_state;
pub(crate) mod audit;
pub(crate) mod events;
pub(crate) mod insert;
pub(crate) mod outbox;
pub(crate) mod outcomes;
pub(crate) mod prune;
pub(crate) mod queue_stats;
pub(crate) mod queues;
pub(crate) mod rates;
pub(crate) mod runtime;
pub(crate) mod schedules;
pub(crate) mod storage;
pub(crate) mod tasks;
