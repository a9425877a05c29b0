//! Statements that differ between the backends only in spelling, written once per
//! topic: each file holds a `macro_rules!` that a backend's module of that topic
//! invokes, as `crate::flow_sql` does for the workflows, with what each backend spells
//! its own way taken from its [`Dialect`](crate::dialect::Dialect) (and from small
//! traits of the file's own). Each backend keeps by hand only the statements whose plans
//! or locking really differ.
pub(crate) mod actions;
pub(crate) mod events;
pub(crate) mod prune;
