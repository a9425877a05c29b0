//! What the three backends do alike, written once: each file holds a macro that a
//! backend's file of the same name invokes with its own types, so every expansion is
//! checked against one backend's concrete sqlx types (no "any database" bounds). What
//! the dialects spell differently comes from [`Dialect`](crate::dialect::Dialect); what
//! stays in a backend's folder is what really differs there (a plan, a lock, a list
//! binding, a capability).

pub(crate) mod insert;
pub(crate) mod tasks;
