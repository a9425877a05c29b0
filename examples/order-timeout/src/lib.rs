//! The order-timeout case: an order that is not paid within 30 minutes is cancelled.
//!
//! - Placing an order enqueues `ORDER_TIMEOUT_CANCEL` to run in 30 minutes, with the
//!   order in its task number (`order-42-timeout`), so a repeated place is one task.
//! - Paying the order cancels that task. A task not started yet is cancelled at once.
//! - If the cancel loses the race (the task is already running, or the process stopped
//!   between the payment and the cancel), the handler's own check keeps it harmless:
//!   it cancels the order only if the order is still unpaid, in one conditional step
//!   (here a compare-and-set on the order book; in a database, `UPDATE orders SET
//!   status = 'cancelled' WHERE id = ? AND status = 'placed'`). Payment uses the same
//!   kind of step, so exactly one of "paid" and "cancelled" wins.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax::storage::TaskRef;
use tenax::{Client, Command, CommandError, TaskContext, TaskNo, TaskStatus};

/// How long an order may stay unpaid.
pub const PAYMENT_WINDOW: Duration = Duration::from_secs(30 * 60);

/// Where an order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderState {
    Placed,
    Paid,
    Cancelled,
}

/// The orders (a stand-in for the application's own table).
#[derive(Debug, Default)]
pub struct OrderBook {
    orders: Mutex<HashMap<u64, OrderState>>,
}

impl OrderBook {
    fn orders(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OrderState>> {
        self.orders.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self, order: u64) -> Option<OrderState> {
        self.orders().get(&order).copied()
    }

    fn place(&self, order: u64) {
        self.orders().entry(order).or_insert(OrderState::Placed);
    }

    /// Move `order` from `from` to `to`; returns the state found.
    pub fn transition(&self, order: u64, from: OrderState, to: OrderState) -> Option<OrderState> {
        let mut orders = self.orders();
        let state = orders.get_mut(&order)?;
        let found = *state;
        if found == from {
            *state = to;
        }
        Some(found)
    }
}

/// The context of `ORDER_TIMEOUT_CANCEL`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderTimeout {
    pub order: u64,
}

/// `ORDER_TIMEOUT_CANCEL`: cancel the order if it is still unpaid.
pub struct OrderTimeoutCancel {
    pub book: Arc<OrderBook>,
}

impl Command for OrderTimeoutCancel {
    const TYPE: &'static str = "ORDER_TIMEOUT_CANCEL";
    type Context = OrderTimeout;
    type Output = String;

    async fn execute(
        &self,
        ctx: OrderTimeout,
        _task: &TaskContext,
    ) -> Result<String, CommandError> {
        // The check and the cancel are one conditional step: a payment that committed
        // first wins, and this task does nothing.
        match self
            .book
            .transition(ctx.order, OrderState::Placed, OrderState::Cancelled)
        {
            Some(OrderState::Placed) => {
                Ok(format!("order {} cancelled: not paid in time", ctx.order))
            }
            Some(OrderState::Paid) => {
                Ok(format!("order {} already paid: nothing to do", ctx.order))
            }
            Some(OrderState::Cancelled) => Ok(format!("order {} already cancelled", ctx.order)),
            None => Err(CommandError::permanent(format!("no order {}", ctx.order))),
        }
    }
}

/// What paying an order did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paid {
    /// Paid, and the timeout task cancelled before it ran.
    TimeoutCancelled,
    /// Paid while the timeout task was running: its cancel was requested, and its own
    /// check finds the order paid.
    TimeoutRunning,
    /// Paid; the timeout task ran between the payment and the cancel, found the order
    /// paid and did nothing. (Had it run before the payment, it would have cancelled
    /// the order and the payment would be refused.)
    TimeoutFinished,
}

/// Why a payment was refused.
#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("order {0} does not exist")]
    Unknown(u64),
    #[error("order {0} was cancelled: it was not paid in time")]
    Cancelled(u64),
    #[error("order {0} is already paid")]
    AlreadyPaid(u64),
    #[error(transparent)]
    Tenax(#[from] tenax::Error),
}

/// Places and pays orders.
#[derive(Clone)]
pub struct Orders {
    pub client: Client,
    pub book: Arc<OrderBook>,
    /// How long an order may stay unpaid; [`PAYMENT_WINDOW`] unless shortened (demos).
    pub window: Duration,
}

fn timeout_task_no(order: u64) -> Result<TaskNo, tenax::Error> {
    Ok(TaskNo::new(format!("order-{order}-timeout"))?)
}

impl Orders {
    pub fn new(client: Client, book: Arc<OrderBook>) -> Self {
        Self {
            client,
            book,
            window: PAYMENT_WINDOW,
        }
    }

    /// Place `order` and arm its timeout.
    pub async fn place(&self, order: u64) -> Result<(), tenax::Error> {
        self.book.place(order);
        self.client
            .enqueue::<OrderTimeoutCancel>(OrderTimeout { order })
            .task_no(timeout_task_no(order)?.as_str())
            .run_in(self.window)
            .await?;
        Ok(())
    }

    /// Pay `order`, then cancel its timeout task.
    pub async fn pay(&self, order: u64) -> Result<Paid, PayError> {
        match self
            .book
            .transition(order, OrderState::Placed, OrderState::Paid)
        {
            Some(OrderState::Placed) => {}
            Some(OrderState::Paid) => return Err(PayError::AlreadyPaid(order)),
            Some(OrderState::Cancelled) => return Err(PayError::Cancelled(order)),
            None => return Err(PayError::Unknown(order)),
        }
        let task = TaskRef::No(timeout_task_no(order)?);
        match self.client.cancel(task.clone()).await {
            Ok(t) if t.status == TaskStatus::Running => Ok(Paid::TimeoutRunning),
            Ok(_) => Ok(Paid::TimeoutCancelled),
            // Finished already: it ran after the payment and did nothing.
            Err(tenax::Error::Storage(tenax::storage::StorageError::InvalidState { .. })) => {
                Ok(Paid::TimeoutFinished)
            }
            Err(e) => Err(e.into()),
        }
    }
}
