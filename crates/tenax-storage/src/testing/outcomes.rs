//! Conformance cases for text written from outside in a task's outcome: a NUL
//! character (which PostgreSQL's text cannot hold) in an error or a result is stored
//! as [`NUL_REPLACEMENT`](crate::NUL_REPLACEMENT) on every backend, and the task ends
//! where it should.
use std::time::Duration;

use tenax_core::{AttemptOutcome, CompensationState, TaskId, TaskRecord, TaskStatus};

use super::{Harness, TaskOpts};
use crate::{
    BatchCompletion, FailNext, Lease, TaskCompleteParams, TaskFailParams, TaskRef, NUL_REPLACEMENT,
};

fn lease(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

fn done(task: &TaskRecord, result: &str) -> TaskCompleteParams {
    TaskCompleteParams {
        lease: lease(task),
        result: Some(result.to_owned()),
        compensation: CompensationState::Succeeded,
        now: None,
    }
}

async fn get(h: &Harness, id: TaskId) -> TaskRecord {
    h.storage
        .task_get(&TaskRef::Id(id))
        .await
        .unwrap()
        .expect("task exists")
}

async fn claim_one(h: &Harness, max_attempts: u32) -> TaskRecord {
    let task = h
        .task(TaskOpts {
            max_attempts,
            ..Default::default()
        })
        .await;
    let claimed = h.claim("w1", 1, None).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, task.id);
    claimed.into_iter().next().unwrap()
}

/// As found on PostgreSQL: an `http` task whose 400 or 500 answer held a NUL byte
/// stayed `running`, its fail write refused. Now an error (by a permanent failure and
/// by a retry), a result (by a completion and by a batch completion) and the attempt
/// history each store the NUL as the replacement character, on every backend.
pub async fn a_nul_in_an_outcome_is_stored_escaped_and_the_task_ends(h: &Harness) {
    let r = NUL_REPLACEMENT;
    // A retry: retrying, escaped; an error of NULs only is still cut to the bound.
    let task = claim_one(h, 5).await;
    let long = "\0".repeat(crate::ERROR_MAX_BYTES);
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(&task),
            error: long,
            next: FailNext::Retry(Duration::from_secs(3600)),
            now: None,
        })
        .await
        .unwrap());
    let got = get(h, task.id).await;
    assert_eq!(got.status, TaskStatus::Retrying);
    let error = got.last_error.expect("an error");
    assert!(!error.contains('\0'));
    assert!(error.len() <= crate::ERROR_MAX_BYTES + '…'.len_utf8());
    assert!(error.chars().all(|c| c == r || c == '…'), "{error:?}");
    let attempts = h.storage.task_attempts(task.id).await.unwrap();
    assert_eq!(
        attempts.last().unwrap().error.as_deref(),
        Some(error.as_str())
    );

    // A completion: succeeded, the result escaped; a JSON `\u0000` escape is plain
    // text and stays as written.
    for (result, stored) in [
        ("\"a\0b\"".to_owned(), format!("\"a{r}b\"")),
        (
            r#"{"body":"a\u0000b"}"#.to_owned(),
            r#"{"body":"a\u0000b"}"#.to_owned(),
        ),
    ] {
        let task = claim_one(h, 5).await;
        assert!(h
            .storage
            .task_complete_if_leased(&done(&task, &result))
            .await
            .unwrap());
        let got = get(h, task.id).await;
        assert_eq!(got.status, TaskStatus::Succeeded);
        assert_eq!(got.result.as_deref(), Some(stored.as_str()));
    }

    // A batch completion: each item lands, each result escaped.
    for _ in 0..3 {
        h.task(TaskOpts::default()).await;
    }
    let claimed = h.claim("w1", 3, None).await;
    assert_eq!(claimed.len(), 3);
    let results = ["\"\0\"", "\"plain\"", "{\"k\":\"x\0y\0z\"}"];
    let batch: Vec<TaskCompleteParams> = claimed
        .iter()
        .zip(results)
        .map(|(task, result)| done(task, result))
        .collect();
    let landed = h
        .storage
        .task_complete_many_if_leased(&batch)
        .await
        .unwrap();
    assert_eq!(landed, vec![BatchCompletion::Landed; 3]);
    for (task, result) in claimed.iter().zip(results) {
        let got = get(h, task.id).await;
        assert_eq!(got.status, TaskStatus::Succeeded);
        let stored = result.replace('\0', &r.to_string());
        assert_eq!(got.result.as_deref(), Some(stored.as_str()));
        let attempts = h.storage.task_attempts(task.id).await.unwrap();
        assert_eq!(attempts.last().unwrap().outcome, AttemptOutcome::Succeeded);
    }

    // A permanent failure: dead, the error and its attempt escaped. (Last: the death
    // schedules a compensation task, which the next claim would take.)
    let task = claim_one(h, 5).await;
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(&task),
            error: "HTTP 400: a\0b\0".into(),
            next: FailNext::Dead,
            now: None,
        })
        .await
        .unwrap());
    let got = get(h, task.id).await;
    assert_eq!(got.status, TaskStatus::Dead);
    let escaped = format!("HTTP 400: a{r}b{r}");
    assert_eq!(got.last_error.as_deref(), Some(escaped.as_str()));
    let attempts = h.storage.task_attempts(task.id).await.unwrap();
    let last = attempts.last().expect("an attempt");
    assert_eq!(last.outcome, AttemptOutcome::Dead);
    assert_eq!(last.error.as_deref(), Some(escaped.as_str()));
}
