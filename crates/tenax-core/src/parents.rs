//! A workflow task's view of its parents: their results, read on demand through a
//! source the runtime provides, so [`Command`](crate::Command) stays free of database
//! types.
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::{CommandError, TaskId, TaskNo, TaskStatus};

/// One parent of a task in a workflow, as the child sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentResult {
    /// The parent's key in the workflow.
    pub key: String,
    /// Its number.
    pub task_no: TaskNo,
    /// Its status: `succeeded`, unless the workflow runs dependents anyway.
    pub status: TaskStatus,
    /// Its output as JSON, if it succeeded with one.
    pub output: Option<serde_json::Value>,
}

/// The future a [`ParentSource`] returns.
pub type ParentsFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<ParentResult>, String>> + Send + 'a>>;

/// Where a context reads its task's parents from (the runtime's storage).
pub trait ParentSource: Send + Sync {
    /// The parents of `task`, with their outputs; an error is a message (the read
    /// failed; the attempt may be retried).
    fn parents(&self, task: TaskId) -> ParentsFuture<'_>;
}

/// A shared [`ParentSource`], kept by a [`TaskContext`](crate::TaskContext).
#[derive(Clone)]
pub struct Parents(pub Arc<dyn ParentSource>);

impl fmt::Debug for Parents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Parents(..)")
    }
}

impl crate::TaskContext {
    /// The same context, able to read its task's parents from `source`.
    pub fn with_parents(mut self, source: Arc<dyn ParentSource>) -> Self {
        self.parents = Some(Parents(source));
        self
    }

    /// The task's parents in its workflow, with their outputs (empty for a task that
    /// is in no workflow or has no parents). A failed read is retryable.
    pub async fn parent_results(&self) -> Result<Vec<ParentResult>, CommandError> {
        match &self.parents {
            Some(Parents(source)) => source
                .parents(self.id())
                .await
                .map_err(|e| CommandError::retryable(format!("reading parent results: {e}"))),
            None => Ok(Vec::new()),
        }
    }

    /// The output of the parent with key `key`, decoded as `T` (usually the parent
    /// command's `Output`). A missing parent or an output of another shape is a
    /// permanent error.
    pub async fn parent_output<T: DeserializeOwned>(&self, key: &str) -> Result<T, CommandError> {
        let parent = self
            .parent_results()
            .await?
            .into_iter()
            .find(|p| p.key == key)
            .ok_or_else(|| CommandError::permanent(format!("no parent with key {key:?}")))?;
        let output = parent.output.unwrap_or(serde_json::Value::Null);
        serde_json::from_value(output).map_err(|e| {
            CommandError::permanent(format!("the output of parent {key:?} does not decode: {e}"))
        })
    }
}
