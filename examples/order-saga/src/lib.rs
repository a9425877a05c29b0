//! The e-commerce order as a saga: lock inventory → check payment → dispatch
//! logistics, each step a command with its compensation.
//!
//! - [`place_order`] enqueues the three steps as one saga in one transaction: each
//!   step waits (`blocked`) until the step before it succeeded.
//! - When a step dies (a declined card is a permanent error), the saga compensates it
//!   and then the steps before it that succeeded, in reverse order and one after
//!   another: the payment's authorisation is voided, then the inventory lock released.
//!   Each compensation is a durable task, retried like any other.
//! - The saga's final state (`completed`, `compensated` or `compensation_failed`) is
//!   written by the transaction that decides it: [`Client::workflow`].
#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tenax::{
    Client, Command, CommandError, Registry, RegistryError, TaskContext, Workflow, WorkflowDetail,
};

/// The order a saga carries through its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
    pub sku: String,
    pub quantity: u32,
    pub card: String,
}

/// A card number the payment provider always declines.
pub const DECLINED_CARD: &str = "4000-0000-0000-0002";

/// Free stock by SKU, and the lock each order holds (SKU, quantity).
type Stock = (HashMap<String, u32>, HashMap<u64, (String, u32)>);

/// Stock and the locks orders hold on it (a stand-in for the inventory service).
#[derive(Debug, Default)]
pub struct Warehouse {
    state: Mutex<Stock>,
}

impl Warehouse {
    fn state(&self) -> std::sync::MutexGuard<'_, Stock> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Put `quantity` of `sku` in stock.
    pub fn stock(&self, sku: &str, quantity: u32) {
        *self.state().0.entry(sku.to_owned()).or_default() += quantity;
    }

    /// What is free of `sku`.
    pub fn available(&self, sku: &str) -> u32 {
        self.state().0.get(sku).copied().unwrap_or(0)
    }

    /// Whether `order` holds a lock.
    pub fn is_locked(&self, order: u64) -> bool {
        self.state().1.contains_key(&order)
    }

    /// Lock stock for an order; a repeat for the same order is the same lock.
    fn lock(&self, order: &Order) -> Result<(), CommandError> {
        let mut state = self.state();
        if state.1.contains_key(&order.id) {
            return Ok(());
        }
        let free = state.0.entry(order.sku.clone()).or_default();
        if *free < order.quantity {
            return Err(CommandError::permanent(format!(
                "{} is out of stock",
                order.sku
            )));
        }
        *free -= order.quantity;
        state
            .1
            .insert(order.id, (order.sku.clone(), order.quantity));
        Ok(())
    }

    /// Release an order's lock; releasing twice changes nothing.
    fn release(&self, order: u64) {
        let mut state = self.state();
        if let Some((sku, quantity)) = state.1.remove(&order) {
            *state.0.entry(sku).or_default() += quantity;
        }
    }
}

/// Authorisations by order (a stand-in for the payment provider).
#[derive(Debug, Default)]
pub struct Payments {
    authorised: Mutex<HashSet<u64>>,
    voided: Mutex<HashSet<u64>>,
}

impl Payments {
    pub fn is_authorised(&self, order: u64) -> bool {
        self.authorised
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&order)
    }

    pub fn is_voided(&self, order: u64) -> bool {
        self.voided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&order)
    }
}

/// Orders handed to the carrier (a stand-in for the logistics service).
#[derive(Debug, Default)]
pub struct Logistics {
    dispatched: Mutex<HashSet<u64>>,
}

impl Logistics {
    pub fn is_dispatched(&self, order: u64) -> bool {
        self.dispatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&order)
    }
}

/// The services the steps call.
#[derive(Debug, Default, Clone)]
pub struct Services {
    pub warehouse: Arc<Warehouse>,
    pub payments: Arc<Payments>,
    pub logistics: Arc<Logistics>,
}

/// Step 1: lock the ordered stock; compensation releases it.
pub struct LockInventory(pub Arc<Warehouse>);

impl Command for LockInventory {
    const TYPE: &'static str = "ORDER_LOCK_INVENTORY";
    type Context = Order;
    type Output = ();

    async fn execute(&self, order: Order, _: &TaskContext) -> Result<(), CommandError> {
        self.0.lock(&order)
    }

    async fn compensate(&self, order: Order, _: &TaskContext) -> Result<(), CommandError> {
        self.0.release(order.id);
        Ok(())
    }
}

/// Step 2: authorise the payment; a declined card is permanent. Compensation voids an
/// authorisation, if there is one.
pub struct CheckPayment(pub Arc<Payments>);

impl Command for CheckPayment {
    const TYPE: &'static str = "ORDER_CHECK_PAYMENT";
    type Context = Order;
    type Output = String;

    async fn execute(&self, order: Order, task: &TaskContext) -> Result<String, CommandError> {
        if order.card == DECLINED_CARD {
            return Err(CommandError::permanent("the card was declined"));
        }
        self.0
            .authorised
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(order.id);
        Ok(format!("auth-{}", task.idempotency_key()))
    }

    async fn compensate(&self, order: Order, _: &TaskContext) -> Result<(), CommandError> {
        let mut authorised = self.0.authorised.lock().unwrap_or_else(|e| e.into_inner());
        if authorised.remove(&order.id) {
            self.0
                .voided
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(order.id);
        }
        Ok(())
    }
}

/// Step 3: hand the order to the carrier; compensation recalls it.
pub struct DispatchLogistics(pub Arc<Logistics>);

impl Command for DispatchLogistics {
    const TYPE: &'static str = "ORDER_DISPATCH_LOGISTICS";
    type Context = Order;
    type Output = ();

    async fn execute(&self, order: Order, task: &TaskContext) -> Result<(), CommandError> {
        // The payment step's output (its authorisation) is there to read.
        let auth: String = task.parent_output("check-payment").await?;
        if auth.is_empty() {
            return Err(CommandError::permanent("no authorisation"));
        }
        self.0
            .dispatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(order.id);
        Ok(())
    }

    async fn compensate(&self, order: Order, _: &TaskContext) -> Result<(), CommandError> {
        self.0
            .dispatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&order.id);
        Ok(())
    }
}

/// The three commands, over `services`.
pub fn registry(services: &Services) -> Result<Registry, RegistryError> {
    let mut registry = Registry::new();
    registry.register(LockInventory(services.warehouse.clone()))?;
    registry.register(CheckPayment(services.payments.clone()))?;
    registry.register(DispatchLogistics(services.logistics.clone()))?;
    Ok(registry)
}

/// Enqueue an order's saga (one transaction); its steps are numbered
/// `order-<id>-<step>`, so placing the same order twice is refused.
pub async fn place_order(client: &Client, order: &Order) -> Result<WorkflowDetail, tenax::Error> {
    let no = |step: &str| format!("order-{}-{step}", order.id);
    let saga = Workflow::saga(format!("order-{}", order.id))
        .step(
            "lock-inventory",
            client
                .enqueue::<LockInventory>(order.clone())
                .task_no(no("lock-inventory")),
        )
        .step(
            "check-payment",
            client
                .enqueue::<CheckPayment>(order.clone())
                .task_no(no("check-payment")),
        )
        .step(
            "dispatch-logistics",
            client
                .enqueue::<DispatchLogistics>(order.clone())
                .task_no(no("dispatch-logistics")),
        );
    client.enqueue_workflow(saga).await
}
