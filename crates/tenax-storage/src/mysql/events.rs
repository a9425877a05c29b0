//! Task events on MariaDB/MySQL (see [`crate::events`]).
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, QueryBuilder, Row};
use tenax_core::TaskId;

use super::rows::{opt_text, text};
use super::{clock, map_err, minus, plus, push_list, MySqlStorage};
use crate::error::{Result, StorageError};
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

fn record_from_row(row: &MySqlRow) -> Result<EventRecord> {
    Ok(EventRecord {
        id: row.try_get("id").map_err(map_err)?,
        event_id: text(row, "event_id")?,
        seq: row.try_get("seq").map_err(map_err)?,
        event: EventKind::parse(&text(row, "event")?)?,
        task_id: TaskId(row.try_get("task_id").map_err(map_err)?),
        queue: text(row, "queue")?,
        command_type: text(row, "command_type")?,
        status: text(row, "status")?,
        task: text(row, "task")?,
        occurred_at: row
            .try_get::<DateTime<Utc>, _>("occurred_at")
            .map_err(map_err)?,
    })
}

fn lease_from_row(row: &MySqlRow) -> Result<EventLease> {
    Ok(EventLease {
        name: text(row, "name")?,
        holder: opt_text(row, "holder")?
            .ok_or_else(|| StorageError::Corrupt("event lease without holder".into()))?,
        epoch: row.try_get("epoch").map_err(map_err)?,
        expires_at: row
            .try_get::<Option<DateTime<Utc>>, _>("expires_at")
            .map_err(map_err)?
            .ok_or_else(|| StorageError::Corrupt("event lease without expiry".into()))?,
        last_seq: row.try_get("last_seq").map_err(map_err)?,
    })
}

impl MySqlStorage {
    pub(super) async fn event_rule_set_impl(&self, params: &EventRuleParams) -> Result<bool> {
        let (queue, command_type) = validate_rule(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let done = if params.enabled {
            sqlx::query(
                "INSERT IGNORE INTO tenax_event_rules (queue, command_type, created_at)
                 VALUES (?, ?, ?)",
            )
            .bind(&queue)
            .bind(&command_type)
            .bind(now)
            .execute(&mut *tx)
            .await
        } else {
            sqlx::query("DELETE FROM tenax_event_rules WHERE queue = ? AND command_type = ?")
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
                    text(row, "queue")?,
                    text(row, "command_type")?,
                    row.try_get::<DateTime<Utc>, _>("created_at")
                        .map_err(map_err)?,
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
        let until = plus(now, params.ttl);
        // Lock the row (or the gap) first, so concurrent callers take turns.
        let current = sqlx::query(
            "SELECT holder, expires_at FROM tenax_event_leases WHERE name = ? FOR UPDATE",
        )
        .bind(&params.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let granted = match current {
            None => {
                sqlx::query(
                    "INSERT IGNORE INTO tenax_event_leases (name, holder, epoch, expires_at)
                     VALUES (?, ?, 1, ?)",
                )
                .bind(&params.name)
                .bind(&params.holder)
                .bind(until)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?
                .rows_affected()
                    == 1
            }
            Some(_) => {
                sqlx::query(
                    "UPDATE tenax_event_leases
                     SET epoch = IF(holder <=> ? AND expires_at > ?, epoch, epoch + 1),
                         holder = ?, expires_at = ?
                     WHERE name = ? AND (holder IS NULL OR holder = ? OR expires_at <= ?)",
                )
                .bind(&params.holder)
                .bind(now)
                .bind(&params.holder)
                .bind(until)
                .bind(&params.name)
                .bind(&params.holder)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?
                .rows_affected()
                    == 1
            }
        };
        let lease = if granted {
            let row = sqlx::query(
                "SELECT name, holder, epoch, expires_at, last_seq FROM tenax_event_leases
                 WHERE name = ?",
            )
            .bind(&params.name)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
            Some(lease_from_row(&row)?)
        } else {
            None
        };
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
             WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?
             FOR UPDATE",
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
        // Locking reads see the latest committed rows, whatever the snapshot.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM tenax_events WHERE seq IS NULL ORDER BY id LIMIT ? FOR UPDATE",
        )
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let count = ids.len() as u64;
        let mut next = last;
        for chunk in ids.chunks(1000) {
            let mut qb = QueryBuilder::<MySql>::new("UPDATE tenax_events SET sequenced_at = ");
            qb.push_bind(now);
            qb.push(", seq = CASE id");
            for id in chunk {
                next += 1;
                qb.push(" WHEN ")
                    .push_bind(*id)
                    .push(" THEN ")
                    .push_bind(next);
            }
            qb.push(" END WHERE id IN ");
            push_list(&mut qb, chunk.iter().copied());
            qb.build().execute(&mut *tx).await.map_err(map_err)?;
        }
        if count > 0 {
            sqlx::query("UPDATE tenax_event_leases SET last_seq = last_seq + ? WHERE name = ?")
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
        let held: Option<i64> = sqlx::query_scalar(
            "SELECT last_seq FROM tenax_event_leases
             WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ? FOR UPDATE",
        )
        .bind(&params.lease.name)
        .bind(&params.lease.holder)
        .bind(params.lease.epoch)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(last) = held else {
            return Ok(false);
        };
        if params.last_seq > last {
            sqlx::query("UPDATE tenax_event_leases SET last_seq = ? WHERE name = ?")
                .bind(params.last_seq)
                .bind(&params.lease.name)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    pub(super) async fn event_list_impl(&self, params: &EventListParams) -> Result<EventPage> {
        validate_list(params)?;
        // One transaction (one snapshot), so the head and the events agree.
        let mut tx = self.begin().await?;
        let state =
            sqlx::query("SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = ?")
                .bind(SEQUENCER_LEASE)
                .fetch_optional(&mut *tx)
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
            QueryBuilder::<MySql>::new(format!("SELECT {COLUMNS} FROM tenax_events WHERE seq > "));
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
            qb.push(" AND status IN ");
            push_list(&mut qb, params.statuses.iter().map(|s| s.as_str()));
        }
        if !params.events.is_empty() {
            qb.push(" AND event IN ");
            push_list(&mut qb, params.events.iter().map(|k| k.as_str()));
        }
        qb.push(" ORDER BY seq LIMIT ")
            .push_bind(i64::from(params.limit));
        let rows = qb.build().fetch_all(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
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
        let row = sqlx::query(
            "SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = ? FOR UPDATE",
        )
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
                sqlx::query_scalar("SELECT last_seq FROM tenax_event_leases WHERE name = ?")
                    .bind(relay)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(map_err)?;
            delivered.extend(seq);
        }
        let bound = crate::events::prune_bound(head, &relays, &delivered);
        let through: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(seq) FROM tenax_events
             WHERE seq > ? AND seq <= ? AND sequenced_at < ?",
        )
        .bind(pruned)
        .bind(bound)
        .bind(minus(now, params.older_than))
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(through) = through else {
            return Ok(0);
        };
        let done = sqlx::query("DELETE FROM tenax_events WHERE seq > ? AND seq <= ?")
            .bind(pruned)
            .bind(through)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query("UPDATE tenax_event_leases SET pruned_through = ? WHERE name = ?")
            .bind(through)
            .bind(SEQUENCER_LEASE)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
