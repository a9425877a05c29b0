//! Secret payload fields in every shape, and commands that leak them: the fixtures of
//! the tests that follow each way out of Tenax (stored outcomes, answers, events,
//! relays, callbacks, alerts).
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tenax_core::{BatchCommand, BatchItem, Command, CommandError, Secrets, TaskContext};

/// The secret values: the first in every shape, the second beside it in an array.
pub const CARD: &str = "4111111111111111";
pub const OTHER_CARD: &str = "5500000000000004";
/// A secret value nested inside a secret object.
pub const CVV: &str = "cvv-7391";

/// Every secret value of [`shapes`].
pub const SECRET_VALUES: [&str; 3] = [CARD, OTHER_CARD, CVV];

/// The command types [`secrets`] covers.
pub const LEAK: &str = "LEAK";
pub const LEAK_MANY: &str = "LEAK_MANY";

/// The secret fields of [`LEAK`] and [`LEAK_MANY`].
pub fn secrets() -> Secrets {
    Secrets::new([
        (LEAK, ["card.number", "cards[].number"]),
        (LEAK_MANY, ["card.number", "cards[].number"]),
    ])
    .expect("valid secret paths")
}

/// Every shape of secret field: nested, in an array, a key holding dots, a parent given
/// as a string, a value that is an object.
pub fn shapes() -> Vec<Value> {
    vec![
        json!({"card": {"number": CARD, "brand": "visa"}}),
        json!({"cards": [{"number": CARD}, {"number": OTHER_CARD}]}),
        json!({"card.number": CARD}),
        json!({"card": format!("{CARD} 12/29")}),
        json!({"card": {"number": {"pan": CARD, "cvv": CVV}}}),
    ]
}

/// A shape with `fail` set: the handler fails for good, quoting its input.
pub fn failing(shape: &Value) -> Value {
    let mut v = shape.clone();
    v["fail"] = json!(true);
    v
}

/// Where `text` holds a secret value, the first it holds.
pub fn leaked(text: &str) -> Option<&'static str> {
    SECRET_VALUES.into_iter().find(|s| text.contains(s))
}

/// The input of [`Leak`] and [`LeakMany`]: any shape, and whether to fail.
#[derive(Debug, Serialize, Deserialize)]
pub struct LeakInput {
    #[serde(default)]
    pub fail: bool,
    #[serde(flatten)]
    pub rest: Value,
}

/// Echoes its input in its result, and in its error when told to fail.
pub struct Leak;

impl Command for Leak {
    const TYPE: &'static str = LEAK;
    type Context = LeakInput;
    type Output = Value;

    async fn execute(&self, input: LeakInput, _: &TaskContext) -> Result<Value, CommandError> {
        if input.fail {
            return Err(CommandError::permanent(format!(
                "card refused: {}",
                input.rest
            )));
        }
        Ok(json!({"echo": input.rest, "note": format!("charged {}", input.rest)}))
    }
}

/// [`Leak`] as a batch command.
pub struct LeakMany;

impl BatchCommand for LeakMany {
    const TYPE: &'static str = LEAK_MANY;
    type Context = LeakInput;
    type Output = Value;

    async fn execute_batch(
        &self,
        items: Vec<BatchItem<LeakInput>>,
    ) -> Vec<Result<Value, CommandError>> {
        items
            .into_iter()
            .map(|item| {
                if item.context.fail {
                    Err(CommandError::permanent(format!(
                        "refused {}",
                        item.context.rest
                    )))
                } else {
                    Ok(json!({"echo": item.context.rest}))
                }
            })
            .collect()
    }
}
