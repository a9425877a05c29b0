//! Storage statements written once for the three backends. Each file holds the
//! statements of one topic as a `macro_rules!` that each backend's file of that topic
//! invokes, as [`crate::flow_sql`] does for the workflows: every expansion is checked
//! against one backend's concrete types, and what a backend spells its own way comes
//! from its [`Dialect`](crate::dialect::Dialect) or from a small trait of the topic's
//! file.
pub(crate) mod outbox;
pub(crate) mod schedules;
