//! The [`Storage`](crate::Storage) trait's methods that every backend forwards alike.

/// `f`, run again after a lost lock conflict where the backend `$db` loses them
/// ([`retrying`](crate::dialect::retrying)); once elsewhere. `f` is one whole
/// transaction.
macro_rules! retried {
    ($db:ty, $call:expr) => {
        $crate::dialect::retrying::<$db, _, _, _>(|| $call)
    };
}
pub(crate) use retried;

/// `impl Storage for $storage` on the database `$db`, named `$backend`: the methods every
/// backend forwards alike, written here once, and `$own`, the backend's own methods.
///
/// Expanded in a backend's `storage.rs`, where the backend's modules (`runtime`,
/// `queue_stats`, `workflows`, `rows`), its `fetch_ref` and `map_err`, and its
/// storage's inherent methods are in scope. Each method:
/// - runs under the storage's `timed`: PostgreSQL's call timeout (`PgConfig::call_timeout`);
///   SQLite and MariaDB bound their waits in the database (`busy_timeout`,
///   `innodb_lock_wait_timeout`) and run the call as it is;
/// - when it is a write MariaDB runs again after a lost lock conflict (a deadlock
///   victim, a lock-wait timeout) and one transaction, runs through [`retried!`], and
///   MariaDB's `_impl` method is a single attempt; the other backends lose no
///   conflicts and run it once. Writes that commit several transactions (the side
///   prune, a schedule's, a bulk action's) retry each inside their shared method, and
///   the rest (events, rate limits, queue and schedule reads) run as before, once.
///
/// Before, PostgreSQL timed only some of these calls (its documentation says each
/// storage call is bounded); now it times all of them.
macro_rules! storage_impl {
    ($storage:ty, $db:ty, $backend:literal, { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::Storage for $storage {
            fn backend(&self) -> &'static str {
                $backend
            }

            fn capabilities(&self) -> $crate::Capabilities {
                $crate::Capabilities {
                    cross_process_wakeups: self.cross_process_wakeups(),
                }
            }

            $($own)*

            fn wakeups(&self) -> $crate::WakeReceiver {
                self.wake.subscribe()
            }

            async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>> {
                self.timed(fetch_ref(&self.pool, task)).await
            }

            async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
                self.timed(async {
                    let sql = $crate::dialect::sql!(
                        $db,
                        "SELECT task_id, epoch, attempt, worker, started_at, finished_at, outcome, error
                         FROM tenax_attempts WHERE task_id = ? ORDER BY epoch"
                    );
                    let rows = sqlx::query(sql)
                        .bind(id.0)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(map_err)?;
                    rows.iter().map(rows::attempt_from_row).collect()
                })
                .await
            }

            async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
                if $crate::common::offers_nothing(params) {
                    return Ok(Vec::new());
                }
                self.timed($crate::rates::claim(self, params)).await
            }

            async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
                let params = &*$crate::common::storable_completion(params);
                self.timed($crate::shared::storage::retried!($db, self.complete_impl(params))).await
            }

            async fn task_complete_many_if_leased(
                &self,
                params: &[TaskCompleteParams],
            ) -> Result<Vec<BatchCompletion>> {
                let params = &*$crate::common::storable_completions(params);
                $crate::common::check_complete_many(params)?;
                if params.is_empty() {
                    return Ok(Vec::new());
                }
                let repeated = &$crate::common::repeated_leases(params);
                self.timed($crate::shared::storage::retried!(
                    $db,
                    self.complete_many_impl(params, repeated)
                ))
                .await
            }

            async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
                self.timed($crate::shared::storage::retried!($db, self.fail_impl(params))).await
            }

            async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
                self.timed($crate::shared::storage::retried!($db, self.reap_impl(params))).await
            }

            async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
                self.timed($crate::shared::storage::retried!($db, self.cancel_impl(params))).await
            }

            async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
                self.timed($crate::shared::storage::retried!($db, self.retry_impl(params))).await
            }

            async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
                self.timed($crate::shared::storage::retried!($db, self.prune_impl(params))).await
            }

            async fn side_prune(&self, params: &$crate::SidePruneParams) -> Result<$crate::SidePruned> {
                self.timed(self.side_prune_impl(params)).await
            }

            async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
                $crate::common::validate_insert(params)?;
                let tasks = std::slice::from_ref(params);
                let mut outcomes = self
                    .timed($crate::shared::storage::retried!($db, self.insert_committed(tasks, params.now)))
                    .await?;
                outcomes
                    .pop()
                    .ok_or_else(|| StorageError::NotFound(params.task_no.to_string()))?
                    .into_inserted()
            }

            async fn task_insert_many(
                &self,
                params: &TaskInsertManyParams,
            ) -> Result<Vec<TaskInsertOutcome>> {
                $crate::common::validate_many(&params.tasks)?;
                self.timed($crate::shared::storage::retried!($db, self.insert_committed(&params.tasks, params.now)))
                    .await
            }

            async fn task_insert_many_if(
                &self,
                params: &TaskInsertManyParams,
                accept: &InsertAccept<'_>,
            ) -> Result<TaskInsertManyChecked> {
                $crate::common::validate_many(&params.tasks)?;
                self.timed($crate::shared::storage::retried!($db, self.insert_checked(&params.tasks, params.now, accept)))
                    .await
            }

            async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
                if params.queues.is_empty() || params.commands.is_empty() {
                    return Ok(None);
                }
                self.timed(runtime::next_run_at(&self.pool, params)).await
            }

            async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
                self.timed(runtime::queue_backlog(&self.pool, params)).await
            }

            async fn task_due_count(&self, params: &$crate::TaskDueCountParams) -> Result<$crate::DueCount> {
                self.timed(runtime::due_count(&self.pool, params)).await
            }

            async fn schedule_upsert(
                &self,
                params: &ScheduleUpsertParams,
            ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
                self.timed(self.schedule_upsert_tx(params)).await
            }

            async fn schedule_list(&self) -> Result<Vec<ScheduleRecord>> {
                self.timed(self.schedule_list_all()).await
            }

            async fn schedule_set_paused(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord> {
                self.timed(self.schedule_pause_tx(params)).await
            }

            async fn schedule_remove(&self, name: &str) -> Result<()> {
                self.timed(self.schedule_delete(name)).await
            }

            async fn schedule_fire_due(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>> {
                self.timed(self.schedule_fire_tx(params)).await
            }

            async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
                self.timed(self.queue_list_impl()).await
            }

            async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
                self.timed(self.queue_update_impl(params)).await
            }

            async fn stats(&self) -> Result<Stats> {
                self.timed(queue_stats::stats(&self.pool)).await
            }

            async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>> {
                self.timed(queue_stats::queue_stats(&self.pool, params.now)).await
            }

            async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit> {
                self.timed(self.rate_limit_set_impl(params)).await
            }

            async fn rate_limit_list(&self) -> Result<Vec<RateLimit>> {
                self.timed(self.rate_limit_list_impl()).await
            }

            async fn rate_limit_remove(&self, command_type: &str) -> Result<()> {
                self.timed(self.rate_limit_remove_impl(command_type)).await
            }

            async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
                self.timed(self.task_bulk_impl(params)).await
            }

            async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
                self.timed($crate::shared::storage::retried!($db, self.audit_append_impl(params))).await
            }

            async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
                self.timed(self.audit_list_impl(params)).await
            }

            async fn workflow_insert(&self, params: &WorkflowInsertParams) -> Result<WorkflowDetail> {
                let detail = self
                    .timed($crate::shared::storage::retried!($db, async {
                        let mut tx = self.begin().await?;
                        let detail = $crate::flow::insert(&mut *tx, params).await?;
                        tx.commit().await.map_err(map_err)?;
                        Ok(detail)
                    }))
                    .await?;
                self.wake();
                Ok(detail)
            }

            async fn workflow_get(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>> {
                self.timed(async {
                    let mut conn = self.pool.acquire().await.map_err(map_err)?;
                    $crate::flow::get(&mut *conn, id).await
                })
                .await
            }

            async fn workflow_list(&self, params: &WorkflowListParams) -> Result<Vec<WorkflowRecord>> {
                self.timed(async {
                    let mut conn = self.pool.acquire().await.map_err(map_err)?;
                    $crate::flow::list(&mut *conn, params).await
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

            async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>> {
                self.timed(async {
                    let mut conn = self.pool.acquire().await.map_err(map_err)?;
                    workflows::task_workflow(&mut conn, id).await
                })
                .await
            }

            async fn outbox_claim(&self, params: &OutboxClaimParams) -> Result<Vec<OutboxRecord>> {
                self.timed($crate::shared::storage::retried!($db, self.outbox_claim_impl(params))).await
            }

            async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64> {
                self.timed($crate::shared::storage::retried!($db, self.outbox_settle_impl(params))).await
            }

            async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>> {
                self.timed(self.outbox_list_impl(params)).await
            }

            async fn outbox_senders_seen(&self, params: &$crate::OutboxSendersParams) -> Result<()> {
                self.timed($crate::shared::storage::retried!($db, self.outbox_senders_seen_impl(params))).await
            }

            async fn outbox_stats(
                &self,
                params: &$crate::OutboxStatsParams,
            ) -> Result<Vec<$crate::OutboxStat>> {
                self.timed($crate::shared::storage::retried!($db, self.outbox_stats_impl(params))).await
            }

            async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64> {
                self.timed(self.outbox_prune_impl(params)).await
            }

            async fn alert_transition(&self, params: &$crate::AlertTransitionParams) -> Result<bool> {
                self.timed($crate::shared::storage::retried!($db, self.alert_transition_impl(params))).await
            }

            async fn event_rule_set(&self, params: &$crate::EventRuleParams) -> Result<bool> {
                self.timed(self.event_rule_set_impl(params)).await
            }

            async fn event_rule_list(&self) -> Result<Vec<$crate::EventRule>> {
                self.timed(self.event_rule_list_impl()).await
            }

            async fn event_lease(
                &self,
                params: &$crate::EventLeaseParams,
            ) -> Result<Option<$crate::EventLease>> {
                self.timed(self.event_lease_impl(params)).await
            }

            async fn event_sequence(&self, params: &$crate::EventSequenceParams) -> Result<Option<u64>> {
                self.timed(self.event_sequence_impl(params)).await
            }

            async fn event_cursor_advance(&self, params: &$crate::EventCursorParams) -> Result<bool> {
                self.timed(self.event_cursor_advance_impl(params)).await
            }

            async fn event_list(&self, params: &$crate::EventListParams) -> Result<$crate::EventPage> {
                self.timed(self.event_list_impl(params)).await
            }

            async fn event_prune(&self, params: &$crate::EventPruneParams) -> Result<u64> {
                self.timed(self.event_prune_impl(params)).await
            }
        }
    };
}
pub(crate) use storage_impl;

/// The wake-up and call methods of a storage `$storage` whose cross-process wake-ups
/// come from a probe (`wake: Arc<Wake>`: SQLite, MariaDB), and whose database bounds
/// every wait itself (`$bounds`, a doc line), so that a call has no timeout of its own
/// (PostgreSQL's `timed` adds one).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! probed_storage {
    ($storage:ty, $bounds:literal) => {
        impl $storage {
            /// Whether another process's new task wakes this one's workers at once (the
            /// probe is on).
            fn cross_process_wakeups(&self) -> bool {
                self.wake.cross_process()
            }

            /// Wake this process's workers.
            fn wake(&self) {
                self.wake.bump();
            }

            #[doc = concat!("A storage call as it is: ", $bounds)]
            async fn timed<T>(
                &self,
                call: impl std::future::Future<Output = $crate::error::Result<T>>,
            ) -> $crate::error::Result<T> {
                call.await
            }
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use probed_storage;
