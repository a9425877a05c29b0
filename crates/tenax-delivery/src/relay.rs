//! The relay of task events to a broker, written once: [`Relay`] holds the relay's
//! database lease, reads the sequenced events after its cursor a page at a time, hands
//! them to its [`Broker`], and moves the cursor past what the broker acknowledged. Each
//! broker writes only its own part: connecting, and publishing a page in order.
//!
//! - One node at a time holds the lease (`relay:<broker>`), renewed a third of the way
//!   through it; a node that does not hold it keeps no connection.
//! - The cursor moves, fenced on the lease's epoch, only past events the broker
//!   acknowledged; publishing stops two thirds of the way through the lease, so a
//!   holder whose lease lapsed publishes nothing more.
//! - A failure (a lost connection, a refused or unconfirmed message, a panic in the
//!   broker's client) drops the connection and pauses, doubling from 250 ms up to
//!   10 s with jitter, then publishes again from the cursor. A broker outage delays
//!   events and loses none; a consumer may see a message twice after such a retry and
//!   deduplicates on the event's id, which every broker carries.
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tenax_core::Secrets;
use tenax_storage::{
    EventCursorParams, EventLease, EventLeaseParams, EventListParams, EventRecord, Storage,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::EventsConfig;

/// First pause after a failure; it doubles up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest pause after failures in a row.
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// A broker's part of a relay.
pub trait Broker: Send + Sync + 'static {
    /// Its name in logs and in the `relay` label of `tenax_events_relayed_total`.
    const NAME: &'static str;
    /// The relay's lease name, also its name in the pruner's list.
    const LEASE: &'static str;
    /// A connection, ready to publish.
    type Link: Send + Sync;

    /// Connect, and declare what the broker needs (a stream, an exchange, a queue).
    fn connect(&self) -> impl Future<Output = Result<Self::Link, String>> + Send;

    /// Whether `link` still works; one that does not is replaced before the next page.
    fn usable(&self, _link: &Self::Link) -> bool {
        true
    }

    /// Close `link`, best effort: the broker may be gone already.
    fn close(&self, link: Self::Link) -> impl Future<Output = ()> + Send {
        async move { drop(link) }
    }

    /// Publish `events` (a page, in position order) on `link`, starting none after
    /// `until`, with secret payload fields masked by `secrets`.
    fn publish(
        &self,
        link: &Self::Link,
        events: &[EventRecord],
        secrets: &Secrets,
        until: Instant,
    ) -> impl Future<Output = Published> + Send;
}

/// What a broker made of a page.
#[derive(Debug, Default)]
pub struct Published {
    /// The position of the last event acknowledged, every one before it acknowledged
    /// too; `None` when none was.
    pub last: Option<i64>,
    /// How many events that is.
    pub sent: usize,
    /// Why it stopped before the end of the page, if it did.
    pub failure: Option<String>,
}

/// Publishes sequenced events through `B` while it holds `B`'s lease.
pub struct Relay<B: Broker> {
    storage: Arc<dyn Storage>,
    holder: String,
    events: EventsConfig,
    broker: B,
}

enum Step {
    /// Published this many events, and the cursor moved past them.
    Sent(usize),
    /// The lease is gone.
    LostLease,
}

impl<B: Broker> Relay<B> {
    /// A relay for this node (`holder` names it in the lease).
    pub fn new(
        storage: Arc<dyn Storage>,
        holder: impl Into<String>,
        events: EventsConfig,
        broker: impl Into<B>,
    ) -> Self {
        Self {
            storage,
            holder: holder.into(),
            events,
            broker: broker.into(),
        }
    }

    /// Run until `shutdown`. Broker and storage errors are logged and retried after a
    /// bounded, growing pause, on a new connection; the cursor moves only past
    /// acknowledged events.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut link: Option<B::Link> = None;
        let mut lease: Option<EventLease> = None;
        let mut renewed_at = Instant::now();
        let mut failures: u32 = 0;
        loop {
            if lease.is_none() || renewed_at.elapsed() >= self.events.lease_ttl / 3 {
                let asked = Instant::now();
                lease = self.renew(lease.as_ref()).await;
                if lease.is_some() {
                    renewed_at = asked;
                }
            }
            let mut busy = false;
            let mut failed = false;
            let mut lost = false;
            if let Some(held) = lease.as_mut() {
                if link.as_ref().is_some_and(|l| !self.broker.usable(l)) {
                    tracing::warn!(
                        relay = B::NAME,
                        "the broker connection was lost; reconnecting"
                    );
                    if let Some(old) = link.take() {
                        self.broker.close(old).await;
                    }
                }
                if link.is_none() {
                    match self.broker.connect().await {
                        Ok(new) => {
                            tracing::info!(relay = B::NAME, "connected to the broker");
                            link = Some(new);
                        }
                        Err(e) => {
                            tracing::warn!(relay = B::NAME, error = %e, "connecting to the broker failed; retrying");
                            failed = true;
                        }
                    }
                }
                if let Some(current) = &link {
                    // A panic in a step (a bug, or in the broker's client) must not end
                    // the relay: it counts as a failed step, and the cursor stays.
                    let step = AssertUnwindSafe(self.step(current, held, renewed_at))
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|_| Err("relaying a page panicked".to_owned()));
                    match step {
                        Ok(Step::Sent(n)) => busy = n >= self.events.batch as usize,
                        Ok(Step::LostLease) => {
                            tracing::info!(relay = B::NAME, "the relay lease was lost");
                            lost = true;
                        }
                        Err(e) => {
                            tracing::warn!(relay = B::NAME, error = %e, "relaying events failed; reconnecting and publishing again from the cursor");
                            failed = true;
                            if let Some(old) = link.take() {
                                self.broker.close(old).await;
                            }
                        }
                    }
                }
            } else if let Some(old) = link.take() {
                // Another node relays: hold no connection meanwhile.
                self.broker.close(old).await;
            }
            if lost {
                lease = None;
            }
            failures = if failed {
                failures.saturating_add(1)
            } else {
                0
            };
            let pause = if failed {
                backoff(failures)
            } else if busy {
                Duration::ZERO
            } else if lease.is_some() {
                self.events.poll_interval
            } else {
                self.events.lease_ttl / 3
            };
            tokio::select! {
                () = shutdown.cancelled() => {
                    if let Some(old) = link.take() {
                        self.broker.close(old).await;
                    }
                    return;
                }
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Take or renew the lease; `None` when another node holds it or the call failed.
    async fn renew(&self, held: Option<&EventLease>) -> Option<EventLease> {
        let asked = self
            .storage
            .event_lease(&EventLeaseParams {
                name: B::LEASE.to_owned(),
                holder: self.holder.clone(),
                ttl: self.events.lease_ttl,
                now: None,
            })
            .await;
        match asked {
            Ok(Some(lease)) => {
                if held.map(|l| l.epoch) != Some(lease.epoch) {
                    tracing::info!(
                        relay = B::NAME,
                        epoch = lease.epoch,
                        "holding the relay lease"
                    );
                }
                Some(lease)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(relay = B::NAME, error = %e, "taking the relay lease failed");
                None
            }
        }
    }

    /// Publish the next page after the cursor, and move the cursor (and
    /// `lease.last_seq`) past what the broker acknowledged.
    async fn step(
        &self,
        link: &B::Link,
        lease: &mut EventLease,
        renewed_at: Instant,
    ) -> Result<Step, String> {
        let page = self
            .storage
            .event_list(&EventListParams {
                after: lease.last_seq,
                limit: self.events.batch,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        if page.pruned_through > lease.last_seq {
            tracing::error!(
                relay = B::NAME,
                cursor = lease.last_seq,
                pruned_through = page.pruned_through,
                "events were pruned before the relay delivered them"
            );
        }
        // Stop publishing before the lease could lapse under us.
        let until = renewed_at + self.events.lease_ttl * 2 / 3;
        let published = self
            .broker
            .publish(link, &page.events, &self.events.secrets, until)
            .await;
        if let Some(last) = published.last.filter(|last| *last > lease.last_seq) {
            let held = self
                .storage
                .event_cursor_advance(&EventCursorParams {
                    lease: lease.clone(),
                    last_seq: last,
                    now: None,
                })
                .await
                .map_err(|e| e.to_string())?;
            if !held {
                return Ok(Step::LostLease);
            }
            lease.last_seq = last;
            metrics::counter!("tenax_events_relayed_total", "relay" => B::NAME)
                .increment(published.sent as u64);
        }
        match published.failure {
            Some(e) => Err(e),
            None => Ok(Step::Sent(published.sent)),
        }
    }
}

/// The pause after `failures` failed rounds in a row: doubling from [`BACKOFF_BASE`]
/// up to [`BACKOFF_CAP`], with up to a quarter of jitter so relays of several
/// deployments do not reconnect in step.
fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let base = BACKOFF_BASE.saturating_mul(1u32 << exp).min(BACKOFF_CAP);
    let jitter = base.mul_f64(rand::random::<f64>() * 0.25);
    (base - jitter).max(BACKOFF_BASE / 2)
}

#[cfg(test)]
mod tests {
    use super::{backoff, BACKOFF_CAP};

    #[test]
    fn the_backoff_grows_and_stays_bounded() {
        assert!(backoff(1) <= backoff(6));
        for failures in [1, 5, 20, u32::MAX] {
            assert!(backoff(failures) <= BACKOFF_CAP);
        }
    }
}
