//! Task events on MariaDB/MySQL (see [`crate::events`]). The rules, the sequencer's
//! fence, the listing and the prune are written once, in `crate::shared::events`. What
//! MariaDB does its own way is here: it has no upsert with a condition and no
//! `RETURNING`, so a lease locks its row (or the gap) first and a cursor is read under
//! its lock before it moves; the positions go to the rows locked, with a `CASE`.
use chrono::{DateTime, Utc};
use sqlx::{MySql, QueryBuilder, Transaction};

use super::{clock, map_err, plus, push_list, MySqlStorage};
use crate::dialect::Dialect as _;
use crate::error::Result;
use crate::events::{
    validate_cursor, validate_lease, EventCursorParams, EventLease, EventLeaseParams,
};

// The other event_*_impl methods, and lease_from_row.
crate::shared::events::events_statements!(crate::mysql::MySqlStorage, sqlx::MySql);

impl MySqlStorage {
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
}

/// Give up to `limit` unsequenced events, in row order, the positions after `last`;
/// returns how many. Locking reads see the latest committed rows, whatever the
/// snapshot: the rows are locked, then numbered with a `CASE` per chunk.
async fn assign_positions(
    tx: &mut Transaction<'static, MySql>,
    last: i64,
    now: DateTime<Utc>,
    limit: u32,
) -> Result<u64> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM tenax_events WHERE seq IS NULL ORDER BY id LIMIT ? FOR UPDATE",
    )
    .bind(i64::from(limit))
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    let mut next = last;
    for chunk in ids.chunks(1000) {
        let mut qb = QueryBuilder::<MySql>::new("UPDATE tenax_events SET sequenced_at = ");
        qb.push_bind(MySql::bind_time(now));
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
        qb.build().execute(&mut **tx).await.map_err(map_err)?;
    }
    Ok(ids.len() as u64)
}
