//! The connection pool every backend uses: a pooled connection is checked with a round
//! trip before use only when it has sat idle.
//!
//! sqlx checks each connection when it is released (a failed check closes it) and, by
//! default, again each time it is acquired. The second check is a round trip on the
//! path of every claim, completion and enqueue, and it guards against little: a
//! connection released moments ago was found alive then. A connection that has been
//! idle for a while may have been closed by the server (a restart, an idle timeout, a
//! failover), so that one is still checked. A connection lost in between fails its
//! statement as a transient error, as one lost just after a check always could, and
//! the release check closes it.
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database};

/// The longest a heartbeat waits for its connection. While the server is down, sqlx
/// retries the connection with a doubling sleep capped at a fifth of this: a worker
/// whose heartbeat retries at once after a failure (as the runtime's does) finds its
/// database back within about 200 ms of its return.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const LEASE_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a pooled connection may sit idle and still be used without a check.
pub(crate) const CHECK_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Pool options with the check on acquire limited to connections idle for at least
/// [`CHECK_AFTER_IDLE`].
pub(crate) fn options<DB: Database>() -> PoolOptions<DB> {
    PoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn: &mut DB::Connection, meta| {
            Box::pin(async move {
                if meta.idle_for >= CHECK_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}
