//! Test support for this workspace: harnesses, a task factory, a fault-injecting
//! wrapper, and the conformance suite every backend passes.
//!
//! ```ignore
//! tenax_storage::conformance_tests!(sqlite, tenax_storage::testing::sqlite_file);
//! ```
//! expands to one `#[tokio::test]` per case, so a failure names the backend and the case.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{Priority, TaskNo, TaskRecord};

use crate::{RunAt, Storage, TaskClaimParams, TaskInsertParams};

mod alert_state;
mod bulk;
pub mod bulk_insert;
mod claims;
mod compensation;
mod completions;
pub mod conformance;
mod due;
mod events;
mod faults;
mod inserts;
mod keys;
mod observability;
mod outbox;
mod outcomes;
pub mod prune;
mod queues;
mod races;
mod rates;
mod reaper;
mod redrive;
pub mod runtime;
pub mod schedules;
pub mod secrets;
pub mod workflows;

pub use faults::{FaultyStorage, StorageMethod};

/// A storage under test and whatever keeps it alive.
pub struct Harness {
    pub storage: Arc<dyn Storage>,
    /// The URL that opens the same database again (another "process").
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    /// Wrap an existing storage opened from `url`.
    pub fn new(storage: Arc<dyn Storage>, url: String) -> Self {
        Self {
            storage,
            url,
            _dir: None,
        }
    }

    /// Another connection to the same database, as another process would have.
    pub async fn reopen(&self) -> Arc<dyn Storage> {
        crate::connect(&self.url)
            .await
            .expect("reopen the database")
    }

    /// Insert a task built from `opts`.
    pub async fn task(&self, opts: TaskOpts) -> TaskRecord {
        self.storage
            .task_insert(&opts.params())
            .await
            .expect("insert task")
            .task
    }

    /// Claim up to `limit` due tasks of the factory's type as `worker`.
    pub async fn claim(
        &self,
        worker: &str,
        limit: u32,
        now: Option<DateTime<Utc>>,
    ) -> Vec<TaskRecord> {
        self.storage
            .task_claim_batch(&claim_params(worker, limit, now))
            .await
            .expect("claim")
    }
}

/// Claim parameters for the factory's command type (payload version 1) and queue.
pub fn claim_params(worker: &str, limit: u32, now: Option<DateTime<Utc>>) -> TaskClaimParams {
    TaskClaimParams {
        worker: worker.to_owned(),
        queues: vec!["default".to_owned()],
        commands: vec![(TaskOpts::TYPE.to_owned(), 1)],
        limit,
        lease_ttl: Duration::from_secs(30),
        now,
    }
}

/// A fresh SQLite file in a temporary folder, migrated.
#[cfg(feature = "sqlite")]
pub async fn sqlite_file() -> Option<Harness> {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let storage = crate::connect(&url).await.expect("open sqlite");
    Some(Harness {
        storage,
        url,
        _dir: Some(dir),
    })
}

/// The URL in `var`, or `None` when it is unset: then the backend's tests are skipped,
/// unless `TENAX_REQUIRE_ALL_BACKENDS=1` (as CI sets), which makes the skip a failure.
pub fn url_from_env(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
                "{var} is unset but TENAX_REQUIRE_ALL_BACKENDS=1: every backend must be tested"
            );
            eprintln!("SKIP: {var} is unset");
            None
        }
    }
}

/// A name no other test uses, for a schema or database of its own.
pub fn unique_name(prefix: &str) -> String {
    let suffix = uuid_like();
    format!("{prefix}_{suffix}")
}

fn uuid_like() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..12)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// A fresh schema on the PostgreSQL database of `TENAX_TEST_POSTGRES_URL`, migrated.
#[cfg(feature = "postgres")]
pub async fn postgres_from_env() -> Option<Harness> {
    let url = url_from_env("TENAX_TEST_POSTGRES_URL")?;
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}schema={}", unique_name("tenax_t"));
    let storage = crate::connect(&url).await.expect("open postgres");
    Some(Harness::new(storage, url))
}

/// A fresh database on the MariaDB/MySQL server of `TENAX_TEST_MYSQL_URL`, migrated.
#[cfg(feature = "mysql")]
pub async fn mysql_from_env() -> Option<Harness> {
    let url = url_from_env("TENAX_TEST_MYSQL_URL")?;
    let name = unique_name("tenax_t");
    let storage = crate::mysql::testing_database(&url, &name)
        .await
        .expect("open mysql");
    Some(Harness::new(storage, with_database(&url, &name)))
}

/// `scheme://user@host:port/NAME?query` from a server URL and a database name.
#[cfg(feature = "mysql")]
pub fn with_database(url: &str, name: &str) -> String {
    crate::mysql::url_with_database(url, name)
}

/// What the factory inserts; every field has a default.
#[derive(Debug, Clone)]
pub struct TaskOpts {
    pub task_no: Option<String>,
    pub command_type: String,
    pub payload: String,
    pub payload_version: u32,
    pub queue: String,
    pub priority: u8,
    pub max_attempts: u32,
    pub run_at: RunAt,
    pub now: Option<DateTime<Utc>>,
    pub concurrency_key: Option<String>,
    pub concurrency_limit: u32,
    pub callback_url: Option<String>,
    pub created_by: Option<String>,
}

impl TaskOpts {
    /// The command type the factory uses by default.
    pub const TYPE: &'static str = "TEST_COMMAND";

    /// The insert the factory sends.
    pub fn params(&self) -> TaskInsertParams {
        TaskInsertParams {
            task_no: self
                .task_no
                .clone()
                .map(|n| TaskNo::new(n).expect("valid task_no"))
                .unwrap_or_else(TaskNo::generate),
            command_type: self.command_type.clone(),
            payload: self.payload.clone(),
            payload_version: self.payload_version,
            queue: self.queue.clone(),
            priority: Priority::new(self.priority).expect("valid priority"),
            max_attempts: self.max_attempts,
            timeout: Duration::from_secs(60),
            run_at: self.run_at,
            now: self.now,
            concurrency_key: self.concurrency_key.clone(),
            concurrency_limit: self.concurrency_limit,
            callback_url: self.callback_url.clone(),
            created_by: self.created_by.clone(),
        }
    }
}

impl Default for TaskOpts {
    fn default() -> Self {
        Self {
            task_no: None,
            command_type: Self::TYPE.to_owned(),
            payload: "{}".to_owned(),
            payload_version: 1,
            queue: "default".to_owned(),
            priority: 5,
            max_attempts: 5,
            run_at: RunAt::Now,
            now: None,
            concurrency_key: None,
            concurrency_limit: 1,
            callback_url: None,
            created_by: None,
        }
    }
}

/// Generate one `#[tokio::test]` per conformance case for a backend.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ident, $harness:path) => {
        mod $backend {
            $crate::conformance_tests!(@cases $harness;
                insert_returns_a_pending_task,
                same_task_no_returns_the_existing_task,
                same_task_no_with_another_payload_or_type_conflicts,
                concurrent_enqueues_of_one_task_no_make_one_task,
                invalid_insert_changes_nothing,
                claim_orders_by_priority_then_run_time,
                claim_takes_only_registered_types_and_due_tasks,
                claim_counts_the_attempt_and_bumps_the_epoch,
                complete_under_a_stale_epoch_is_rejected,
                lease_extend_renews_only_held_leases,
                fail_schedules_the_retry_on_the_database_clock,
                death_schedules_compensation_recorded_once,
                compensation_without_handler_is_recorded_as_none,
                reaper_retries_or_kills_expired_leases,
                reaper_takes_leases_granted_before_a_clock_step_back,
                reaper_never_undoes_a_completion,
                cancel_only_waiting_tasks,
                manual_retry_resets_the_budget_and_keeps_history,
                prune_deletes_old_finished_tasks_only,
                pruned_tasks_leave_no_side_rows_behind,
                a_prune_keeps_the_side_rows_live_tasks_need,
                keyed_claims_racing_the_side_prune_never_pass_a_key_limit,
                attempt_history_is_bounded,
                stats_count_by_status_and_type,
                random_operations_follow_the_state_machine,
                a_retry_asked_on_the_last_attempt_dies,
                a_hand_back_refunds_the_attempt,
                a_compensation_cannot_be_cancelled_and_its_retry_reopens_the_parent,
                migrations_apply_once_however_many_nodes_start_together,
                cancel_racing_a_claim_exactly_one_wins,
                reaper_racing_a_completion_never_both_win,
                concurrent_claimers_take_each_task_once,
                wakeups_reach_other_processes,
                times_out_of_range_are_refused_or_clamped,
                retrying_a_stale_compensation_is_refused,
                a_newer_payload_version_waits_for_a_worker_that_knows_it,
                payload_version_is_stored_and_copied_to_the_compensation,
                next_run_at_is_the_earliest_future_task_the_worker_could_claim,
                queue_backlog_counts_due_tasks_per_queue,
                a_cancel_request_on_a_running_task_ends_it_cancelled,
                a_cancel_request_does_not_undo_a_success_or_a_permanent_failure,
                list_filters_tasks_started_before_an_instant,
                an_expired_lease_with_a_cancel_request_is_reaped_cancelled,
                a_tick_fires_once_when_two_nodes_fire_together,
                missed_ticks_are_skipped_or_caught_up_within_the_bound,
                the_missed_tick_grace_is_the_schedulers_to_set,
                pause_and_resume_and_remove,
                an_invalid_schedule_changes_nothing,
                a_time_zone_schedule_fires_at_the_right_utc_instants_across_dst,
                priority_is_worth_one_aging_step_per_level,
                a_low_priority_task_starts_within_the_aging_bound_under_a_flood,
                a_paused_queue_is_never_claimed_from,
                invalid_queue_changes_are_refused_and_change_nothing,
                a_queue_limit_caps_its_running_tasks_without_blocking_others,
                concurrent_claimers_never_exceed_a_queue_limit,
                a_key_runs_at_most_its_limit_at_once,
                a_full_key_does_not_block_the_tasks_behind_it,
                a_keyed_task_in_a_limited_queue_honours_both_limits,
                invalid_concurrency_keys_are_refused_and_change_nothing,
                concurrent_claimers_never_exceed_a_key_limit,
                queue_stats_count_backlog_and_oldest_age_per_queue,
                finished_tasks_are_listed_latest_first_since_an_instant,
                a_rate_limit_starts_a_burst_then_refills_by_elapsed_time,
                a_rate_limited_task_is_not_claimed_and_spends_no_attempt,
                a_rate_limited_type_does_not_block_other_types,
                concurrent_claimers_never_exceed_a_rate_limit,
                a_rate_limit_set_by_another_node_holds_from_the_next_claim,
                invalid_rate_limits_are_refused_and_change_nothing,
                bulk_cancel_changes_only_what_a_cancel_may,
                bulk_retry_returns_only_dead_tasks_to_pending,
                bulk_reprioritise_changes_only_waiting_tasks,
                each_bulk_filter_field_narrows_the_tasks,
                bulk_limit_is_respected_and_invalid_bounds_change_nothing,
                a_bulk_filter_value_is_data_not_sql,
                list_filters_tasks_by_creation_time,
                audit_entries_list_newest_first_with_cursor_and_filters,
                a_faulty_storage_forwards_bulk_actions_and_the_audit_log,
                a_bulk_insert_of_ten_thousand_reports_new_existing_and_conflicts,
                an_invalid_task_in_a_bulk_insert_inserts_nothing,
                an_all_or_nothing_bulk_insert_commits_only_what_its_decision_accepts,
                concurrent_bulk_inserts_of_the_same_numbers_make_each_task_once,
                the_record_an_insert_answers_is_the_stored_record,
                a_child_waits_blocked_until_all_its_parents_succeeded,
                a_task_names_its_workflow,
                fan_out_and_fan_in_with_a_thousand_children_stay_efficient,
                a_dead_or_cancelled_parent_cancels_its_dependents_transitively,
                with_run_anyway_dependents_run_once_every_parent_finished,
                cycles_and_unknown_references_are_refused_and_insert_nothing,
                a_saga_compensates_the_steps_before_a_dead_step_in_reverse_order,
                bulk_cancel_of_a_workflow_task_cancels_its_dependents,
                retrying_a_dead_workflow_step_brings_back_the_dependents_its_death_cancelled,
                retrying_a_dead_saga_step_runs_its_undone_steps_again_and_resumes_the_chain,
                bulk_retry_redrives_workflows_and_includes_dead_compensations,
                a_final_outcome_writes_its_outbox_rows_in_the_same_transaction,
                outbox_claims_are_settled_only_under_their_own_attempt,
                an_outbox_retry_past_its_maximum_age_expires,
                concurrent_outbox_claimers_take_each_row_once,
                outbox_stats_count_pending_rows_per_kind_with_the_oldest_age,
                a_death_writes_its_row_only_while_a_death_sender_is_recorded,
                the_pruner_forgets_a_silent_sender_and_expires_what_nothing_can_send,
                an_alert_changes_state_once_per_transition,
                an_alert_change_writes_its_message_to_the_outbox_once,
                a_completion_batch_lands_exactly_where_the_lease_holds,
                an_empty_or_oversized_completion_batch_writes_nothing,
                a_completion_batch_runs_workflow_and_compensation_effects,
                a_completion_batch_stores_each_result_exactly_at_each_items_time,
                due_count_counts_due_tasks_of_one_type_up_to_a_limit,
                task_events_are_written_for_covered_tasks_in_the_transition_transaction,
                event_listing_filters_and_resumes_by_position,
                the_event_leases_have_one_holder_and_fence_a_stale_one,
                concurrent_transitions_are_sequenced_gapless_and_in_order_per_task,
                pruning_removes_a_delivered_prefix_and_records_it,
                invalid_event_inputs_are_refused_and_change_nothing,
                a_nul_in_an_outcome_is_stored_escaped_and_the_task_ends,
                the_enqueuers_name_is_stored_kept_and_carried_to_the_compensation,
                a_list_can_leave_large_values_out,
            );
        }
    };
    (@cases $harness:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(harness) = $harness().await else {
                    return;
                };
                $crate::testing::conformance::$case(&harness).await;
            }
        )*
    };
}
