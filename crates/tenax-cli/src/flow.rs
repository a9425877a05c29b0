//! `FLOW_STEP`: a built-in command for workflows from the command line and for process
//! tests. Its context says how long it works, whether it fails, and a value; its output
//! is that value plus the outputs of its parents, read through the task context.
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax::{Command, CommandError, RetryPolicy, TaskContext};

/// The context of a `FLOW_STEP` task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Step {
    /// Fail permanently (the task dies) after working.
    #[serde(default)]
    pub(crate) fail: bool,
    /// How long the step works, in milliseconds.
    #[serde(default)]
    pub(crate) work_ms: u64,
    /// How long its compensation works, in milliseconds.
    #[serde(default)]
    pub(crate) compensate_ms: u64,
    /// Added to the parents' outputs.
    #[serde(default)]
    pub(crate) value: i64,
}

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct FlowStep;

impl Command for FlowStep {
    const TYPE: &'static str = "FLOW_STEP";
    const MAX_ATTEMPTS: u32 = 3;
    type Context = Step;
    type Output = i64;

    async fn execute(&self, step: Step, task: &TaskContext) -> Result<i64, CommandError> {
        tokio::time::sleep(Duration::from_millis(step.work_ms)).await;
        if step.fail {
            return Err(CommandError::permanent("the step was told to fail"));
        }
        let mut sum = step.value;
        for parent in task.parent_results().await? {
            sum += parent.output.and_then(|o| o.as_i64()).unwrap_or(0);
        }
        Ok(sum)
    }

    async fn compensate(&self, step: Step, _task: &TaskContext) -> Result<(), CommandError> {
        tokio::time::sleep(Duration::from_millis(step.compensate_ms)).await;
        Ok(())
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::exponential(Duration::from_millis(50), Duration::from_millis(500))
    }
}
