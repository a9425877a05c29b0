//! The [`Storage`](crate::Storage) trait on MariaDB/MySQL: each method forwards to the file of
//! this folder that holds its statements (`claim.rs`, `outcomes.rs`, `actions.rs`, ...),
//! or, for a workflow, to the logic written once in `crate::flow`.
#[allow(clippy::wildcard_imports)]
use super::*;

#[async_trait]
impl Storage for MySqlStorage {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cross_process_wakeups: self.wake.cross_process(),
        }
    }

    async fn migrate(&self) -> Result<()> {
        self.check_trigger_privilege().await?;
        // sqlx's MySQL migrator holds GET_LOCK while it migrates: nodes starting
        // together migrate once, the others wait and find the work done.
        migrator()
            .run(&self.pool)
            .await
            .map_err(|e| StorageError::Migration(e.to_string()))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    fn wakeups(&self) -> WakeReceiver {
        self.wake.subscribe()
    }

    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
        validate_insert(params)?;
        let tasks = std::slice::from_ref(params);
        let mut outcomes = retrying(|| self.insert_once(tasks, params.now)).await?;
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
        let mut qb = QueryBuilder::new(format!("SELECT {columns} FROM tenax_tasks WHERE TRUE"));
        if let Some(status) = params.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(command_type) = &params.command_type {
            qb.push(" AND command_type = ")
                .push_bind(command_type.as_str());
        }
        if let Some(queue) = &params.queue {
            qb.push(" AND queue = ").push_bind(queue.as_str());
        }
        if let Some(before) = params.before_id {
            qb.push(" AND id < ").push_bind(before.0);
        }
        if let Some(started_before) = params.started_before {
            qb.push(" AND started_at < ")
                .push_bind(storable(started_before));
        }
        if let Some(created_after) = params.created_after {
            qb.push(" AND created_at >= ")
                .push_bind(storable(created_after));
        }
        if let Some(created_before) = params.created_before {
            qb.push(" AND created_at < ")
                .push_bind(storable(created_before));
        }
        qb.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(params.limit));
        let rows = qb.build().fetch_all(&self.pool).await.map_err(map_err)?;
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
        retrying(|| self.lease_extend_once(params)).await
    }

    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
        let params = &*crate::common::storable_completion(params);
        retrying(|| self.complete_once(params)).await
    }

    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        let error = truncate_error(&params.error);
        retrying(|| self.fail_once(params, &error)).await
    }

    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        retrying(|| self.reap_once(params)).await
    }

    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        retrying(|| self.cancel_once(params)).await
    }

    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        retrying(|| self.retry_once(params)).await
    }

    async fn side_prune(&self, params: &crate::SidePruneParams) -> Result<crate::SidePruned> {
        self.side_prune_impl(params).await
    }

    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
        if params.limit == 0 {
            return Ok(0);
        }
        retrying(|| self.prune_once(params)).await
    }

    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.queue_list_impl().await
    }

    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        self.queue_update_impl(params).await
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
            let command_type: Vec<u8> = row.try_get("command_type").map_err(map_err)?;
            let command_type = String::from_utf8(command_type)
                .map_err(|_| StorageError::Corrupt("command_type is not UTF-8".into()))?;
            let status: Vec<u8> = row.try_get("status").map_err(map_err)?;
            let status: TaskStatus = String::from_utf8_lossy(&status).parse()?;
            let n: i64 = row.try_get("n").map_err(map_err)?;
            let n = u64::try_from(n).unwrap_or(0);
            stats.by_type.push((command_type, status, n));
            match stats.by_status.iter_mut().find(|(s, _)| *s == status) {
                Some((_, total)) => *total += n,
                None => stats.by_status.push((status, n)),
            }
        }
        stats.by_status.sort();
        let row = sqlx::query(
            "SELECT MIN(run_at) AS oldest, UTC_TIMESTAMP(6) AS now FROM tenax_tasks
             WHERE status IN ('pending', 'retrying') AND run_at <= UTC_TIMESTAMP(6)",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        let oldest: Option<DateTime<Utc>> = row.try_get("oldest").map_err(map_err)?;
        let now: DateTime<Utc> = row.try_get("now").map_err(map_err)?;
        stats.oldest_due_age = oldest.map(|oldest| (now - oldest).to_std().unwrap_or_default());
        Ok(stats)
    }

    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
        runtime::next_run_at(&self.pool, params).await
    }

    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
        runtime::queue_backlog(&self.pool, params).await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        runtime::cancel_requested(&self.leases, params).await
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
        queue_stats::queue_stats(&self.pool, params.now).await
    }
    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        self.task_bulk_impl(params).await
    }

    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        retrying(|| self.audit_append_impl(params)).await
    }

    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        self.audit_list_impl(params).await
    }

    async fn task_insert_many(
        &self,
        params: &TaskInsertManyParams,
    ) -> Result<Vec<TaskInsertOutcome>> {
        crate::common::validate_many(&params.tasks)?;
        retrying(|| self.insert_once(&params.tasks, params.now)).await
    }

    async fn task_insert_many_if(
        &self,
        params: &TaskInsertManyParams,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        crate::common::validate_many(&params.tasks)?;
        retrying(|| self.insert_checked_once(&params.tasks, params.now, accept)).await
    }

    async fn workflow_insert(&self, params: &WorkflowInsertParams) -> Result<WorkflowDetail> {
        let detail = retrying(|| async {
            let mut tx = self.begin().await?;
            let detail = flow::insert(&mut *tx, params).await?;
            tx.commit().await.map_err(map_err)?;
            Ok(detail)
        })
        .await?;
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
        retrying(|| self.outbox_claim_impl(params)).await
    }

    async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64> {
        retrying(|| self.outbox_settle_impl(params)).await
    }

    async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>> {
        self.outbox_list_impl(params).await
    }

    async fn alert_transition(&self, params: &crate::AlertTransitionParams) -> Result<bool> {
        retrying(|| self.alert_transition_impl(params)).await
    }

    async fn outbox_senders_seen(&self, params: &crate::OutboxSendersParams) -> Result<()> {
        retrying(|| self.outbox_senders_seen_impl(params)).await
    }

    async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64> {
        self.outbox_prune_impl(params).await
    }
    async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::task_workflow(&mut conn, id).await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        // A range of the (status, finished_at) index per status.
        // Only times and statuses are charted: payloads and results stay in the database.
        let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE status IN ('succeeded', 'dead') AND finished_at >= ?
             ORDER BY finished_at DESC
             LIMIT ?"
        ))
        .bind(storable(params.since))
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
        crate::common::check_complete_many(params)?;
        if params.is_empty() {
            return Ok(Vec::new());
        }
        let repeated = crate::common::repeated_leases(params);
        retrying(|| self.complete_many_once(params, &repeated)).await
    }

    async fn outbox_stats(
        &self,
        params: &crate::OutboxStatsParams,
    ) -> Result<Vec<crate::OutboxStat>> {
        retrying(|| self.outbox_stats_impl(params)).await
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
