//! Payload decoding through the registry: arbitrary payload text under a stored
//! version 0 to 3 for a command at version 2 (so the current, upcast and too-new paths
//! all run). Decoding may fail with a permanent error; it must never panic, and a
//! payload that decodes must reach the handler unchanged.
#![no_main]
use std::collections::BTreeMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tenax_core::{Command, CommandError, Registry, TaskContext, TaskId, TaskKind, TaskNo};

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Order {
    id: u64,
    customer: String,
    lines: Vec<Line>,
    notes: Option<String>,
    tags: BTreeMap<String, i32>,
    kind: Kind,
}

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
    price: f64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Kind {
    Standard,
    Gift { message: String },
    Subscription { every_days: u16 },
}

struct PlaceOrder;

impl Command for PlaceOrder {
    const TYPE: &'static str = "place_order";
    const VERSION: u32 = 2;
    type Context = Order;
    type Output = u64;

    async fn execute(&self, ctx: Order, _: &TaskContext) -> Result<u64, CommandError> {
        Ok(ctx.id)
    }

    /// Version 1 named the customer `buyer` and had no `kind`.
    fn upcast(version: u32, mut payload: Value) -> Result<Value, CommandError> {
        if version != 1 {
            return Err(CommandError::permanent(format!("no upcast from {version}")));
        }
        let object = payload
            .as_object_mut()
            .ok_or_else(|| CommandError::permanent("version 1 payload is not an object"))?;
        let buyer = object
            .remove("buyer")
            .ok_or_else(|| CommandError::permanent("version 1 payload has no buyer"))?;
        object.insert("customer".to_owned(), buyer);
        object.insert("kind".to_owned(), serde_json::json!({"type": "standard"}));
        Ok(payload)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&version, rest)) = data.split_first() else {
        return;
    };
    let Ok(payload) = std::str::from_utf8(rest) else {
        return; // payloads are stored as text
    };
    let mut registry = Registry::new();
    if registry.register(PlaceOrder).is_err() {
        return;
    }
    let Some(handler) = registry.get(PlaceOrder::TYPE) else {
        return;
    };
    let Ok(task_no) = TaskNo::new("fuzz-1") else {
        return;
    };
    let task = TaskContext::new(
        TaskId(1),
        task_no,
        TaskKind::Execute,
        1,
        5,
        1,
        "fuzz-1".to_owned(),
        None,
        tokio_util::sync::CancellationToken::new(),
    );
    let stored = u32::from(version % 4);
    let result =
        futures::executor::block_on(Arc::clone(&handler).execute(payload.to_owned(), stored, task));
    if stored == 2 {
        // The handler returns the id: compare with a direct decode.
        let direct = serde_json::from_str::<Order>(payload)
            .ok()
            .map(|o| o.id.to_string());
        assert_eq!(result.ok(), direct, "{payload:?}");
    } else if stored > 2 {
        assert!(result.is_err(), "a newer version decoded: {payload:?}");
    }
});
