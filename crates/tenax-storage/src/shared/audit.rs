//! The audit-log statements written once:
//! [`audit_statements!`](crate::shared::audit::audit_statements) implements the storage's
//! `audit_append_impl` and `audit_list_impl` for one backend, with what the backend
//! spells its own way taken from its [`Dialect`] and [`AuditDialect`].
//!
//! The statements are equivalent to those each backend had by hand, not the same text:
//! - an entry is appended in a transaction that reads the clock first
//!   ([`Dialect::clock`]) on every backend; PostgreSQL had one statement writing
//!   `COALESCE($1, now())` outside a transaction (the same time: the override, or the
//!   database's now);
//! - MariaDB, without `RETURNING`, reads the entry back by `LAST_INSERT_ID()` in the same
//!   transaction (it took the id from the client's answer before);
//! - the listing's filters are appended only when given, on every backend (as MariaDB
//!   did); SQLite and PostgreSQL had `(? IS NULL OR ...)` for each.
//!
//! PostgreSQL runs both under its client-side timeout (`timed`); MariaDB's storage runs
//! the append again after a lock conflict.
use crate::dialect::Dialect;

/// What the audit statements spell their own way.
pub(crate) trait AuditDialect: Dialect {
    /// The columns an entry is read with, `details` as text.
    const AUDIT_COLUMNS: &'static str = "id, at, actor, action, target, details";
    /// The bound JSON text of `details`, as its column takes it.
    const DETAILS_VALUE: &'static str = "?";
}

#[cfg(feature = "sqlite")]
impl AuditDialect for sqlx::Sqlite {}

/// `details` is `jsonb`.
#[cfg(feature = "postgres")]
impl AuditDialect for sqlx::Postgres {
    const AUDIT_COLUMNS: &'static str = "id, at, actor, action, target, details::text AS details";
    const DETAILS_VALUE: &'static str = "CAST(? AS jsonb)";
}

#[cfg(feature = "mysql")]
impl AuditDialect for sqlx::MySql {}

/// ` RETURNING` an entry's columns where the backend has it, else nothing.
pub(crate) fn returning_audit<D: AuditDialect>() -> String {
    if D::UPDATE_RETURNING {
        format!(
            " RETURNING {AUDIT_COLUMNS}",
            AUDIT_COLUMNS = D::AUDIT_COLUMNS
        )
    } else {
        String::new()
    }
}

/// Implement the audit statements for the storage `$storage` of the database `$db` (an
/// [`AuditDialect`]), both given as full paths; `timed` names the storage's method that
/// runs a call under a timeout, where it has one.
macro_rules! audit_statements {
    ($db:ty, $storage:ty $(, timed = $timed:ident)? $(,)?) => {
        mod shared {
            use sqlx::{QueryBuilder, Row as _};

            use $crate::bulk::{details_from_text, validate_audit_append, validate_audit_list};
            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::params::{AuditAppendParams, AuditListParams, AuditRecord};
            use $crate::shared::audit::{returning_audit, AuditDialect};

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;

            /// An entry read with [`AuditDialect::AUDIT_COLUMNS`].
            fn audit_from_row(row: &DbRow) -> Result<AuditRecord> {
                let id: i64 = row.try_get("id").map_err(Db::map_err)?;
                Ok(AuditRecord {
                    id,
                    at: Db::read_time(row, "at")?,
                    actor: Db::text(row, "actor")?,
                    action: Db::text(row, "action")?,
                    target: Db::text(row, "target")?,
                    details: details_from_text(id, &Db::text(row, "details")?)?,
                })
            }

            impl $storage {
                pub(in super::super) async fn audit_append_impl(
                    &self,
                    params: &AuditAppendParams,
                ) -> Result<AuditRecord> {
                    let details = validate_audit_append(params)?;
                    let call = async {
                        let mut tx = self.begin().await?;
                        let now = Db::clock(&mut *tx, params.now).await?;
                        let sql = sql!(
                            Db,
                            "INSERT INTO tenax_audit (at, actor, action, target, details)
                             VALUES (?, ?, ?, ?, {DETAILS_VALUE}){RETURNING}",
                            DETAILS_VALUE = <Db as AuditDialect>::DETAILS_VALUE,
                            RETURNING = returning_audit::<Db>(),
                        );
                        let insert = sqlx::query(sql)
                            .bind(Db::bind_time(now))
                            .bind(&params.actor)
                            .bind(&params.action)
                            .bind(&params.target)
                            .bind(&details);
                        let row = if Db::UPDATE_RETURNING {
                            insert.fetch_one(&mut *tx).await.map_err(Db::map_err)?
                        } else {
                            insert.execute(&mut *tx).await.map_err(Db::map_err)?;
                            let sql = sql!(
                                Db,
                                "SELECT {AUDIT_COLUMNS} FROM tenax_audit WHERE id = LAST_INSERT_ID()",
                                AUDIT_COLUMNS = <Db as AuditDialect>::AUDIT_COLUMNS,
                            );
                            sqlx::query(sql)
                                .fetch_one(&mut *tx)
                                .await
                                .map_err(Db::map_err)?
                        };
                        let record = audit_from_row(&row)?;
                        tx.commit().await.map_err(Db::map_err)?;
                        Ok(record)
                    };
                    $(let call = self.$timed(call);)?
                    call.await
                }

                pub(in super::super) async fn audit_list_impl(
                    &self,
                    params: &AuditListParams,
                ) -> Result<Vec<AuditRecord>> {
                    validate_audit_list(params)?;
                    let call = async {
                        let select = sql!(
                            Db,
                            "SELECT {AUDIT_COLUMNS} FROM tenax_audit WHERE TRUE",
                            AUDIT_COLUMNS = <Db as AuditDialect>::AUDIT_COLUMNS,
                        );
                        let mut qb = QueryBuilder::<Db>::new(select);
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
                        let rows = qb.build().fetch_all(self.pool()).await.map_err(Db::map_err)?;
                        rows.iter().map(audit_from_row).collect()
                    };
                    $(let call = self.$timed(call);)?
                    call.await
                }
            }
        }
    };
}
pub(crate) use audit_statements;
