//! A storage wrapper that fails chosen methods on demand: the unit of fault injection.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tenax_core::{AttemptRecord, TaskId, TaskRecord};

use crate::{
    AuditAppendParams, AuditListParams, AuditRecord, Capabilities, LeaseExtendParams, QueueInfo,
    QueueUpdateParams, RateLimit, RateLimitSetParams, ReapedTask, Result, Stats, Storage,
    StorageError, TaskActionParams, TaskBulkOutcome, TaskBulkParams, TaskClaimParams,
    TaskCompleteParams, TaskFailParams, TaskInsertParams, TaskInserted, TaskListParams,
    TaskPruneParams, TaskReapParams, TaskRef, WakeReceiver,
};

/// Methods that [`FaultyStorage`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageMethod {
    Claim,
    LeaseExtend,
    Complete,
    Fail,
    Reap,
}

/// Wraps a storage; methods switched on with [`FaultyStorage::fail`] return a transient
/// error until switched off, and outcomes holding a text set with
/// [`FaultyStorage::refuse_outcomes_holding`] are refused for good, as a database
/// refuses a value it cannot store.
pub struct FaultyStorage {
    inner: Arc<dyn Storage>,
    failing: Mutex<HashSet<StorageMethod>>,
    refused: Mutex<Option<String>>,
    /// Calls of `task_get` so far.
    task_gets: std::sync::atomic::AtomicU64,
}

impl FaultyStorage {
    pub fn new(inner: Arc<dyn Storage>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            failing: Mutex::new(HashSet::new()),
            refused: Mutex::new(None),
            task_gets: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// How many times `task_get` was called (what a long-poll costs the database).
    pub fn task_gets(&self) -> u64 {
        self.task_gets.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Make `method` fail (`true`) or work (`false`).
    pub fn fail(&self, method: StorageMethod, failing: bool) {
        let mut set = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if failing {
            set.insert(method);
        } else {
            set.remove(&method);
        }
    }

    /// Refuse (with a permanent error) every completion whose result, and every
    /// failure whose error, holds `text`.
    pub fn refuse_outcomes_holding(&self, text: &str) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(text.to_owned());
    }

    fn check_text(&self, text: Option<&str>) -> Result<()> {
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        match (refused.as_deref(), text) {
            (Some(bad), Some(text)) if text.contains(bad) => Err(StorageError::Database(
                format!("injected refusal of a value holding {bad:?}").into(),
            )),
            _ => Ok(()),
        }
    }

    fn check(&self, method: StorageMethod) -> Result<()> {
        let set = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if set.contains(&method) {
            return Err(StorageError::Transient(
                format!("injected fault in {method:?}").into(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Storage for FaultyStorage {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }
    async fn now(&self) -> Result<DateTime<Utc>> {
        self.inner.now().await
    }
    fn wakeups(&self) -> WakeReceiver {
        self.inner.wakeups()
    }
    fn finishes(&self) -> Option<crate::FinishReceiver> {
        self.inner.finishes()
    }
    async fn task_wait_begin(&self, id: TaskId) -> Result<Option<String>> {
        self.inner.task_wait_begin(id).await
    }
    async fn task_wait_end(&self, waiter: &str) -> Result<()> {
        self.inner.task_wait_end(waiter).await
    }
    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
        self.inner.task_insert(params).await
    }
    async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>> {
        self.task_gets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.task_get(task).await
    }
    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        self.inner.task_list(params).await
    }
    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
        self.inner.task_attempts(id).await
    }
    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        self.check(StorageMethod::Claim)?;
        self.inner.task_claim_batch(params).await
    }
    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<crate::Lease>> {
        self.check(StorageMethod::LeaseExtend)?;
        self.inner.lease_extend(params).await
    }
    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
        self.check(StorageMethod::Complete)?;
        self.check_text(params.result.as_deref())?;
        self.inner.task_complete_if_leased(params).await
    }
    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        self.check(StorageMethod::Fail)?;
        self.check_text(Some(&params.error))?;
        self.inner.task_fail_if_leased(params).await
    }
    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        self.check(StorageMethod::Reap)?;
        self.inner.task_reap_expired(params).await
    }
    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.inner.task_cancel(params).await
    }
    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.inner.task_retry(params).await
    }
    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
        self.inner.task_prune(params).await
    }
    async fn side_prune(&self, params: &crate::SidePruneParams) -> Result<crate::SidePruned> {
        self.inner.side_prune(params).await
    }
    async fn stats(&self) -> Result<Stats> {
        self.inner.stats().await
    }
    async fn task_next_run_at(
        &self,
        params: &crate::TaskNextRunParams,
    ) -> Result<Option<crate::NextRun>> {
        self.inner.task_next_run_at(params).await
    }
    async fn queue_backlog(
        &self,
        params: &crate::QueueBacklogParams,
    ) -> Result<Vec<crate::QueueBacklog>> {
        self.inner.queue_backlog(params).await
    }
    async fn task_cancel_requested(
        &self,
        params: &crate::CancelRequestedParams,
    ) -> Result<Vec<crate::Lease>> {
        self.inner.task_cancel_requested(params).await
    }
    async fn schedule_upsert(
        &self,
        params: &crate::ScheduleUpsertParams,
    ) -> Result<(crate::ScheduleRecord, crate::ScheduleUpserted)> {
        self.inner.schedule_upsert(params).await
    }
    async fn schedule_list(&self) -> Result<Vec<crate::ScheduleRecord>> {
        self.inner.schedule_list().await
    }
    async fn schedule_set_paused(
        &self,
        params: &crate::SchedulePauseParams,
    ) -> Result<crate::ScheduleRecord> {
        self.inner.schedule_set_paused(params).await
    }
    async fn schedule_remove(&self, name: &str) -> Result<()> {
        self.inner.schedule_remove(name).await
    }
    async fn schedule_fire_due(
        &self,
        params: &crate::ScheduleFireParams,
    ) -> Result<Vec<crate::FiredTick>> {
        self.inner.schedule_fire_due(params).await
    }
    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.inner.queue_list().await
    }
    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        self.inner.queue_update(params).await
    }
    async fn queue_stats(
        &self,
        params: &crate::QueueStatsParams,
    ) -> Result<Vec<crate::QueueStats>> {
        self.inner.queue_stats(params).await
    }
    async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit> {
        self.inner.rate_limit_set(params).await
    }
    async fn rate_limit_list(&self) -> Result<Vec<RateLimit>> {
        self.inner.rate_limit_list().await
    }
    async fn rate_limit_remove(&self, command_type: &str) -> Result<()> {
        self.inner.rate_limit_remove(command_type).await
    }
    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        self.inner.task_bulk(params).await
    }
    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        self.inner.audit_append(params).await
    }
    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        self.inner.audit_list(params).await
    }
    async fn task_insert_many(
        &self,
        params: &crate::TaskInsertManyParams,
    ) -> Result<Vec<crate::TaskInsertOutcome>> {
        self.inner.task_insert_many(params).await
    }
    async fn task_insert_many_if(
        &self,
        params: &crate::TaskInsertManyParams,
        accept: &crate::InsertAccept<'_>,
    ) -> Result<crate::TaskInsertManyChecked> {
        self.inner.task_insert_many_if(params, accept).await
    }
    async fn workflow_insert(
        &self,
        params: &crate::WorkflowInsertParams,
    ) -> Result<crate::WorkflowDetail> {
        self.inner.workflow_insert(params).await
    }
    async fn workflow_get(&self, id: crate::WorkflowId) -> Result<Option<crate::WorkflowDetail>> {
        self.inner.workflow_get(id).await
    }
    async fn workflow_list(
        &self,
        params: &crate::WorkflowListParams,
    ) -> Result<Vec<crate::WorkflowRecord>> {
        self.inner.workflow_list(params).await
    }
    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<crate::ParentOutcome>> {
        self.inner.task_parent_results(id).await
    }
    async fn outbox_claim(
        &self,
        params: &crate::OutboxClaimParams,
    ) -> Result<Vec<crate::OutboxRecord>> {
        self.inner.outbox_claim(params).await
    }
    async fn outbox_settle(&self, params: &crate::OutboxSettleParams) -> Result<u64> {
        self.inner.outbox_settle(params).await
    }
    async fn outbox_list(
        &self,
        params: &crate::OutboxListParams,
    ) -> Result<Vec<crate::OutboxRecord>> {
        self.inner.outbox_list(params).await
    }
    async fn alert_transition(&self, params: &crate::AlertTransitionParams) -> Result<bool> {
        self.inner.alert_transition(params).await
    }
    async fn outbox_senders_seen(&self, params: &crate::OutboxSendersParams) -> Result<()> {
        self.inner.outbox_senders_seen(params).await
    }

    async fn outbox_prune(&self, params: &crate::OutboxPruneParams) -> Result<u64> {
        self.inner.outbox_prune(params).await
    }
    async fn task_workflow(&self, id: TaskId) -> Result<Option<crate::WorkflowId>> {
        self.inner.task_workflow(id).await
    }
    async fn task_list_finished(
        &self,
        params: &crate::TaskListFinishedParams,
    ) -> Result<Vec<TaskRecord>> {
        self.inner.task_list_finished(params).await
    }
    async fn task_complete_many_if_leased(
        &self,
        params: &[TaskCompleteParams],
    ) -> Result<Vec<crate::BatchCompletion>> {
        // The batch fails with the one-task completion: a test that breaks completions
        // breaks both paths.
        self.check(StorageMethod::Complete)?;
        for p in params {
            self.check_text(p.result.as_deref())?;
        }
        self.inner.task_complete_many_if_leased(params).await
    }

    async fn outbox_stats(
        &self,
        params: &crate::OutboxStatsParams,
    ) -> Result<Vec<crate::OutboxStat>> {
        self.inner.outbox_stats(params).await
    }

    async fn task_due_count(&self, params: &crate::TaskDueCountParams) -> Result<crate::DueCount> {
        // Asked before a batch's claim: it fails with the claim.
        self.check(StorageMethod::Claim)?;
        self.inner.task_due_count(params).await
    }

    async fn event_rule_set(&self, params: &crate::EventRuleParams) -> Result<bool> {
        self.inner.event_rule_set(params).await
    }
    async fn event_rule_list(&self) -> Result<Vec<crate::EventRule>> {
        self.inner.event_rule_list().await
    }
    async fn event_lease(
        &self,
        params: &crate::EventLeaseParams,
    ) -> Result<Option<crate::EventLease>> {
        self.inner.event_lease(params).await
    }
    async fn event_sequence(&self, params: &crate::EventSequenceParams) -> Result<Option<u64>> {
        self.inner.event_sequence(params).await
    }
    async fn event_cursor_advance(&self, params: &crate::EventCursorParams) -> Result<bool> {
        self.inner.event_cursor_advance(params).await
    }
    async fn event_list(&self, params: &crate::EventListParams) -> Result<crate::EventPage> {
        self.inner.event_list(params).await
    }
    async fn event_prune(&self, params: &crate::EventPruneParams) -> Result<u64> {
        self.inner.event_prune(params).await
    }
}
