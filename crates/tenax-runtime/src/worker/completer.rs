//! Writing outcomes. Successes go to the completer, which writes many of them in one
//! transaction ([`Storage::task_complete_many_if_leased`]); failures, hand-backs and
//! cancels are written by their own fenced write. Every write is retried on transient
//! errors while the lease can still be held, and each outcome is answered only after
//! the commit that holds it.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tenax_core::CompensationState;
use tenax_storage::{
    BatchCompletion, FailNext, Lease, Storage, StorageError, TaskCompleteParams, TaskFailParams,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep, Instant};
use tracing::{debug, error, warn};

use super::outcome::Decision;
use super::Shared;
use crate::config::WorkerConfig;

/// A success waiting in the completer for its batch.
pub(super) struct PendingCompletion {
    pub(super) params: TaskCompleteParams,
    /// What was written: `Some(true)` once the batch committed with it.
    pub(super) written: oneshot::Sender<Option<bool>>,
}

/// Write what an ended attempt decided; returns what was written, for the metrics.
pub(super) async fn write_outcome(
    shared: &Arc<Shared>,
    lease: Lease,
    decision: Decision,
) -> crate::metrics::Outcome {
    use crate::metrics::Outcome;
    let (written, outcome) = match decision {
        Decision::Complete(result, compensation) => {
            let none = compensation == CompensationState::None;
            let written = write_complete(shared, lease, result, compensation).await;
            (
                written,
                Outcome::Succeeded {
                    compensation_none: none,
                },
            )
        }
        Decision::Fail(error, next) => {
            let outcome = match next {
                FailNext::Retry(_) => Outcome::Retried,
                FailNext::Dead => Outcome::Dead,
                FailNext::HandBack => Outcome::HandedBack,
                FailNext::Cancelled => Outcome::Cancelled,
            };
            (write_fail(shared, lease, error, next).await, outcome)
        }
        Decision::Committed => {
            debug!("attempt recorded by its own transaction");
            (
                Some(true),
                Outcome::Succeeded {
                    compensation_none: false,
                },
            )
        }
        Decision::Drop(why) => {
            warn!(reason = why, "handler stopped; its outcome is dropped, the task will be retried after the lease expires");
            (Some(false), Outcome::Dropped)
        }
    };
    match written {
        Some(true) => outcome,
        Some(false) => Outcome::Dropped,
        None => Outcome::Unwritten,
    }
}

async fn write_complete(
    shared: &Arc<Shared>,
    lease: Lease,
    result: Option<String>,
    compensation: CompensationState,
) -> Option<bool> {
    let params = TaskCompleteParams {
        lease,
        result,
        compensation,
        now: None,
    };
    let completer = shared.completer().clone();
    if let Some(completer) = completer {
        let (tx, rx) = oneshot::channel();
        let pending = PendingCompletion {
            params: params.clone(),
            written: tx,
        };
        let queued = completer.send(pending).is_ok();
        drop(completer);
        if queued {
            match rx.await {
                Ok(written) => {
                    report_write(written, "succeeded");
                    return written;
                }
                // The completer stopped with this success unanswered: whether its
                // batch committed is unknown, and the write below (fenced by the
                // epoch) lands only if it did not.
                Err(_) => {
                    warn!("the completion batch ended without an answer; writing the outcome alone")
                }
            }
        }
    }
    let written = complete_alone(shared.storage.as_ref(), shared.config.lease_ttl, &params).await;
    report_write(written, "succeeded");
    written
}

async fn write_fail(
    shared: &Arc<Shared>,
    lease: Lease,
    error: String,
    next: FailNext,
) -> Option<bool> {
    let params = TaskFailParams {
        lease,
        error,
        next,
        now: None,
    };
    let written = fail_alone(shared.storage.as_ref(), shared.config.lease_ttl, &params).await;
    let what = match next {
        FailNext::Retry(_) => "failed, will retry",
        FailNext::Dead => "failed, dead",
        FailNext::HandBack => "handed back",
        FailNext::Cancelled => "cancelled",
    };
    report_write(written, what);
    written
}

pub(super) fn report_write(written: Option<bool>, what: &str) {
    match written {
        Some(true) => debug!(outcome = what, "attempt recorded"),
        Some(false) => warn!(
            outcome = what,
            "lease lost before the outcome was written; outcome dropped"
        ),
        None => warn!(
            outcome = what,
            "could not write the outcome; the lease will expire and the task be retried"
        ),
    }
}

/// Retry a fenced write on transient storage errors while the lease can still be held.
/// A failure of Tenax's own write is never recorded as a failure of the handler.
async fn with_retries<F, Fut>(lease_ttl: Duration, lease: Lease, write: F) -> Option<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, StorageError>>,
{
    match retried(lease_ttl, lease, write).await {
        Ok(written) => Some(written),
        Err(e) => {
            error!(task.id = %lease.id, error = %e, "writing the outcome failed; giving up");
            None
        }
    }
}

/// [`with_retries`], answering the error it gave up on.
async fn retried<F, Fut>(
    lease_ttl: Duration,
    lease: Lease,
    mut write: F,
) -> Result<bool, StorageError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, StorageError>>,
{
    let give_up = Instant::now() + lease_ttl;
    let mut pause = Duration::from_millis(50);
    loop {
        match write().await {
            Err(e) if e.is_transient() && Instant::now() + pause < give_up => {
                warn!(task.id = %lease.id, error = %e, "writing the outcome failed; retrying");
                let jittered = rand::rng().random_range(pause / 2..=pause);
                sleep(jittered).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// The result stored in place of one the database refused for good.
pub(super) const RESULT_NOT_STORED: &str =
    r#"{"tenax":"the result could not be stored: the database refused it (see the worker's log)"}"#;
/// The error stored in place of one the database refused for good.
pub(super) const ERROR_NOT_STORED: &str =
    "the attempt's error could not be stored: the database refused it (see the worker's log)";

/// Write a success by its own transaction, retried on transient errors. A result the
/// database refuses for good is surfaced, not dropped: the success is written with
/// [`RESULT_NOT_STORED`] in its place, so the task never stays `running` until its
/// lease expires (and runs again).
async fn complete_alone(
    storage: &dyn Storage,
    lease_ttl: Duration,
    params: &TaskCompleteParams,
) -> Option<bool> {
    let lease = params.lease;
    match retried(lease_ttl, lease, || storage.task_complete_if_leased(params)).await {
        Ok(written) => Some(written),
        Err(e) if !e.is_transient() && params.result.is_some() => {
            error!(task.id = %lease.id, error = %e, "the database refused the result; writing the success without it");
            let surfaced = TaskCompleteParams {
                result: Some(RESULT_NOT_STORED.to_owned()),
                ..params.clone()
            };
            with_retries(lease_ttl, lease, || {
                storage.task_complete_if_leased(&surfaced)
            })
            .await
        }
        Err(e) => {
            error!(task.id = %lease.id, error = %e, "writing the outcome failed; giving up");
            None
        }
    }
}

/// Write a failure by its own transaction, retried on transient errors; an error text
/// the database refuses for good is replaced by [`ERROR_NOT_STORED`].
async fn fail_alone(
    storage: &dyn Storage,
    lease_ttl: Duration,
    params: &TaskFailParams,
) -> Option<bool> {
    let lease = params.lease;
    match retried(lease_ttl, lease, || storage.task_fail_if_leased(params)).await {
        Ok(written) => Some(written),
        Err(e) if !e.is_transient() => {
            error!(task.id = %lease.id, error = %e, "the database refused the error; writing the failure without it");
            let surfaced = TaskFailParams {
                error: ERROR_NOT_STORED.to_owned(),
                ..params.clone()
            };
            with_retries(lease_ttl, lease, || storage.task_fail_if_leased(&surfaced)).await
        }
        Err(e) => {
            error!(task.id = %lease.id, error = %e, "writing the outcome failed; giving up");
            None
        }
    }
}

/// Collects successes and writes each batch in one transaction: a batch is written
/// when it holds `complete_batch` successes, when every attempt in flight has joined
/// it, or `batch_linger` after its first success arrived. Each success is answered
/// only after its batch committed; if the batch fails, each of its successes is
/// written alone (with retries), so none is dropped or reported before its commit.
/// Ends when the channel is closed and empty.
pub(super) async fn completer_loop(
    storage: Arc<dyn Storage>,
    config: WorkerConfig,
    in_flight: Arc<AtomicUsize>,
    mut rx: mpsc::UnboundedReceiver<PendingCompletion>,
) {
    let max = config.complete_batch.max(1) as usize;
    let mut params = Vec::with_capacity(max);
    let mut answers = Vec::with_capacity(max);
    while let Some(first) = rx.recv().await {
        params.push(first.params);
        answers.push(first.written);
        let until = Instant::now() + config.batch_linger;
        while params.len() < max {
            let next = match rx.try_recv() {
                Ok(next) => next,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    if params.len() >= in_flight.load(Ordering::SeqCst) {
                        break; // every running attempt is in this batch
                    }
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(next)) => next,
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            params.push(next.params);
            answers.push(next.written);
        }
        let written = write_batch(storage.as_ref(), config.lease_ttl, &params).await;
        for (answer, written) in answers.drain(..).zip(written) {
            // An executor that stopped waiting has nothing left to report.
            let _ = answer.send(written);
        }
        params.clear();
    }
}

/// Write one batch of successes; what was written for each, in order. A success the
/// batch left alone (a workflow task or a compensation) is then written by its own
/// transaction.
pub(super) async fn write_batch(
    storage: &dyn Storage,
    lease_ttl: Duration,
    params: &[TaskCompleteParams],
) -> Vec<Option<bool>> {
    let answers = match storage.task_complete_many_if_leased(params).await {
        Ok(answers) if answers.len() == params.len() => answers,
        Ok(answers) => {
            error!(
                size = params.len(),
                answers = answers.len(),
                "the completion batch answered for another number of tasks; writing each alone"
            );
            return write_each(storage, lease_ttl, params.iter()).await;
        }
        Err(e) => {
            warn!(size = params.len(), error = %e, "the completion batch failed; writing each alone");
            return write_each(storage, lease_ttl, params.iter()).await;
        }
    };
    debug!(size = params.len(), "completion batch committed");
    let alone = params
        .iter()
        .zip(&answers)
        .filter(|(_, answer)| **answer == BatchCompletion::Alone)
        .map(|(p, _)| p);
    let mut alone = write_each(storage, lease_ttl, alone).await.into_iter();
    answers
        .into_iter()
        .map(|answer| match answer {
            BatchCompletion::Landed => Some(true),
            BatchCompletion::Lost => Some(false),
            // In the order given, one for each success left alone.
            BatchCompletion::Alone => alone.next().flatten(),
        })
        .collect()
}

/// Write each success by its own transaction, retried on transient errors. A success
/// of a batch whose commit failed after all is then found finished: reported as lost,
/// but nothing is written twice.
async fn write_each<'a>(
    storage: &'a dyn Storage,
    lease_ttl: Duration,
    params: impl Iterator<Item = &'a TaskCompleteParams>,
) -> Vec<Option<bool>> {
    futures::future::join_all(params.map(|p| complete_alone(storage, lease_ttl, p))).await
}
