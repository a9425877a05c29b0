//! Task events on SQLite (see [`crate::events`]).
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite};
use tenax_core::TaskId;

use super::rows::ms;
use super::{clock, map_err, SqliteStorage};
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

/// Most positions one listing looks through (see the PostgreSQL backend).
const SCAN_WINDOW: i64 = 100_000;

fn record_from_row(row: &SqliteRow) -> Result<EventRecord> {
    Ok(EventRecord {
        id: row.try_get("id").map_err(map_err)?,
        event_id: row.try_get("event_id").map_err(map_err)?,
        seq: row.try_get("seq").map_err(map_err)?,
        event: EventKind::parse(&row.try_get::<String, _>("event").map_err(map_err)?)?,
        task_id: TaskId(row.try_get("task_id").map_err(map_err)?),
        queue: row.try_get("queue").map_err(map_err)?,
        command_type: row.try_get("command_type").map_err(map_err)?,
        status: row.try_get("status").map_err(map_err)?,
        task: row.try_get("task").map_err(map_err)?,
        occurred_at: ms(row.try_get("occurred_at").map_err(map_err)?)?,
    })
}

fn lease_from_row(row: &SqliteRow) -> Result<EventLease> {
    Ok(EventLease {
        name: row.try_get("name").map_err(map_err)?,
        holder: row.try_get("holder").map_err(map_err)?,
        epoch: row.try_get("epoch").map_err(map_err)?,
        expires_at: ms(row.try_get("expires_at").map_err(map_err)?)?,
        last_seq: row.try_get("last_seq").map_err(map_err)?,
    })
}

impl SqliteStorage {
    pub(super) async fn event_rule_set_impl(&self, params: &EventRuleParams) -> Result<bool> {
        let (queue, command_type) = validate_rule(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let done = if params.enabled {
            sqlx::query(
                "INSERT INTO tenax_event_rules (queue, command_type, created_at)
                 VALUES (?1, ?2, ?3) ON CONFLICT (queue, command_type) DO NOTHING",
            )
            .bind(&queue)
            .bind(&command_type)
            .bind(now)
            .execute(&mut *tx)
            .await
        } else {
            sqlx::query("DELETE FROM tenax_event_rules WHERE queue = ?1 AND command_type = ?2")
                .bind(&queue)
                .bind(&command_type)
                .execute(&mut *tx)
                .await
        }
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
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
                    ms(row.try_get("created_at").map_err(map_err)?)?,
                ))
            })
            .collect()
    }

    pub(super) async fn event_lease_impl(
        &self,
        params: &EventLeaseParams,
    ) -> Result<Option<EventLease>> {
        validate_lease(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let row = sqlx::query(
            "INSERT INTO tenax_event_leases AS l (name, holder, epoch, expires_at)
             VALUES (?1, ?2, 1, ?4)
             ON CONFLICT (name) DO UPDATE SET
                 epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > ?3
                              THEN l.epoch ELSE l.epoch + 1 END,
                 holder = excluded.holder,
                 expires_at = excluded.expires_at
             WHERE l.holder IS NULL OR l.holder = excluded.holder OR l.expires_at <= ?3
             RETURNING name, holder, epoch, expires_at, last_seq",
        )
        .bind(&params.name)
        .bind(&params.holder)
        .bind(now)
        .bind(now.saturating_add(duration_ms(params.ttl)))
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let lease = row.as_ref().map(lease_from_row).transpose()?;
        tx.commit().await.map_err(map_err)?;
        Ok(lease)
    }

    pub(super) async fn event_sequence_impl(
        &self,
        params: &EventSequenceParams,
    ) -> Result<Option<u64>> {
        validate_sequence(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let last: Option<i64> = sqlx::query_scalar(
            "SELECT last_seq FROM tenax_event_leases
             WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND expires_at > ?4",
        )
        .bind(SEQUENCER_LEASE)
        .bind(&params.lease.holder)
        .bind(params.lease.epoch)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(last) = last else {
            return Ok(None);
        };
        let done = sqlx::query(
            "UPDATE tenax_events SET seq = ?1 + next.n, sequenced_at = ?2
             FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM tenax_events
                   WHERE seq IS NULL ORDER BY id LIMIT ?3) AS next
             WHERE tenax_events.id = next.id",
        )
        .bind(last)
        .bind(now)
        .bind(i64::from(params.limit))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let count = done.rows_affected();
        if count > 0 {
            sqlx::query("UPDATE tenax_event_leases SET last_seq = last_seq + ?1 WHERE name = ?2")
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
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let done = sqlx::query(
            "UPDATE tenax_event_leases SET last_seq = MAX(last_seq, ?4)
             WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND expires_at > ?5",
        )
        .bind(&params.lease.name)
        .bind(&params.lease.holder)
        .bind(params.lease.epoch)
        .bind(params.last_seq)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn event_list_impl(&self, params: &EventListParams) -> Result<EventPage> {
        validate_list(params)?;
        // One read transaction, so the head and the events agree.
        let mut conn = self.pool().begin().await.map_err(map_err)?;
        let state =
            sqlx::query("SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = ?1")
                .bind(SEQUENCER_LEASE)
                .fetch_optional(&mut *conn)
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
        let mut qb =
            QueryBuilder::<Sqlite>::new(format!("SELECT {COLUMNS} FROM tenax_events WHERE seq > "));
        qb.push_bind(params.after);
        qb.push(" AND seq <= ").push_bind(upper);
        if let Some(queue) = &params.queue {
            qb.push(" AND queue = ").push_bind(queue.clone());
        }
        if let Some(command_type) = &params.command_type {
            qb.push(" AND command_type = ")
                .push_bind(command_type.clone());
        }
        if !params.statuses.is_empty() {
            qb.push(" AND status IN (");
            let mut list = qb.separated(", ");
            for status in &params.statuses {
                list.push_bind(status.as_str());
            }
            qb.push(")");
        }
        if !params.events.is_empty() {
            qb.push(" AND event IN (");
            let mut list = qb.separated(", ");
            for kind in &params.events {
                list.push_bind(kind.as_str());
            }
            qb.push(")");
        }
        qb.push(" ORDER BY seq LIMIT ")
            .push_bind(i64::from(params.limit));
        let rows = qb.build().fetch_all(&mut *conn).await.map_err(map_err)?;
        conn.commit().await.map_err(map_err)?;
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
        let now = clock(&mut tx, params.now).await?;
        let row =
            sqlx::query("SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = ?1")
                .bind(SEQUENCER_LEASE)
                .fetch_one(&mut *tx)
                .await
                .map_err(map_err)?;
        let head: i64 = row.try_get("last_seq").map_err(map_err)?;
        let pruned: i64 = row.try_get("pruned_through").map_err(map_err)?;
        let mut relays = params.relays.clone();
        relays.sort();
        relays.dedup();
        let mut delivered = Vec::new();
        for relay in &relays {
            let seq: Option<i64> =
                sqlx::query_scalar("SELECT last_seq FROM tenax_event_leases WHERE name = ?1")
                    .bind(relay)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(map_err)?;
            delivered.extend(seq);
        }
        let bound = crate::events::prune_bound(head, &relays, &delivered);
        let through: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(seq) FROM tenax_events
             WHERE seq > ?1 AND seq <= ?2 AND sequenced_at < ?3",
        )
        .bind(pruned)
        .bind(bound)
        .bind(now.saturating_sub(duration_ms(params.older_than)))
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(through) = through else {
            return Ok(0);
        };
        let done = sqlx::query("DELETE FROM tenax_events WHERE seq > ?1 AND seq <= ?2")
            .bind(pruned)
            .bind(through)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query("UPDATE tenax_event_leases SET pruned_through = ?1 WHERE name = ?2")
            .bind(through)
            .bind(SEQUENCER_LEASE)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
