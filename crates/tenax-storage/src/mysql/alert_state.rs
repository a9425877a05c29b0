//! Threshold alert state on MariaDB/MySQL (see [`crate::alert_state`]): the statements
//! are written once, in [`crate::shared::alert_state`], except the write that starts an
//! alert firing. MariaDB has no conditional upsert, so it locks the alert's row (or the
//! gap where it would be) first: concurrent callers take turns, and exactly one of them
//! changes the state. The storage runs the transaction again after a lock conflict.
crate::shared::alert_state::alert_state_statements!(sqlx::MySql, crate::mysql::MySqlStorage, fire {
    /// Start the alert firing unless it is already; returns whether this call did.
    async fn fire(
        conn: &mut DbConn,
        params: &AlertTransitionParams,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let sql = "SELECT firing FROM tenax_alert_state WHERE queue = ? AND alert = ? FOR UPDATE";
        let firing: Option<i8> = sqlx::query_scalar(sql)
            .bind(&params.queue)
            .bind(&params.alert)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Db::map_err)?;
        match firing {
            Some(1) => Ok(false),
            Some(_) => set_firing(conn, params, true, now).await,
            None => {
                let sql = "INSERT IGNORE INTO tenax_alert_state (queue, alert, firing, since)
                           VALUES (?, ?, TRUE, ?)";
                let done = sqlx::query(sql)
                    .bind(&params.queue)
                    .bind(&params.alert)
                    .bind(Db::bind_time(now))
                    .execute(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                Ok(done.rows_affected() == 1)
            }
        }
    }
});
