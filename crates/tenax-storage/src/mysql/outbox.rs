//! The outbox of outbound deliveries on MariaDB/MySQL (see [`crate::outbox`]): the
//! statements are [`crate::shared::outbox`]'s, the claim and the settle included (the
//! claim locks the rows it looks up `FOR UPDATE SKIP LOCKED`); what MariaDB spells its
//! own way is here.
use std::time::Duration;

use sqlx::MySql;

use super::{minus, plus, DbTime};
use crate::shared::outbox::{OutboxClaimSql, OutboxSql};

crate::shared::outbox::outbox_statements!(
    crate::mysql::MySqlStorage,
    sqlx::MySql,
    claim_and_settle
);

/// MariaDB's spelling of the outbox statements: `DATETIME(6)` times and their
/// arithmetic, saturating at the ends of its range.
impl OutboxSql for MySql {
    const OLDEST_AGE_MS: &'static str =
        "CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), ?) DIV 1000 AS SIGNED)";
    const SEEN_AGAIN: &'static str = "ON DUPLICATE KEY UPDATE seen_at = VALUES(seen_at)";

    fn earlier(t: DbTime, d: Duration) -> DbTime {
        minus(t, d)
    }
}

impl OutboxClaimSql for MySql {
    fn later(t: DbTime, d: Duration) -> DbTime {
        plus(t, d)
    }
}
