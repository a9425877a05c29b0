//! The demo's command: the seed article's bank account opening, against a simulated
//! flaky bank.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tenax::{Command, CommandError, RetryPolicy, TaskContext};

/// The context of a `BANK_OPEN_ACCOUNT` task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OpenAccount {
    pub(crate) customer: String,
    pub(crate) id_card: String,
}

impl OpenAccount {
    /// A demo customer; about `invalid_rate` of them carry an id card the bank refuses.
    pub(crate) fn random(n: usize, invalid_rate: f64) -> Self {
        let mut rng = rand::rng();
        let digits: String = (0..17)
            .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
            .collect();
        let check = if rng.random_bool(invalid_rate.clamp(0.0, 1.0)) {
            'X'
        } else {
            '7'
        };
        Self {
            customer: format!("customer-{n:04}"),
            id_card: format!("{digits}{check}"),
        }
    }
}

/// How the simulated bank behaves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BankBehaviour {
    /// Share of calls that fail with a transient error.
    pub(crate) failure_rate: f64,
    /// Mean latency of a call.
    pub(crate) latency: Duration,
}

/// A bank RPC that is slow and sometimes fails, and refuses id cards ending in `X`.
#[derive(Debug)]
pub(crate) struct FlakyBank {
    behaviour: BankBehaviour,
    opened: AtomicU64,
    cancelled: AtomicU64,
}

impl FlakyBank {
    pub(crate) fn new(behaviour: BankBehaviour) -> Self {
        Self {
            behaviour,
            opened: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    async fn call(&self) -> Result<(), CommandError> {
        let (latency, fails) = {
            let mut rng = rand::rng();
            let ms = self.behaviour.latency.as_millis() as u64;
            (
                Duration::from_millis(rng.random_range(ms / 2..=ms + ms / 2)),
                rng.random_bool(self.behaviour.failure_rate.clamp(0.0, 1.0)),
            )
        };
        tokio::time::sleep(latency).await;
        if fails {
            return Err(CommandError::retryable("bank RPC timed out"));
        }
        Ok(())
    }

    async fn open_account(
        &self,
        request_id: &str,
        ctx: &OpenAccount,
    ) -> Result<String, CommandError> {
        self.call().await?;
        if ctx.id_card.ends_with('X') {
            return Err(CommandError::permanent(format!(
                "invalid id card {}",
                ctx.id_card
            )));
        }
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(format!(
            "account of {} (request {request_id})",
            ctx.customer
        ))
    }

    async fn cancel_pending_account(&self, _request_id: &str) -> Result<(), CommandError> {
        self.call().await?;
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// `BANK_OPEN_ACCOUNT`: open an account at the partner bank; when the task dies, cancel
/// the pending account.
pub(crate) struct BankOpenAccount {
    pub(crate) bank: Arc<FlakyBank>,
    pub(crate) retry: RetryPolicy,
}

impl Command for BankOpenAccount {
    const TYPE: &'static str = "BANK_OPEN_ACCOUNT";
    type Context = OpenAccount;
    type Output = String;

    async fn execute(&self, ctx: OpenAccount, task: &TaskContext) -> Result<String, CommandError> {
        // The idempotency key goes downstream as the request id (the seed's
        // biz_request_id), so a retry after an unknown outcome is a repeat, not a new
        // account.
        tracing::info!(customer = %ctx.customer, "opening the account at the partner bank");
        self.bank.open_account(task.idempotency_key(), &ctx).await
    }

    async fn compensate(&self, _ctx: OpenAccount, task: &TaskContext) -> Result<(), CommandError> {
        self.bank
            .cancel_pending_account(task.idempotency_key())
            .await
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.retry.clone()
    }
}

/// `NOOP`: does nothing and succeeds; for benchmarks and fleet tests.
pub(crate) struct Noop;

impl Command for Noop {
    const TYPE: &'static str = "NOOP";
    type Context = serde_json::Value;
    type Output = ();

    async fn execute(
        &self,
        _ctx: serde_json::Value,
        _task: &TaskContext,
    ) -> Result<(), CommandError> {
        Ok(())
    }
}

/// `echo`: succeeds at once with its payload as its result, so the HTTP API's
/// examples run without any Rust code.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Echo;

impl Command for Echo {
    const TYPE: &'static str = "echo";
    type Context = serde_json::Value;
    type Output = serde_json::Value;

    async fn execute(
        &self,
        ctx: serde_json::Value,
        _task: &TaskContext,
    ) -> Result<serde_json::Value, CommandError> {
        Ok(ctx)
    }
}
