//! The audit log of operator actions on MariaDB/MySQL.
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{QueryBuilder, Row};

use super::rows::text;
use super::{clock, map_err, MySqlStorage};
use crate::bulk::{details_from_text, validate_audit_append, validate_audit_list};
use crate::error::{Result, StorageError};
use crate::params::{AuditAppendParams, AuditListParams, AuditRecord};

const AUDIT_COLUMNS: &str = "id, at, actor, action, target, details";

fn audit_from_row(row: &MySqlRow) -> Result<AuditRecord> {
    let id: i64 = row.try_get("id").map_err(map_err)?;
    Ok(AuditRecord {
        id,
        at: row.try_get::<DateTime<Utc>, _>("at").map_err(map_err)?,
        actor: text(row, "actor")?,
        action: text(row, "action")?,
        target: text(row, "target")?,
        details: details_from_text(id, &text(row, "details")?)?,
    })
}

impl MySqlStorage {
    pub(super) async fn audit_append_impl(
        &self,
        params: &AuditAppendParams,
    ) -> Result<AuditRecord> {
        let details = validate_audit_append(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let done = sqlx::query(
            "INSERT INTO tenax_audit (at, actor, action, target, details)
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(now)
        .bind(&params.actor)
        .bind(&params.action)
        .bind(&params.target)
        .bind(&details)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let id = i64::try_from(done.last_insert_id())
            .map_err(|_| StorageError::Corrupt("audit id out of range".into()))?;
        let row = sqlx::query(&format!(
            "SELECT {AUDIT_COLUMNS} FROM tenax_audit WHERE id = ?"
        ))
        .bind(id)
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
        let mut qb = QueryBuilder::new(format!(
            "SELECT {AUDIT_COLUMNS} FROM tenax_audit WHERE TRUE"
        ));
        if let Some(before) = params.before_id {
            qb.push(" AND id < ").push_bind(before);
        }
        if let Some(actor) = &params.actor {
            qb.push(" AND actor = ").push_bind(actor.as_str());
        }
        if let Some(action) = &params.action {
            qb.push(" AND action = ").push_bind(action.as_str());
        }
        qb.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(params.limit));
        let rows = qb.build().fetch_all(&self.pool).await.map_err(map_err)?;
        rows.iter().map(audit_from_row).collect()
    }
}
