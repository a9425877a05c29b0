//! The audit log of operator actions on SQLite.
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::rows::ms;
use super::{clock, map_err, SqliteStorage};
use crate::bulk::{details_from_text, validate_audit_append, validate_audit_list};
use crate::error::Result;
use crate::params::{AuditAppendParams, AuditListParams, AuditRecord};

fn audit_from_row(row: &SqliteRow) -> Result<AuditRecord> {
    let id: i64 = row.try_get("id").map_err(map_err)?;
    let details: String = row.try_get("details").map_err(map_err)?;
    Ok(AuditRecord {
        id,
        at: ms(row.try_get("at").map_err(map_err)?)?,
        actor: row.try_get("actor").map_err(map_err)?,
        action: row.try_get("action").map_err(map_err)?,
        target: row.try_get("target").map_err(map_err)?,
        details: details_from_text(id, &details)?,
    })
}

impl SqliteStorage {
    pub(super) async fn audit_append_impl(
        &self,
        params: &AuditAppendParams,
    ) -> Result<AuditRecord> {
        let details = validate_audit_append(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let row = sqlx::query(
            "INSERT INTO tenax_audit (at, actor, action, target, details)
             VALUES (?1, ?2, ?3, ?4, ?5)
             RETURNING id, at, actor, action, target, details",
        )
        .bind(now)
        .bind(&params.actor)
        .bind(&params.action)
        .bind(&params.target)
        .bind(details)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let record = audit_from_row(&row)?;
        tx.commit().await.map_err(map_err)?;
        Ok(record)
    }

    pub(super) async fn audit_list_impl(
        &self,
        params: &AuditListParams,
    ) -> Result<Vec<AuditRecord>> {
        validate_audit_list(params)?;
        let rows = sqlx::query(
            "SELECT id, at, actor, action, target, details FROM tenax_audit
             WHERE (?1 IS NULL OR id < ?1)
               AND (?2 IS NULL OR actor = ?2)
               AND (?3 IS NULL OR action = ?3)
             ORDER BY id DESC
             LIMIT ?4",
        )
        .bind(params.before_id)
        .bind(params.actor.as_deref())
        .bind(params.action.as_deref())
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(audit_from_row).collect()
    }
}
