//! The seed article's bank account opening as a Tenax command.
//!
//! The command holds its bank client (`&self`), passes the task's idempotency key to
//! the bank as the request id, treats a refused id card as a business error (dead at
//! once, then compensated) and a bank timeout as a system error (retried).
#![allow(missing_docs)]

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tenax::{Command, CommandError, TaskContext};

/// What the bank answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BankAnswer {
    Opened(String),
    InvalidIdCard,
    Timeout,
}

/// The partner bank, as the command sees it.
pub trait Bank: Send + Sync + 'static {
    fn open_account(&self, request_id: &str, id_card: &str) -> BankAnswer;
    fn cancel_pending_account(&self, request_id: &str);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenAccount {
    pub customer: String,
    pub id_card: String,
}

pub struct OpenBankAccount {
    pub bank: Arc<dyn Bank>,
}

impl Command for OpenBankAccount {
    const TYPE: &'static str = "BANK_OPEN_ACCOUNT";
    type Context = OpenAccount;
    type Output = String;

    async fn execute(&self, ctx: OpenAccount, task: &TaskContext) -> Result<String, CommandError> {
        match self.bank.open_account(task.idempotency_key(), &ctx.id_card) {
            BankAnswer::Opened(account) => Ok(account),
            BankAnswer::InvalidIdCard => Err(CommandError::permanent("invalid id card")),
            BankAnswer::Timeout => Err(CommandError::retryable("bank timed out")),
        }
    }

    async fn compensate(&self, _ctx: OpenAccount, task: &TaskContext) -> Result<(), CommandError> {
        self.bank.cancel_pending_account(task.idempotency_key());
        Ok(())
    }
}

/// A bank for tests and the example binary: refuses id cards ending in `X`, times out
/// on the first `timeouts` calls, and records what it was asked.
#[derive(Default)]
pub struct RecordingBank {
    pub timeouts: Mutex<u32>,
    pub opened: Mutex<Vec<String>>,
    pub cancelled: Mutex<Vec<String>>,
}

impl Bank for RecordingBank {
    fn open_account(&self, request_id: &str, id_card: &str) -> BankAnswer {
        let mut timeouts = self.timeouts.lock().unwrap_or_else(|e| e.into_inner());
        if *timeouts > 0 {
            *timeouts -= 1;
            return BankAnswer::Timeout;
        }
        if id_card.ends_with('X') {
            return BankAnswer::InvalidIdCard;
        }
        self.opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request_id.to_owned());
        BankAnswer::Opened(format!("account-for-{request_id}"))
    }

    fn cancel_pending_account(&self, request_id: &str) {
        self.cancelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request_id.to_owned());
    }
}
