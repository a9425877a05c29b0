//! Secret payload fields, replaced by `"***"` in every answer.
use serde_json::Value;

use crate::config::ServerConfig;
use crate::model::{ScheduleView, TaskView};

const MASK: &str = "***";

fn mask(value: &mut Value, path: &str) {
    let mut parts = path.split('.').peekable();
    let mut current = value;
    while let Some(part) = parts.next() {
        let Value::Object(map) = current else {
            return;
        };
        let Some(next) = map.get_mut(part) else {
            return;
        };
        if parts.peek().is_none() {
            *next = Value::String(MASK.to_owned());
            return;
        }
        current = next;
    }
}

fn mask_all(config: &ServerConfig, command_type: &str, value: &mut Value) {
    if let Some(fields) = config.secrets.get(command_type) {
        for field in fields {
            mask(value, field);
        }
    }
}

/// Mask a task's secret fields in its payload, and in its result (a handler may echo
/// its input).
pub(crate) fn task(config: &ServerConfig, mut view: TaskView) -> TaskView {
    mask_all(config, &view.command_type, &mut view.payload);
    if let Some(result) = view.result.as_mut() {
        mask_all(config, &view.command_type, result);
    }
    view
}

/// Mask a schedule's secret payload fields.
pub(crate) fn schedule(config: &ServerConfig, mut view: ScheduleView) -> ScheduleView {
    mask_all(config, &view.command_type, &mut view.payload);
    view
}
