//! Task events on PostgreSQL (see [`crate::events`]).
use sqlx::postgres::PgRow;
use sqlx::Row;
use tenax_core::TaskId;

use super::{map_err, PgStorage, NOW};
use crate::common::duration_ms;
use crate::error::Result;
use crate::events::{
    rule_from_stored, validate_cursor, validate_lease, validate_list, validate_prune,
    validate_rule, validate_sequence, EventCursorParams, EventKind, EventLease, EventLeaseParams,
    EventListParams, EventPage, EventPruneParams, EventRecord, EventRule, EventRuleParams,
    EventSequenceParams, SEQUENCER_LEASE,
};

const COLUMNS: &str =
    "id, event_id, seq, event, task_id, queue, command_type, status, task, occurred_at";

/// Most positions one listing looks through, so a narrow filter over a long stream
/// answers in bounded time (the reader continues from `scanned_through`).
const SCAN_WINDOW: i64 = 100_000;

fn record_from_row(row: &PgRow) -> Result<EventRecord> {
    Ok(EventRecord {
        id: row.try_get("id").map_err(map_err)?,
        event_id: row.try_get("event_id").map_err(map_err)?,
        seq: row.try_get("seq").map_err(map_err)?,
        event: EventKind::parse(row.try_get("event").map_err(map_err)?)?,
        task_id: TaskId(row.try_get("task_id").map_err(map_err)?),
        queue: row.try_get("queue").map_err(map_err)?,
        command_type: row.try_get("command_type").map_err(map_err)?,
        status: row.try_get("status").map_err(map_err)?,
        task: row.try_get("task").map_err(map_err)?,
        occurred_at: row.try_get("occurred_at").map_err(map_err)?,
    })
}

fn lease_from_row(row: &PgRow) -> Result<EventLease> {
    Ok(EventLease {
        name: row.try_get("name").map_err(map_err)?,
        holder: row.try_get("holder").map_err(map_err)?,
        epoch: row.try_get("epoch").map_err(map_err)?,
        expires_at: row.try_get("expires_at").map_err(map_err)?,
        last_seq: row.try_get("last_seq").map_err(map_err)?,
    })
}

impl PgStorage {
    pub(super) async fn event_rule_set_impl(&self, params: &EventRuleParams) -> Result<bool> {
        let (queue, command_type) = validate_rule(params)?;
        let done = if params.enabled {
            sqlx::query(&format!(
                "INSERT INTO tenax_event_rules (queue, command_type, created_at)
                 VALUES ($2, $3, {NOW}) ON CONFLICT (queue, command_type) DO NOTHING"
            ))
            .bind(params.now)
            .bind(&queue)
            .bind(&command_type)
            .execute(self.pool())
            .await
        } else {
            sqlx::query("DELETE FROM tenax_event_rules WHERE queue = $1 AND command_type = $2")
                .bind(&queue)
                .bind(&command_type)
                .execute(self.pool())
                .await
        }
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn event_rule_list_impl(&self) -> Result<Vec<EventRule>> {
        let rows = sqlx::query(
            "SELECT queue, command_type, created_at FROM tenax_event_rules
             ORDER BY queue, command_type",
        )
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                Ok(rule_from_stored(
                    row.try_get("queue").map_err(map_err)?,
                    row.try_get("command_type").map_err(map_err)?,
                    row.try_get("created_at").map_err(map_err)?,
                ))
            })
            .collect()
    }

    pub(super) async fn event_lease_impl(
        &self,
        params: &EventLeaseParams,
    ) -> Result<Option<EventLease>> {
        validate_lease(params)?;
        let row = sqlx::query(&format!(
            "INSERT INTO tenax_event_leases AS l (name, holder, epoch, expires_at)
             VALUES ($2, $3, 1, {NOW} + $4::float8 * interval '1 millisecond')
             ON CONFLICT (name) DO UPDATE SET
                 epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > {NOW}
                              THEN l.epoch ELSE l.epoch + 1 END,
                 holder = excluded.holder,
                 expires_at = excluded.expires_at
             WHERE l.holder IS NULL OR l.holder = excluded.holder OR l.expires_at <= {NOW}
             RETURNING name, holder, epoch, expires_at, last_seq"
        ))
        .bind(params.now)
        .bind(&params.name)
        .bind(&params.holder)
        .bind(duration_ms(params.ttl) as f64)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)?;
        row.as_ref().map(lease_from_row).transpose()
    }

    pub(super) async fn event_sequence_impl(
        &self,
        params: &EventSequenceParams,
    ) -> Result<Option<u64>> {
        validate_sequence(params)?;
        let mut tx = self.begin().await?;
        let last: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT last_seq FROM tenax_event_leases
             WHERE name = $2 AND holder = $3 AND epoch = $4 AND expires_at > {NOW}
             FOR UPDATE"
        ))
        .bind(params.now)
        .bind(SEQUENCER_LEASE)
        .bind(&params.lease.holder)
        .bind(params.lease.epoch)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(last) = last else {
            return Ok(None);
        };
        let done = sqlx::query(&format!(
            "WITH next AS (
                 SELECT id, row_number() OVER (ORDER BY id) AS n FROM tenax_events
                 WHERE seq IS NULL ORDER BY id LIMIT $3)
             UPDATE tenax_events e SET seq = $2 + next.n, sequenced_at = {NOW}
             FROM next WHERE e.id = next.id"
        ))
        .bind(params.now)
        .bind(last)
        .bind(i64::from(params.limit))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let count = done.rows_affected();
        if count > 0 {
            sqlx::query("UPDATE tenax_event_leases SET last_seq = last_seq + $1 WHERE name = $2")
                .bind(count as i64)
                .bind(SEQUENCER_LEASE)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(Some(count))
    }

    pub(super) async fn event_cursor_advance_impl(
        &self,
        params: &EventCursorParams,
    ) -> Result<bool> {
        validate_cursor(params)?;
        let done = sqlx::query(&format!(
            "UPDATE tenax_event_leases SET last_seq = GREATEST(last_seq, $5)
             WHERE name = $2 AND holder = $3 AND epoch = $4 AND expires_at > {NOW}"
        ))
        .bind(params.now)
        .bind(&params.lease.name)
        .bind(&params.lease.holder)
        .bind(params.lease.epoch)
        .bind(params.last_seq)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn event_list_impl(&self, params: &EventListParams) -> Result<EventPage> {
        validate_list(params)?;
        let state =
            sqlx::query("SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = $1")
                .bind(SEQUENCER_LEASE)
                .fetch_optional(self.pool())
                .await
                .map_err(map_err)?;
        let (head, pruned_through): (i64, i64) = match state {
            Some(row) => (
                row.try_get("last_seq").map_err(map_err)?,
                row.try_get("pruned_through").map_err(map_err)?,
            ),
            None => (0, 0),
        };
        let upper = head.min(params.after.saturating_add(SCAN_WINDOW));
        let statuses: Vec<&str> = params.statuses.iter().map(|s| s.as_str()).collect();
        let kinds: Vec<&str> = params.events.iter().map(|k| k.as_str()).collect();
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_events
             WHERE seq > $1 AND seq <= $2
               AND ($3::text IS NULL OR queue = $3)
               AND ($4::text IS NULL OR command_type = $4)
               AND (cardinality($5::text[]) = 0 OR status = ANY($5))
               AND (cardinality($6::text[]) = 0 OR event = ANY($6))
             ORDER BY seq LIMIT $7"
        ))
        .bind(params.after)
        .bind(upper)
        .bind(&params.queue)
        .bind(&params.command_type)
        .bind(&statuses)
        .bind(&kinds)
        .bind(i64::from(params.limit))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        let events = rows
            .iter()
            .map(record_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(crate::events::page(
            params,
            events,
            head,
            pruned_through,
            upper,
        ))
    }

    pub(super) async fn event_prune_impl(&self, params: &EventPruneParams) -> Result<u64> {
        validate_prune(params)?;
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = $1 FOR UPDATE",
        )
        .bind(SEQUENCER_LEASE)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let head: i64 = row.try_get("last_seq").map_err(map_err)?;
        let pruned: i64 = row.try_get("pruned_through").map_err(map_err)?;
        let delivered: Vec<i64> =
            sqlx::query_scalar("SELECT last_seq FROM tenax_event_leases WHERE name = ANY($1)")
                .bind(&params.relays)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
        let bound = crate::events::prune_bound(head, &params.relays, &delivered);
        let through: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT MAX(seq) FROM tenax_events
             WHERE seq > $2 AND seq <= $3
               AND sequenced_at < {NOW} - $4::float8 * interval '1 millisecond'"
        ))
        .bind(params.now)
        .bind(pruned)
        .bind(bound)
        .bind(duration_ms(params.older_than) as f64)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(through) = through else {
            return Ok(0);
        };
        let done = sqlx::query("DELETE FROM tenax_events WHERE seq > $1 AND seq <= $2")
            .bind(pruned)
            .bind(through)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query("UPDATE tenax_event_leases SET pruned_through = $1 WHERE name = $2")
            .bind(through)
            .bind(SEQUENCER_LEASE)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
