//! Rules every backend applies the same way to bulk actions and the audit log: the
//! bounds of a call, checked before any statement runs.
use tenax_core::{InvalidInput, TaskStatus};

use crate::error::Result;
use crate::params::{AuditAppendParams, AuditListParams, BulkAction, TaskBulkParams};

/// Most tasks one bulk action changes.
pub const BULK_LIMIT_MAX: u32 = 100_000;
/// Most ids a bulk action's filter may list.
pub const BULK_IDS_MAX: usize = 10_000;
/// Most audit entries one listing returns.
pub const AUDIT_LIST_MAX: u32 = 1_000;
/// Longest audit actor, in bytes.
pub const AUDIT_ACTOR_MAX_BYTES: usize = 255;
/// Longest audit action name, in bytes.
pub const AUDIT_ACTION_MAX_BYTES: usize = 100;
/// Longest audit target, in bytes.
pub const AUDIT_TARGET_MAX_BYTES: usize = 4096;
/// Largest audit details (as JSON text), in bytes.
pub const AUDIT_DETAILS_MAX_BYTES: usize = 64 * 1024;

/// The statuses a bulk action moves tasks out of.
pub(crate) fn eligible_statuses(action: BulkAction) -> &'static [TaskStatus] {
    match action {
        BulkAction::Cancel | BulkAction::Reprioritise(_) => &[
            TaskStatus::Pending,
            TaskStatus::Retrying,
            TaskStatus::Blocked,
        ],
        BulkAction::Retry => &[TaskStatus::Dead],
    }
}

/// Check a bulk action's bounds. Returns `false` when the filter can match nothing (an
/// empty id list), so the backend need not ask the database.
pub(crate) fn validate_bulk(params: &TaskBulkParams) -> Result<bool> {
    if params.limit == 0 || params.limit > BULK_LIMIT_MAX {
        return Err(InvalidInput::new(
            "limit",
            format!("must be 1 to {BULK_LIMIT_MAX}, not {}", params.limit),
        )
        .into());
    }
    if let Some(ids) = &params.filter.ids {
        if ids.len() > BULK_IDS_MAX {
            return Err(InvalidInput::new(
                "ids",
                format!("lists {} ids, at most {BULK_IDS_MAX} allowed", ids.len()),
            )
            .into());
        }
        if ids.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The statuses of `statuses` that the action moves tasks out of (all of them when the
/// filter names none); empty when the filter and the action have none in common.
pub(crate) fn statuses_for(params: &TaskBulkParams, running: bool) -> Vec<&'static str> {
    let mut eligible: Vec<TaskStatus> = eligible_statuses(params.action).to_vec();
    if running {
        eligible = vec![TaskStatus::Running];
    }
    eligible
        .into_iter()
        .filter(|s| params.filter.statuses.is_empty() || params.filter.statuses.contains(s))
        .map(TaskStatus::as_str)
        .collect()
}

fn check_len(field: &'static str, value: &str, min: usize, max: usize) -> Result<()> {
    if value.len() < min || value.len() > max {
        return Err(InvalidInput::new(
            field,
            format!("must be {min} to {max} bytes, not {}", value.len()),
        )
        .into());
    }
    Ok(())
}

/// Check an audit entry; returns its details as JSON text.
pub(crate) fn validate_audit_append(params: &AuditAppendParams) -> Result<String> {
    check_len("actor", &params.actor, 1, AUDIT_ACTOR_MAX_BYTES)?;
    check_len("action", &params.action, 1, AUDIT_ACTION_MAX_BYTES)?;
    check_len("target", &params.target, 0, AUDIT_TARGET_MAX_BYTES)?;
    let details = params.details.to_string();
    check_len("details", &details, 0, AUDIT_DETAILS_MAX_BYTES)?;
    Ok(details)
}

/// Check an audit listing's bounds.
pub(crate) fn validate_audit_list(params: &AuditListParams) -> Result<()> {
    if params.limit == 0 || params.limit > AUDIT_LIST_MAX {
        return Err(InvalidInput::new(
            "limit",
            format!("must be 1 to {AUDIT_LIST_MAX}, not {}", params.limit),
        )
        .into());
    }
    Ok(())
}

/// Decode stored audit details.
pub(crate) fn details_from_text(id: i64, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        crate::StorageError::Corrupt(format!("audit entry {id}: details are not JSON: {e}"))
    })
}
