//! A [`Storage`] wrapper that times every call into a histogram.
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tenax_core::{AttemptRecord, TaskId, TaskRecord};
use tenax_storage::{
    AuditAppendParams, AuditListParams, AuditRecord, CancelRequestedParams, Capabilities,
    FiredTick, Lease, LeaseExtendParams, NextRun, QueueBacklog, QueueBacklogParams, QueueInfo,
    QueueStats, QueueStatsParams, QueueUpdateParams, RateLimit, RateLimitSetParams, ReapedTask,
    Result, ScheduleFireParams, SchedulePauseParams, ScheduleRecord, ScheduleUpsertParams,
    ScheduleUpserted, Stats, Storage, TaskActionParams, TaskBulkOutcome, TaskBulkParams,
    TaskClaimParams, TaskCompleteParams, TaskFailParams, TaskInsertParams, TaskInserted,
    TaskListParams, TaskNextRunParams, TaskPruneParams, TaskReapParams, TaskRef, WakeReceiver,
};

use super::names;

/// Wraps a storage so that every database call is timed into
/// `tenax_storage_call_duration_seconds{method, outcome}`. Give the wrapped storage to
/// the [`Worker`](crate::Worker) (and the [`sampler_loop`](super::sampler_loop)).
pub struct InstrumentedStorage {
    inner: Arc<dyn Storage>,
}

/// Wrap `storage` so every call is timed (see [`InstrumentedStorage`]).
pub fn instrument(storage: Arc<dyn Storage>) -> Arc<dyn Storage> {
    Arc::new(InstrumentedStorage { inner: storage })
}

async fn timed<T>(method: &'static str, call: impl Future<Output = Result<T>>) -> Result<T> {
    let start = Instant::now();
    let result = call.await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ::metrics::histogram!(names::STORAGE_CALL, "method" => method, "outcome" => outcome)
        .record(start.elapsed().as_secs_f64());
    result
}

#[async_trait]
impl Storage for InstrumentedStorage {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn migrate(&self) -> Result<()> {
        timed("migrate", self.inner.migrate()).await
    }
    async fn now(&self) -> Result<DateTime<Utc>> {
        timed("now", self.inner.now()).await
    }
    fn wakeups(&self) -> WakeReceiver {
        self.inner.wakeups()
    }
    fn finishes(&self) -> Option<tenax_storage::FinishReceiver> {
        self.inner.finishes()
    }
    async fn task_wait_begin(&self, id: TaskId) -> Result<Option<String>> {
        timed("task_wait_begin", self.inner.task_wait_begin(id)).await
    }
    async fn task_wait_end(&self, waiter: &str) -> Result<()> {
        timed("task_wait_end", self.inner.task_wait_end(waiter)).await
    }
    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
        timed("task_insert", self.inner.task_insert(params)).await
    }
    async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>> {
        timed("task_get", self.inner.task_get(task)).await
    }
    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        timed("task_list", self.inner.task_list(params)).await
    }
    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
        timed("task_attempts", self.inner.task_attempts(id)).await
    }
    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        timed("task_claim_batch", self.inner.task_claim_batch(params)).await
    }
    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        timed("lease_extend", self.inner.lease_extend(params)).await
    }
    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
        timed(
            "task_complete_if_leased",
            self.inner.task_complete_if_leased(params),
        )
        .await
    }
    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        timed(
            "task_fail_if_leased",
            self.inner.task_fail_if_leased(params),
        )
        .await
    }
    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        timed("task_reap_expired", self.inner.task_reap_expired(params)).await
    }
    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        timed("task_cancel", self.inner.task_cancel(params)).await
    }
    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        timed("task_retry", self.inner.task_retry(params)).await
    }
    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
        timed("task_prune", self.inner.task_prune(params)).await
    }
    async fn side_prune(
        &self,
        params: &tenax_storage::SidePruneParams,
    ) -> Result<tenax_storage::SidePruned> {
        timed("side_prune", self.inner.side_prune(params)).await
    }
    async fn stats(&self) -> Result<Stats> {
        timed("stats", self.inner.stats()).await
    }
    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
        timed("task_next_run_at", self.inner.task_next_run_at(params)).await
    }
    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
        timed("queue_backlog", self.inner.queue_backlog(params)).await
    }
    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        timed(
            "task_cancel_requested",
            self.inner.task_cancel_requested(params),
        )
        .await
    }
    async fn schedule_upsert(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        timed("schedule_upsert", self.inner.schedule_upsert(params)).await
    }
    async fn schedule_list(&self) -> Result<Vec<ScheduleRecord>> {
        timed("schedule_list", self.inner.schedule_list()).await
    }
    async fn schedule_set_paused(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord> {
        timed(
            "schedule_set_paused",
            self.inner.schedule_set_paused(params),
        )
        .await
    }
    async fn schedule_remove(&self, name: &str) -> Result<()> {
        timed("schedule_remove", self.inner.schedule_remove(name)).await
    }
    async fn schedule_fire_due(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>> {
        timed("schedule_fire_due", self.inner.schedule_fire_due(params)).await
    }
    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        timed("queue_list", self.inner.queue_list()).await
    }
    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        timed("queue_update", self.inner.queue_update(params)).await
    }
    async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit> {
        timed("rate_limit_set", self.inner.rate_limit_set(params)).await
    }
    async fn rate_limit_list(&self) -> Result<Vec<RateLimit>> {
        timed("rate_limit_list", self.inner.rate_limit_list()).await
    }
    async fn rate_limit_remove(&self, command_type: &str) -> Result<()> {
        timed(
            "rate_limit_remove",
            self.inner.rate_limit_remove(command_type),
        )
        .await
    }
    async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>> {
        timed("queue_stats", self.inner.queue_stats(params)).await
    }
    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        timed("task_bulk", self.inner.task_bulk(params)).await
    }
    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        timed("audit_append", self.inner.audit_append(params)).await
    }
    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        timed("audit_list", self.inner.audit_list(params)).await
    }
    async fn task_insert_many(
        &self,
        params: &tenax_storage::TaskInsertManyParams,
    ) -> Result<Vec<tenax_storage::TaskInsertOutcome>> {
        timed("task_insert_many", self.inner.task_insert_many(params)).await
    }
    async fn task_insert_many_if(
        &self,
        params: &tenax_storage::TaskInsertManyParams,
        accept: &tenax_storage::InsertAccept<'_>,
    ) -> Result<tenax_storage::TaskInsertManyChecked> {
        timed(
            "task_insert_many_if",
            self.inner.task_insert_many_if(params, accept),
        )
        .await
    }
    async fn workflow_insert(
        &self,
        params: &tenax_storage::WorkflowInsertParams,
    ) -> Result<tenax_storage::WorkflowDetail> {
        timed("workflow_insert", self.inner.workflow_insert(params)).await
    }
    async fn workflow_get(
        &self,
        id: tenax_storage::WorkflowId,
    ) -> Result<Option<tenax_storage::WorkflowDetail>> {
        timed("workflow_get", self.inner.workflow_get(id)).await
    }
    async fn workflow_list(
        &self,
        params: &tenax_storage::WorkflowListParams,
    ) -> Result<Vec<tenax_storage::WorkflowRecord>> {
        timed("workflow_list", self.inner.workflow_list(params)).await
    }
    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<tenax_storage::ParentOutcome>> {
        timed("task_parent_results", self.inner.task_parent_results(id)).await
    }
    async fn outbox_claim(
        &self,
        params: &tenax_storage::OutboxClaimParams,
    ) -> Result<Vec<tenax_storage::OutboxRecord>> {
        timed("outbox_claim", self.inner.outbox_claim(params)).await
    }
    async fn outbox_settle(&self, params: &tenax_storage::OutboxSettleParams) -> Result<u64> {
        timed("outbox_settle", self.inner.outbox_settle(params)).await
    }
    async fn outbox_list(
        &self,
        params: &tenax_storage::OutboxListParams,
    ) -> Result<Vec<tenax_storage::OutboxRecord>> {
        timed("outbox_list", self.inner.outbox_list(params)).await
    }
    async fn alert_transition(
        &self,
        params: &tenax_storage::AlertTransitionParams,
    ) -> Result<bool> {
        timed("alert_transition", self.inner.alert_transition(params)).await
    }
    async fn outbox_senders_seen(&self, params: &tenax_storage::OutboxSendersParams) -> Result<()> {
        timed(
            "outbox_senders_seen",
            self.inner.outbox_senders_seen(params),
        )
        .await
    }

    async fn outbox_prune(&self, params: &tenax_storage::OutboxPruneParams) -> Result<u64> {
        timed("outbox_prune", self.inner.outbox_prune(params)).await
    }

    async fn task_workflow(&self, id: TaskId) -> Result<Option<tenax_storage::WorkflowId>> {
        timed("task_workflow", self.inner.task_workflow(id)).await
    }

    async fn task_list_finished(
        &self,
        params: &tenax_storage::TaskListFinishedParams,
    ) -> Result<Vec<TaskRecord>> {
        timed("task_list_finished", self.inner.task_list_finished(params)).await
    }
    async fn task_complete_many_if_leased(
        &self,
        params: &[TaskCompleteParams],
    ) -> Result<Vec<tenax_storage::BatchCompletion>> {
        timed(
            "task_complete_many_if_leased",
            self.inner.task_complete_many_if_leased(params),
        )
        .await
    }

    async fn outbox_stats(
        &self,
        params: &tenax_storage::OutboxStatsParams,
    ) -> Result<Vec<tenax_storage::OutboxStat>> {
        timed("outbox_stats", self.inner.outbox_stats(params)).await
    }

    async fn task_due_count(
        &self,
        params: &tenax_storage::TaskDueCountParams,
    ) -> Result<tenax_storage::DueCount> {
        timed("task_due_count", self.inner.task_due_count(params)).await
    }

    async fn event_rule_set(&self, params: &tenax_storage::EventRuleParams) -> Result<bool> {
        timed("event_rule_set", self.inner.event_rule_set(params)).await
    }
    async fn event_rule_list(&self) -> Result<Vec<tenax_storage::EventRule>> {
        timed("event_rule_list", self.inner.event_rule_list()).await
    }
    async fn event_lease(
        &self,
        params: &tenax_storage::EventLeaseParams,
    ) -> Result<Option<tenax_storage::EventLease>> {
        timed("event_lease", self.inner.event_lease(params)).await
    }
    async fn event_sequence(
        &self,
        params: &tenax_storage::EventSequenceParams,
    ) -> Result<Option<u64>> {
        timed("event_sequence", self.inner.event_sequence(params)).await
    }
    async fn event_cursor_advance(
        &self,
        params: &tenax_storage::EventCursorParams,
    ) -> Result<bool> {
        timed(
            "event_cursor_advance",
            self.inner.event_cursor_advance(params),
        )
        .await
    }
    async fn event_list(
        &self,
        params: &tenax_storage::EventListParams,
    ) -> Result<tenax_storage::EventPage> {
        timed("event_list", self.inner.event_list(params)).await
    }
    async fn event_prune(&self, params: &tenax_storage::EventPruneParams) -> Result<u64> {
        timed("event_prune", self.inner.event_prune(params)).await
    }
}
