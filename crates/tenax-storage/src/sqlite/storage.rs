//! The [`Storage`](crate::Storage) trait on SQLite: each method forwards to the file of
//! this folder that holds its statements (`claim.rs`, `outcomes.rs`, `actions.rs`, ...),
//! or, for a workflow, to the logic written once in `crate::flow`.
#[allow(clippy::wildcard_imports)]
use super::*;

#[async_trait]
impl Storage for SqliteStorage {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cross_process_wakeups: self.wake.cross_process(),
        }
    }

    async fn migrate(&self) -> Result<()> {
        // Two processes starting on a fresh file may race; the loser sees the winner's
        // migrations on its next try.
        let mut last = None;
        for _ in 0..5 {
            match migrator().run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Err(StorageError::Migration(
            last.map(|e| e.to_string()).unwrap_or_default(),
        ))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        let now: i64 = sqlx::query_scalar(NOW_MS)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        ms(now)
    }

    fn wakeups(&self) -> WakeReceiver {
        self.wake.subscribe()
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
        fetch_ref(&self.pool, task).await
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE (?1 IS NULL OR status = ?1)
               AND (?2 IS NULL OR command_type = ?2)
               AND (?3 IS NULL OR queue = ?3)
               AND (?4 IS NULL OR id < ?4)
               AND (?6 IS NULL OR started_at < ?6)
               AND (?7 IS NULL OR created_at >= ?7)
               AND (?8 IS NULL OR created_at < ?8)
             ORDER BY id DESC
             LIMIT ?5"
        ))
        .bind(params.status.map(TaskStatus::as_str))
        .bind(params.command_type.as_deref())
        .bind(params.queue.as_deref())
        .bind(params.before_id.map(|id| id.0))
        .bind(i64::from(params.limit))
        .bind(params.started_before.map(|t| t.timestamp_millis()))
        .bind(params.created_after.map(|t| t.timestamp_millis()))
        .bind(params.created_before.map(|t| t.timestamp_millis()))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }

    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
        let rows = sqlx::query(
            "SELECT task_id, epoch, attempt, worker, started_at, finished_at, outcome, error
             FROM tenax_attempts WHERE task_id = ? ORDER BY epoch",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(rows::attempt_from_row).collect()
    }

    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        if offers_nothing(params) {
            return Ok(Vec::new());
        }
        crate::rates::claim(self, params).await
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        let pairs = json_list(
            &params
                .leases
                .iter()
                .map(|l| [l.id.0, l.epoch])
                .collect::<Vec<_>>(),
        );
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let renewed: Vec<(i64, i64)> = sqlx::query_as(
            "UPDATE tenax_tasks SET lease_expires_at = ?1 + ?2, updated_at = ?1
             WHERE status = 'running'
               AND (id, lease_epoch) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                         FROM json_each(?3))
             RETURNING id, lease_epoch",
        )
        .bind(now)
        .bind(duration_ms(params.lease_ttl))
        .bind(pairs)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(renewed
            .into_iter()
            .map(|(id, epoch)| Lease {
                id: TaskId(id),
                epoch,
            })
            .collect())
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

    async fn stats(&self) -> Result<Stats> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let by_type_rows = sqlx::query(
            "SELECT command_type, status, COUNT(*) AS n FROM tenax_tasks
             GROUP BY command_type, status ORDER BY command_type, status",
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        let mut stats = Stats::default();
        for row in &by_type_rows {
            let command_type: String = row.try_get("command_type").map_err(map_err)?;
            let status: String = row.try_get("status").map_err(map_err)?;
            let status: TaskStatus = status.parse()?;
            let n: i64 = row.try_get("n").map_err(map_err)?;
            let n = u64::try_from(n).unwrap_or(0);
            stats.by_type.push((command_type, status, n));
            match stats.by_status.iter_mut().find(|(s, _)| *s == status) {
                Some((_, total)) => *total += n,
                None => stats.by_status.push((status, n)),
            }
        }
        stats.by_status.sort();
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) - MIN(run_at) FROM tenax_tasks
             WHERE status IN ('pending', 'retrying')
               AND run_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        stats.oldest_due_age =
            oldest.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        Ok(stats)
    }

    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
        runtime::next_run_at(&self.pool, params).await
    }

    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
        runtime::queue_backlog(&self.pool, params).await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        runtime::cancel_requested(&self.pool, params).await
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

    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.queue_list_impl().await
    }

    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        self.queue_update_impl(params).await
    }

    async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>> {
        queue_stats::queue_stats(&self.pool, params.now).await
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

    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        self.task_bulk_impl(params).await
    }

    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        self.audit_append_impl(params).await
    }

    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        self.audit_list_impl(params).await
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
        let mut tx = self.begin().await?;
        let detail = flow::insert(&mut *tx, params).await?;
        tx.commit().await.map_err(map_err)?;
        self.wake();
        Ok(detail)
    }

    async fn workflow_get(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        flow::get(&mut *conn, id).await
    }

    async fn workflow_list(&self, params: &WorkflowListParams) -> Result<Vec<WorkflowRecord>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        flow::list(&mut *conn, params).await
    }

    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<ParentOutcome>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::parent_results(&mut conn, id).await
    }

    async fn outbox_claim(&self, params: &OutboxClaimParams) -> Result<Vec<OutboxRecord>> {
        self.outbox_claim_impl(params).await
    }

    async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64> {
        self.outbox_settle_impl(params).await
    }

    async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>> {
        self.outbox_list_impl(params).await
    }

    async fn alert_transition(&self, params: &crate::AlertTransitionParams) -> Result<bool> {
        self.alert_transition_impl(params).await
    }

    async fn outbox_senders_seen(&self, params: &crate::OutboxSendersParams) -> Result<()> {
        self.outbox_senders_seen_impl(params).await
    }

    async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64> {
        self.outbox_prune_impl(params).await
    }
    async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::task_workflow(&mut conn, id).await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        // The status list repeats the finished-task index's condition, so SQLite uses it.
        // Only times and statuses are charted: payloads and results stay in the database.
        let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE status IN ('succeeded', 'dead', 'cancelled') AND status <> 'cancelled'
               AND finished_at >= ?
             ORDER BY finished_at DESC
             LIMIT ?"
        ))
        .bind(params.since.timestamp_millis())
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
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
        self.outbox_stats_impl(params).await
    }

    async fn task_due_count(&self, params: &crate::TaskDueCountParams) -> Result<crate::DueCount> {
        runtime::due_count(&self.pool, params).await
    }

    async fn event_rule_set(&self, params: &crate::EventRuleParams) -> Result<bool> {
        self.event_rule_set_impl(params).await
    }

    async fn event_rule_list(&self) -> Result<Vec<crate::EventRule>> {
        self.event_rule_list_impl().await
    }

    async fn event_lease(
        &self,
        params: &crate::EventLeaseParams,
    ) -> Result<Option<crate::EventLease>> {
        self.event_lease_impl(params).await
    }

    async fn event_sequence(&self, params: &crate::EventSequenceParams) -> Result<Option<u64>> {
        self.event_sequence_impl(params).await
    }

    async fn event_cursor_advance(&self, params: &crate::EventCursorParams) -> Result<bool> {
        self.event_cursor_advance_impl(params).await
    }

    async fn event_list(&self, params: &crate::EventListParams) -> Result<crate::EventPage> {
        self.event_list_impl(params).await
    }

    async fn event_prune(&self, params: &crate::EventPruneParams) -> Result<u64> {
        self.event_prune_impl(params).await
    }
}
