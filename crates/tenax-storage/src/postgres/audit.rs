//! The audit log of operator actions on PostgreSQL.
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{map_err, PgStorage, NOW};
use crate::bulk::{details_from_text, validate_audit_append, validate_audit_list};
use crate::error::Result;
use crate::params::{AuditAppendParams, AuditListParams, AuditRecord};

const AUDIT_COLUMNS: &str = "id, at, actor, action, target, details::text AS details";

fn audit_from_row(row: &PgRow) -> Result<AuditRecord> {
    let id: i64 = row.try_get("id").map_err(map_err)?;
    let details: String = row.try_get("details").map_err(map_err)?;
    Ok(AuditRecord {
        id,
        at: row.try_get("at").map_err(map_err)?,
        actor: row.try_get("actor").map_err(map_err)?,
        action: row.try_get("action").map_err(map_err)?,
        target: row.try_get("target").map_err(map_err)?,
        details: details_from_text(id, &details)?,
    })
}

impl PgStorage {
    pub(super) async fn audit_append_impl(
        &self,
        params: &AuditAppendParams,
    ) -> Result<AuditRecord> {
        let details = validate_audit_append(params)?;
        self.timed(async {
            let row = sqlx::query(&format!(
                "INSERT INTO tenax_audit (at, actor, action, target, details)
                 VALUES ({NOW}, $2, $3, $4, $5::jsonb)
                 RETURNING {AUDIT_COLUMNS}"
            ))
            .bind(params.now)
            .bind(&params.actor)
            .bind(&params.action)
            .bind(&params.target)
            .bind(&details)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
            audit_from_row(&row)
        })
        .await
    }

    pub(super) async fn audit_list_impl(
        &self,
        params: &AuditListParams,
    ) -> Result<Vec<AuditRecord>> {
        validate_audit_list(params)?;
        self.timed(async {
            let rows = sqlx::query(&format!(
                "SELECT {AUDIT_COLUMNS} FROM tenax_audit
                 WHERE ($1::bigint IS NULL OR id < $1)
                   AND ($2::text IS NULL OR actor = $2)
                   AND ($3::text IS NULL OR action = $3)
                 ORDER BY id DESC
                 LIMIT $4"
            ))
            .bind(params.before_id)
            .bind(params.actor.as_deref())
            .bind(params.action.as_deref())
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(audit_from_row).collect()
        })
        .await
    }
}
