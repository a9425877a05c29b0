//! Times on MariaDB/MySQL: how a time is bound and stored (`DATETIME(6)`, UTC,
//! microseconds, within the column's range), and the database clock.
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, SubsecRound, TimeDelta, Utc};
use sqlx::{MySql, Transaction};

use super::map_err;
use crate::error::Result;

/// A time as a `DATETIME(6)` column holds it: UTC wall-clock time, microseconds.
///
/// Times are bound as `NaiveDateTime`, which sqlx sends as DATETIME. A `DateTime<Utc>`
/// parameter is sent as TIMESTAMP, and the server turns a TIMESTAMP parameter past
/// 2038-01-19 into NULL.
pub(super) type DbTime = NaiveDateTime;

/// The range a `DATETIME(6)` holds: 1000-01-01 to 9999-12-31 23:59:59.999999.
pub(super) fn datetime_range() -> (DbTime, DbTime) {
    let min = DateTime::from_timestamp_micros(-30_610_224_000_000_000);
    let max = DateTime::from_timestamp_micros(253_402_300_799_999_999);
    (
        min.map_or(NaiveDateTime::MIN, |t| t.naive_utc()),
        max.map_or(NaiveDateTime::MAX, |t| t.naive_utc()),
    )
}

/// A time as stored: microseconds, within the `DATETIME` range. Times outside it mean
/// the same thing at its ends ("long ago", "never").
pub(super) fn storable(t: DateTime<Utc>) -> DbTime {
    let (min, max) = datetime_range();
    t.naive_utc().trunc_subsecs(6).clamp(min, max)
}

/// `t + d`, saturating at the end of the `DATETIME` range.
pub(super) fn plus(t: DbTime, d: Duration) -> DbTime {
    let (_, max) = datetime_range();
    TimeDelta::from_std(d.min(crate::MAX_DELAY))
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .map_or(max, |t| t.min(max))
}

/// `t - d`, saturating at the start of the `DATETIME` range.
pub(super) fn minus(t: DbTime, d: Duration) -> DbTime {
    let (min, _) = datetime_range();
    TimeDelta::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .map_or(min, |t| t.max(min))
}

/// The database clock, or the caller's override, read inside the transaction that
/// uses it.
pub(super) async fn clock(
    tx: &mut Transaction<'static, MySql>,
    now: Option<DateTime<Utc>>,
) -> Result<DbTime> {
    match now {
        Some(now) => Ok(storable(now)),
        None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&mut **tx)
            .await
            .map_err(map_err),
    }
}
