//! Wake-ups across processes on PostgreSQL: one `LISTEN` connection per storage, kept
//! open and reconnected with a jittered backoff. A notification on the wake channel
//! bumps the wake-up channel the workers watch; one on the finish channel is passed to
//! the long-polls waiting for that task.
use std::time::Duration;

use rand::Rng;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tenax_core::TaskId;
use tokio::sync::{broadcast, watch};

use super::{FINISH_CHANNEL, WAKE_CHANNEL};
use crate::FinishHint;

/// Keep a LISTEN connection; every wake-up (or reconnection) bumps `wake`, every
/// finish is sent to `finished` (a reconnection sends [`FinishHint::Unknown`]: what
/// was notified meanwhile is lost).
pub(super) async fn listen(
    pool: PgPool,
    wake: watch::Sender<u64>,
    finished: broadcast::Sender<FinishHint>,
) {
    let mut failures = 0u32;
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, "wake-up listener cannot connect; workers keep polling");
                backoff(failures).await;
                continue;
            }
        };
        if let Err(e) = listener.listen_all([WAKE_CHANNEL, FINISH_CHANNEL]).await {
            failures = failures.saturating_add(1);
            tracing::warn!(error = %e, "LISTEN failed; workers keep polling");
            backoff(failures).await;
            continue;
        }
        // Notifications sent while we were away are lost: look once.
        if failures > 0 {
            wake.send_modify(|n| *n = n.wrapping_add(1));
            // No receiver is not an error: nobody waits.
            let _ = finished.send(FinishHint::Unknown);
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(note)) if note.channel() == FINISH_CHANNEL => {
                    let hint = note
                        .payload()
                        .parse()
                        .map_or(FinishHint::Unknown, |id| FinishHint::Task(TaskId(id)));
                    let _ = finished.send(hint);
                }
                Ok(Some(_)) => wake.send_modify(|n| *n = n.wrapping_add(1)),
                Ok(None) | Err(_) => {
                    tracing::warn!("wake-up listener lost its connection; reconnecting");
                    failures = 1;
                    break;
                }
            }
        }
        backoff(failures).await;
    }
}

async fn backoff(failures: u32) {
    let ceiling = 100u64.saturating_mul(1 << failures.min(6)).min(5_000);
    let wait = rand::rng().random_range(ceiling / 2..=ceiling);
    tokio::time::sleep(Duration::from_millis(wait)).await;
}
