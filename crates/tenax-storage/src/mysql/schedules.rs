//! Periodic schedules on MariaDB/MySQL: due rows are locked `FOR UPDATE SKIP LOCKED`
//! (MariaDB 10.6+, MySQL 8), so concurrent schedulers fire different schedules, and a
//! lock conflict runs the whole transaction again. The statements are
//! [`crate::shared::schedules`]'s; what MariaDB spells its own way is here.
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection};

use super::{map_err, mysql_error_number, storable, ER_DUP_ENTRY};
use crate::error::{Result, StorageError};
use crate::shared::schedules::{Inserted, Query, ScheduleSql};

crate::shared::schedules::schedule_statements!(crate::mysql::MySqlStorage, sqlx::MySql);

/// MariaDB's spelling of the schedule statements: `DATETIME(6)` times, and inserts
/// without `RETURNING` (MySQL has none) that fail on a taken key.
impl ScheduleSql for MySql {
    /// `paused` leads the index of due schedules: they are one range of it.
    const NOT_PAUSED: &'static str = "paused = FALSE";

    fn stored(t: DateTime<Utc>) -> DateTime<Utc> {
        storable(t).and_utc()
    }

    fn if_new(_on_conflict: &'static str, _returning: &'static str) -> String {
        String::new()
    }

    async fn insert_new<'q>(
        conn: &mut MySqlConnection,
        insert: Query<'q, MySql>,
    ) -> Result<Option<Inserted<MySqlRow>>> {
        match insert.execute(conn).await {
            Ok(done) => i64::try_from(done.last_insert_id())
                .map(|id| Some(Inserted::Id(id)))
                .map_err(|_| StorageError::Corrupt("id out of range".into())),
            // The key is taken: InnoDB rolls back the statement only.
            Err(err) if mysql_error_number(&err) == Some(ER_DUP_ENTRY) => Ok(None),
            Err(err) => Err(map_err(err)),
        }
    }
}
