//! The threshold-alert statements (see [`crate::alert_state`]) written once:
//! [`alert_state_statements!`](crate::shared::alert_state::alert_state_statements)
//! implements the storage's `alert_transition_impl` for one backend: in one transaction
//! on the database clock (or the caller's override), the write guarded by the alert's
//! current state, and the outbox row of the message when the state changed.
//!
//! The statements are equivalent to those each backend had by hand, not the same text:
//! `firing` is written and compared as `TRUE`/`FALSE` or a bound `bool` on every backend
//! (SQLite and MariaDB hold `1`/`0`, which those are); the resolving write is
//! `SET firing = ?, ... AND firing = ?` with the new state and its opposite bound; and
//! PostgreSQL reads the transaction's clock once ([`Dialect::clock`](crate::dialect::Dialect::clock))
//! instead of writing `COALESCE($1, now())` into each statement (the same time: the
//! transaction's start, or the override).
//!
//! The write that starts firing is the backend's own where it must be: SQLite and
//! PostgreSQL take the shared conditional upsert (`ON CONFLICT ... DO UPDATE ... WHERE`);
//! MariaDB, which has no conditional upsert, passes its own `fire` (lock the row or its
//! gap, then update or insert).

/// Implement `alert_transition_impl` for the storage `$storage` of the database `$db` (a
/// [`Dialect`](crate::dialect::Dialect)), both given as full paths. A backend without a
/// conditional upsert passes its own `fire { async fn fire(conn: &mut DbConn, params:
/// &AlertTransitionParams, now: DateTime<Utc>) -> Result<bool> {...} }`, which returns
/// whether this call started the alert firing; it sees the module's imports, `Db`,
/// `DbConn` and `set_firing`.
macro_rules! alert_state_statements {
    ($db:ty, $storage:ty, fire { $($fire:tt)* } $(,)?) => {
        mod shared {
            use chrono::{DateTime, Utc};

            use $crate::alert_state::{alert_delivery_id, validate_transition, AlertTransitionParams};
            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;

            type Db = $db;
            type DbConn = <$db as sqlx::Database>::Connection;

            $($fire)*

            /// Set the alert's state to `firing` if it is the other one now; returns
            /// whether this call changed it.
            async fn set_firing(
                conn: &mut DbConn,
                params: &AlertTransitionParams,
                firing: bool,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                let sql = sql!(
                    Db,
                    "UPDATE tenax_alert_state SET firing = ?, since = ?
                     WHERE queue = ? AND alert = ? AND firing = ?"
                );
                let done = sqlx::query(sql)
                    .bind(firing)
                    .bind(Db::bind_time(now))
                    .bind(&params.queue)
                    .bind(&params.alert)
                    .bind(!firing)
                    .execute(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                Ok(done.rows_affected() == 1)
            }

            impl $storage {
                pub(in super::super) async fn alert_transition_impl(
                    &self,
                    params: &AlertTransitionParams,
                ) -> Result<bool> {
                    validate_transition(params)?;
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let changed = if params.firing {
                        fire(&mut *tx, params, now).await?
                    } else {
                        set_firing(&mut *tx, params, false, now).await?
                    };
                    if let (true, Some(message)) = (changed, &params.message) {
                        let sql = sql!(
                            Db,
                            "INSERT INTO tenax_outbox
                                 (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
                             VALUES (?, 'alert', 0, NULL, ?, ?, ?)"
                        );
                        let at = Db::bind_time(now);
                        sqlx::query(sql)
                            .bind(alert_delivery_id())
                            .bind(message)
                            .bind(at)
                            .bind(at)
                            .execute(&mut *tx)
                            .await
                            .map_err(Db::map_err)?;
                    }
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(changed)
                }
            }
        }
    };
    ($db:ty, $storage:ty $(,)?) => {
        $crate::shared::alert_state::alert_state_statements!($db, $storage, fire {
            /// Start the alert firing unless it is already: one conditional upsert.
            async fn fire(
                conn: &mut DbConn,
                params: &AlertTransitionParams,
                now: DateTime<Utc>,
            ) -> Result<bool> {
                let sql = sql!(
                    Db,
                    "INSERT INTO tenax_alert_state (queue, alert, firing, since)
                     VALUES (?, ?, TRUE, ?)
                     ON CONFLICT (queue, alert) DO UPDATE SET firing = TRUE, since = excluded.since
                     WHERE tenax_alert_state.firing = FALSE"
                );
                let done = sqlx::query(sql)
                    .bind(&params.queue)
                    .bind(&params.alert)
                    .bind(Db::bind_time(now))
                    .execute(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                Ok(done.rows_affected() == 1)
            }
        });
    };
}
pub(crate) use alert_state_statements;
