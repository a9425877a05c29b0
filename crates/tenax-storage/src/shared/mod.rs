//! Storage statements written once for the three backends, one file per topic: each
//! holds a `macro_rules!` that a backend's file of that topic invokes (as
//! [`workflow_statements!`](crate::flow_sql::workflow_statements) does for the
//! workflows), so that every expansion is checked against that backend's concrete sqlx
//! types, and what a backend spells its own way comes from its
//! [`Dialect`](crate::dialect::Dialect). What a backend still writes by hand differs in
//! plan, locking or list form, not only in spelling.

pub(crate) mod outcomes;
pub(crate) mod runtime;
