//! Storage statements written once for the three backends, one file per topic. Each file
//! holds a `macro_rules!` that the backend file of the same name invokes with its sqlx
//! database and storage types (the pattern of [`crate::flow_sql`]: each expansion is
//! checked against one backend's concrete types), and the few pieces of SQL the
//! backends spell their own way for that topic; what really differs between the
//! backends stays in their own files.
pub(crate) mod alert_state;
pub(crate) mod audit;
pub(crate) mod queue_stats;
pub(crate) mod queues;
pub(crate) mod rates;
