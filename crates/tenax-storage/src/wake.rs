//! Wake-ups, and the probe that carries them across processes on backends without
//! notifications (SQLite, MariaDB).
//!
//! A storage's wake-ups are a `watch` channel: every write of this process that may
//! make a task due bumps it. Another process's writes reach it through a probe: one
//! background task per storage, started when the first receiver subscribes, reads on a
//! connection of its own a value that changes when another connection commits (SQLite's
//! `PRAGMA data_version`, MariaDB's newest task id) and bumps the channel when it has
//! changed. The task holds only a weak reference to the storage: once every clone of
//! the storage is gone, its next tick ends it and closes its connection.
//!
//! Like PostgreSQL's notifications, the probe is a hint: workers still poll, so a
//! change it misses (a lost connection, an interval that saw nothing) costs at most one
//! poll interval.
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use tokio::sync::watch;

use crate::error::{Result, StorageError};
use tenax_core::InvalidInput;

use crate::WakeReceiver;

/// The default interval of the probe: an enqueue in another process wakes this
/// process's workers about half of it later, on average.
pub const DEFAULT_WAKE_POLL_INTERVAL: Duration = Duration::from_millis(25);

/// The longest a connect or a read of the probe may take before it counts as failed
/// (a connection lost without a word would otherwise stall the probe for good).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL query parameter that sets the probe's interval in milliseconds (`0` turns
/// the probe off).
pub(crate) const WAKE_POLL_PARAM: &str = "wake_poll_ms";

/// What the probe reads: a value that changes when another connection commits.
#[async_trait]
pub(crate) trait Probe: Send + Sync + 'static {
    /// The probe's own connection.
    type Conn: Send;

    /// Open the connection.
    async fn connect(&self) -> Result<Self::Conn>;

    /// The current value. Values are compared only within one connection.
    async fn read(&self, conn: &mut Self::Conn) -> Result<i64>;

    /// Close the connection when the storage is gone.
    async fn close(&self, conn: Self::Conn);
}

type Start = Box<dyn FnOnce(Weak<Wake>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A storage's wake-up channel, shared by its clones.
pub(crate) struct Wake {
    tx: watch::Sender<u64>,
    /// The probe's task, until the first subscriber starts it.
    start: Mutex<Option<Start>>,
    cross_process: bool,
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wake")
            .field("generation", &*self.tx.borrow())
            .field("cross_process", &self.cross_process)
            .finish()
    }
}

impl Wake {
    /// Wake-ups within this process and, when `interval` is set, from other processes
    /// through `probe`, read every `interval`.
    pub(crate) fn probed<P: Probe>(probe: P, interval: Option<Duration>) -> Arc<Self> {
        let Some(interval) = interval.filter(|i| !i.is_zero()) else {
            return Arc::new(Self {
                tx: watch::channel(0).0,
                start: Mutex::new(None),
                cross_process: false,
            });
        };
        let start: Start = Box::new(move |wake| Box::pin(run(probe, interval, wake)));
        Arc::new(Self {
            tx: watch::channel(0).0,
            start: Mutex::new(Some(start)),
            cross_process: true,
        })
    }

    /// Whether other processes' writes wake this process's workers.
    pub(crate) fn cross_process(&self) -> bool {
        self.cross_process
    }

    /// Tell this process's workers that tasks may be due.
    pub(crate) fn bump(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver of wake-ups; the first one (inside a Tokio runtime) starts the probe.
    pub(crate) fn subscribe(self: &Arc<Self>) -> WakeReceiver {
        let rx = self.tx.subscribe();
        if let Ok(mut start) = self.start.lock() {
            if start.is_some() {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    if let Some(start) = start.take() {
                        // Detached: it ends by itself once the storage is gone.
                        drop(runtime.spawn(start(Arc::downgrade(self))));
                    }
                }
            }
        }
        rx
    }

    /// Whether the probe's task has been started (for tests).
    #[cfg(test)]
    fn started(&self) -> bool {
        self.cross_process && self.start.lock().map(|s| s.is_none()).unwrap_or(false)
    }
}

/// Read the probe every `interval` while the storage lives; bump on every change.
async fn run<P: Probe>(probe: P, interval: Duration, wake: Weak<Wake>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<P::Conn> = None;
    let mut last: Option<i64> = None;
    let mut failures = 0u32;
    loop {
        ticker.tick().await;
        let Some(wake) = wake.upgrade() else {
            break;
        };
        let connection = match &mut conn {
            Some(connection) => connection,
            None => match timed(probe.connect()).await {
                Ok(connection) => conn.insert(connection),
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if failures == 1 {
                        tracing::warn!(error = %e, "wake-up probe cannot connect; workers keep polling");
                    }
                    drop(wake);
                    backoff(failures).await;
                    continue;
                }
            },
        };
        match timed(probe.read(connection)).await {
            Ok(value) => {
                // A change, or the first value after a lost connection (what changed
                // meanwhile is unknown): wake the workers.
                let changed = last.is_some_and(|last| last != value);
                if changed || (last.is_none() && failures > 0) {
                    wake.bump();
                }
                if failures > 0 {
                    tracing::info!("wake-up probe reading again");
                }
                last = Some(value);
                failures = 0;
            }
            Err(e) => {
                // Values of a new connection are not comparable with this one's.
                if let Some(lost) = conn.take() {
                    probe.close(lost).await;
                }
                last = None;
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(error = %e, "wake-up probe failed; reconnecting");
                }
                drop(wake);
                backoff(failures).await;
            }
        }
    }
    if let Some(conn) = conn {
        probe.close(conn).await;
    }
}

async fn timed<T>(call: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(StorageError::Transient(
            format!("no answer within {PROBE_TIMEOUT:?}").into(),
        )),
    }
}

async fn backoff(failures: u32) {
    let ceiling = 100u64.saturating_mul(1 << failures.min(6)).min(5_000);
    let wait = rand::rng().random_range(ceiling / 2..=ceiling);
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

/// Take [`WAKE_POLL_PARAM`] off a URL's query string: the URL without it, and the
/// interval it sets (`Some(None)` for `0`, off; `None` when absent).
pub(crate) fn take_wake_poll(url: &str) -> Result<(String, Option<Option<Duration>>)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut interval = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair
            .strip_prefix(WAKE_POLL_PARAM)
            .and_then(|p| p.strip_prefix('='))
        {
            Some(ms) => {
                let ms: u64 = ms.parse().map_err(|_| {
                    InvalidInput::new(
                        WAKE_POLL_PARAM,
                        format!("{ms:?}: milliseconds, 0 to turn the probe off"),
                    )
                })?;
                if ms > 60_000 {
                    return Err(InvalidInput::new(
                        WAKE_POLL_PARAM,
                        format!("{ms}: at most 60000 ms (0 turns the probe off)"),
                    )
                    .into());
                }
                interval = Some((ms > 0).then(|| Duration::from_millis(ms)));
            }
            None => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, interval))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    use super::*;

    /// Reads `.0`; counts closed connections in `.1`; fails a read while `.2` is set.
    struct Counter(Arc<AtomicI64>, Arc<AtomicI64>, Arc<AtomicBool>);

    #[async_trait]
    impl Probe for Counter {
        type Conn = ();
        async fn connect(&self) -> Result<()> {
            Ok(())
        }
        async fn read(&self, _conn: &mut ()) -> Result<i64> {
            if self.2.swap(false, Ordering::SeqCst) {
                return Err(StorageError::Transient("connection lost".into()));
            }
            Ok(self.0.load(Ordering::SeqCst))
        }
        async fn close(&self, _conn: ()) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_change_wakes_and_the_probe_ends_with_the_storage() {
        let value = Arc::new(AtomicI64::new(0));
        let closed = Arc::new(AtomicI64::new(0));
        let wake = Wake::probed(
            Counter(value.clone(), closed.clone(), Arc::default()),
            Some(Duration::from_millis(5)),
        );
        assert!(wake.cross_process());
        assert!(!wake.started(), "started lazily");
        let mut rx = wake.subscribe();
        assert!(wake.started());
        // Let the probe read its first value, then change it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        value.store(1, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("a change wakes")
            .unwrap();
        drop(wake);
        // The probe notices the storage is gone, closes its connection and ends; then
        // the channel closes.
        tokio::time::timeout(Duration::from_secs(5), async {
            while rx.changed().await.is_ok() {}
        })
        .await
        .expect("the channel closes with the storage");
        tokio::time::timeout(Duration::from_secs(5), async {
            while closed.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the probe closes its connection and ends");
    }

    #[tokio::test]
    async fn a_lost_connection_wakes_once_the_probe_reads_again() {
        let fail = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicI64::new(0));
        let wake = Wake::probed(
            Counter(Arc::default(), closed.clone(), fail.clone()),
            Some(Duration::from_millis(5)),
        );
        let mut rx = wake.subscribe();
        // The value never changes; a failed read loses the connection, and the first
        // read after it wakes the workers, since what changed meanwhile is unknown.
        fail.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("a wake-up after the lost connection")
            .unwrap();
        assert!(!fail.load(Ordering::SeqCst), "the failing read happened");
        assert_eq!(
            closed.load(Ordering::SeqCst),
            1,
            "the lost connection is closed"
        );
    }

    #[tokio::test]
    async fn without_an_interval_there_is_no_probe() {
        let wake = Wake::probed(
            Counter(Arc::default(), Arc::default(), Arc::default()),
            Some(Duration::ZERO),
        );
        assert!(!wake.cross_process());
        let _rx = wake.subscribe();
        assert!(!wake.started(), "nothing to start");
    }

    #[test]
    fn the_url_parameter_is_taken_off() {
        let (url, poll) = take_wake_poll("sqlite://x.db?wake_poll_ms=10&mode=rwc").unwrap();
        assert_eq!(url, "sqlite://x.db?mode=rwc");
        assert_eq!(poll, Some(Some(Duration::from_millis(10))));
        let (url, poll) = take_wake_poll("mysql://h/db?wake_poll_ms=0").unwrap();
        assert_eq!(url, "mysql://h/db");
        assert_eq!(poll, Some(None));
        assert_eq!(take_wake_poll("mysql://h/db").unwrap().1, None);
        assert!(take_wake_poll("mysql://h/db?wake_poll_ms=x").is_err());
        assert!(take_wake_poll("mysql://h/db?wake_poll_ms=60001").is_err());
    }
}
