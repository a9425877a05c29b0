//! Secret payload fields, masked in every answer by [`tenax_core::secrets`]: the
//! payload's secret fields, the same paths in the result, and every literal copy of a
//! secret value in the result, the last error and the attempts' errors.
use tenax_core::{AttemptRecord, Masker, TaskRecord};

use crate::config::ServerConfig;
use crate::model::{AttemptView, ScheduleView, TaskView};

/// Mask a task's view.
pub(crate) fn task(config: &ServerConfig, mut view: TaskView) -> TaskView {
    let masker = config
        .secrets
        .mask_payload(&view.command_type, &mut view.payload);
    if let Some(result) = view.result.as_mut() {
        masker.json(result);
    }
    if let Some(error) = view.last_error.as_mut() {
        *error = masker.text(error).into_owned();
    }
    view
}

/// The masker of a stored task (for texts shown apart from its view).
pub(crate) fn masker<'c>(config: &'c ServerConfig, task: &TaskRecord) -> Masker<'c> {
    config.secrets.masker(&task.command_type, &task.payload)
}

/// A task's attempts, their errors masked.
pub(crate) fn attempts(masker: &Masker<'_>, attempts: &[AttemptRecord]) -> Vec<AttemptView> {
    attempts
        .iter()
        .map(|a| {
            let mut view = AttemptView::from(a);
            if let Some(error) = view.error.as_mut() {
                *error = masker.text(error).into_owned();
            }
            view
        })
        .collect()
}

/// Mask a schedule's secret payload fields.
pub(crate) fn schedule(config: &ServerConfig, mut view: ScheduleView) -> ScheduleView {
    let _ = config
        .secrets
        .mask_payload(&view.command_type, &mut view.payload);
    view
}
