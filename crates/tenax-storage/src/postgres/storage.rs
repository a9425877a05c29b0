//! The [`Storage`](crate::Storage) trait on PostgreSQL: each method forwards to the file of
//! this folder that holds its statements (`claim.rs`, `outcomes.rs`, `actions.rs`, ...),
//! or, for a workflow, to the logic written once in `crate::flow`.
#[allow(clippy::wildcard_imports)]
use super::*;

#[async_trait]
impl Storage for PgStorage {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cross_process_wakeups: self.listener.is_some(),
        }
    }

    async fn migrate(&self) -> Result<()> {
        if let Some(schema) = &self.schema {
            // The name was validated in take_schema: [a-z0-9_] only.
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .execute(&self.pool)
                .await
                .map_err(map_err)?;
        }
        // sqlx takes an advisory lock: N nodes starting together migrate once.
        migrator()
            .run(&self.pool)
            .await
            .map_err(|e| StorageError::Migration(e.to_string()))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        self.timed(async {
            sqlx::query_scalar("SELECT now()")
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)
        })
        .await
    }

    fn wakeups(&self) -> WakeReceiver {
        self.wake.subscribe()
    }

    fn finishes(&self) -> Option<crate::FinishReceiver> {
        self.listener.as_ref().map(|_| self.finished.subscribe())
    }

    async fn task_wait_begin(&self, id: TaskId) -> Result<Option<String>> {
        if self.listener.is_none() {
            return Ok(None);
        }
        self.timed(waits::begin(&self.pool, id)).await.map(Some)
    }

    async fn task_wait_end(&self, waiter: &str) -> Result<()> {
        self.timed(waits::end(&self.pool, waiter)).await
    }

    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
        validate_insert(params)?;
        let mut outcomes = self
            .insert_committed(std::slice::from_ref(params), params.now)
            .await?;
        outcomes
            .pop()
            .ok_or_else(|| StorageError::NotFound(params.task_no.to_string()))?
            .into_inserted()
    }

    async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>> {
        self.timed(fetch_ref(&self.pool, task)).await
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        self.timed(async {
            let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
            let rows = sqlx::query(&format!(
                "SELECT {columns} FROM tenax_tasks
                 WHERE ($1::text IS NULL OR status = $1)
                   AND ($2::text IS NULL OR command_type = $2)
                   AND ($3::text IS NULL OR queue = $3)
                   AND ($4::bigint IS NULL OR id < $4)
                   AND ($6::timestamptz IS NULL OR started_at < $6)
                   AND ($7::timestamptz IS NULL OR created_at >= $7)
                   AND ($8::timestamptz IS NULL OR created_at < $8)
                 ORDER BY id DESC
                 LIMIT $5"
            ))
            .bind(params.status.map(TaskStatus::as_str))
            .bind(params.command_type.as_deref())
            .bind(params.queue.as_deref())
            .bind(params.before_id.map(|id| id.0))
            .bind(i64::from(params.limit))
            .bind(params.started_before)
            .bind(params.created_after)
            .bind(params.created_before)
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(task_from_row).collect()
        })
        .await
    }

    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
        self.timed(async {
            let rows = sqlx::query(
                "SELECT task_id, epoch, attempt, worker, started_at, finished_at, outcome, error
                 FROM tenax_attempts WHERE task_id = $1 ORDER BY epoch",
            )
            .bind(id.0)
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(attempt_from_row).collect()
        })
        .await
    }

    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        if offers_nothing(params) {
            return Ok(Vec::new());
        }
        self.timed(crate::rates::claim(self, params)).await
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        self.timed(runtime::lease_extend(&self.leases, params))
            .await
    }

    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
        let params = &*crate::common::storable_completion(params);
        self.complete_impl(params).await
    }

    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        self.fail_impl(params).await
    }

    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        self.reap_impl(params).await
    }

    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.cancel_impl(params).await
    }

    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.retry_impl(params).await
    }

    async fn side_prune(&self, params: &crate::SidePruneParams) -> Result<crate::SidePruned> {
        self.side_prune_impl(params).await
    }

    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
        self.prune_impl(params).await
    }

    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.timed(self.queue_list_impl()).await
    }

    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        self.timed(self.queue_update_impl(params)).await
    }

    async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit> {
        self.rate_limit_set_impl(params).await
    }

    async fn rate_limit_list(&self) -> Result<Vec<RateLimit>> {
        self.rate_limit_list_impl().await
    }

    async fn rate_limit_remove(&self, command_type: &str) -> Result<()> {
        self.rate_limit_remove_impl(command_type).await
    }

    async fn task_insert_many(
        &self,
        params: &TaskInsertManyParams,
    ) -> Result<Vec<TaskInsertOutcome>> {
        crate::common::validate_many(&params.tasks)?;
        self.insert_committed(&params.tasks, params.now).await
    }

    async fn task_insert_many_if(
        &self,
        params: &TaskInsertManyParams,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        crate::common::validate_many(&params.tasks)?;
        self.insert_checked(&params.tasks, params.now, accept).await
    }

    async fn workflow_insert(&self, params: &WorkflowInsertParams) -> Result<WorkflowDetail> {
        self.timed(async {
            let mut tx = self.begin().await?;
            let detail = flow::insert(&mut *tx, params).await?;
            tx.commit().await.map_err(map_err)?;
            self.wake();
            Ok(detail)
        })
        .await
    }

    async fn workflow_get(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>> {
        self.timed(async {
            let mut conn = self.pool.acquire().await.map_err(map_err)?;
            flow::get(&mut *conn, id).await
        })
        .await
    }

    async fn workflow_list(&self, params: &WorkflowListParams) -> Result<Vec<WorkflowRecord>> {
        self.timed(async {
            let mut conn = self.pool.acquire().await.map_err(map_err)?;
            flow::list(&mut *conn, params).await
        })
        .await
    }

    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<ParentOutcome>> {
        self.timed(async {
            let mut conn = self.pool.acquire().await.map_err(map_err)?;
            workflows::parent_results(&mut conn, id).await
        })
        .await
    }

    async fn outbox_claim(&self, params: &OutboxClaimParams) -> Result<Vec<OutboxRecord>> {
        self.timed(self.outbox_claim_impl(params)).await
    }

    async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64> {
        self.timed(self.outbox_settle_impl(params)).await
    }

    async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>> {
        self.timed(self.outbox_list_impl(params)).await
    }

    async fn alert_transition(&self, params: &crate::AlertTransitionParams) -> Result<bool> {
        self.timed(self.alert_transition_impl(params)).await
    }

    async fn outbox_senders_seen(&self, params: &crate::OutboxSendersParams) -> Result<()> {
        self.timed(self.outbox_senders_seen_impl(params)).await
    }

    async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64> {
        self.timed(self.outbox_prune_impl(params)).await
    }
    async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>> {
        self.timed(async {
            let mut conn = self.pool.acquire().await.map_err(map_err)?;
            workflows::task_workflow(&mut conn, id).await
        })
        .await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        self.timed(async {
            // The status list repeats the finished-task index's condition.
            // Only times and statuses are charted: payloads and results stay in the database.
            let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
            let rows = sqlx::query(&format!(
                "SELECT {columns} FROM tenax_tasks
                 WHERE status IN ('succeeded', 'dead', 'cancelled') AND status <> 'cancelled'
                   AND finished_at >= $1
                 ORDER BY finished_at DESC
                 LIMIT $2"
            ))
            .bind(params.since)
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(task_from_row).collect()
        })
        .await
    }

    async fn task_complete_many_if_leased(
        &self,
        params: &[TaskCompleteParams],
    ) -> Result<Vec<BatchCompletion>> {
        let params = &*crate::common::storable_completions(params);
        self.complete_many_impl(params).await
    }

    async fn outbox_stats(
        &self,
        params: &crate::OutboxStatsParams,
    ) -> Result<Vec<crate::OutboxStat>> {
        self.timed(self.outbox_stats_impl(params)).await
    }

    async fn stats(&self) -> Result<Stats> {
        self.timed(queue_stats::stats(&self.pool)).await
    }

    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
        self.timed(runtime::next_run_at(&self.pool, params)).await
    }

    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
        self.timed(runtime::queue_backlog(&self.pool, params)).await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        self.timed(runtime::cancel_requested(&self.leases, params))
            .await
    }

    async fn schedule_upsert(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        self.schedule_upsert_tx(params).await
    }

    async fn schedule_list(&self) -> Result<Vec<ScheduleRecord>> {
        self.schedule_list_all().await
    }

    async fn schedule_set_paused(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord> {
        self.schedule_pause_tx(params).await
    }

    async fn schedule_remove(&self, name: &str) -> Result<()> {
        self.schedule_delete(name).await
    }

    async fn schedule_fire_due(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>> {
        self.schedule_fire_tx(params).await
    }

    async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>> {
        self.timed(queue_stats::queue_stats(&self.pool, params.now))
            .await
    }
    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        self.task_bulk_impl(params).await
    }

    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        self.audit_append_impl(params).await
    }

    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        self.audit_list_impl(params).await
    }

    async fn task_due_count(&self, params: &crate::TaskDueCountParams) -> Result<crate::DueCount> {
        self.timed(runtime::due_count(&self.pool, params)).await
    }

    async fn event_rule_set(&self, params: &crate::EventRuleParams) -> Result<bool> {
        self.timed(self.event_rule_set_impl(params)).await
    }

    async fn event_rule_list(&self) -> Result<Vec<crate::EventRule>> {
        self.timed(self.event_rule_list_impl()).await
    }

    async fn event_lease(
        &self,
        params: &crate::EventLeaseParams,
    ) -> Result<Option<crate::EventLease>> {
        self.timed(self.event_lease_impl(params)).await
    }

    async fn event_sequence(&self, params: &crate::EventSequenceParams) -> Result<Option<u64>> {
        self.timed(self.event_sequence_impl(params)).await
    }

    async fn event_cursor_advance(&self, params: &crate::EventCursorParams) -> Result<bool> {
        self.timed(self.event_cursor_advance_impl(params)).await
    }

    async fn event_list(&self, params: &crate::EventListParams) -> Result<crate::EventPage> {
        self.timed(self.event_list_impl(params)).await
    }

    async fn event_prune(&self, params: &crate::EventPruneParams) -> Result<u64> {
        self.timed(self.event_prune_impl(params)).await
    }
}
