//! Conformance cases for the state of threshold alerts.
use crate::{
    AlertTransitionParams, OutboxClaimParams, OutboxKind, OutboxListParams, StorageError,
    ALERT_MESSAGE_MAX_BYTES,
};

use super::Harness;

fn params(queue: &str, alert: &str, firing: bool) -> AlertTransitionParams {
    AlertTransitionParams {
        queue: queue.into(),
        alert: alert.into(),
        firing,
        message: None,
        now: None,
    }
}

pub async fn an_alert_changes_state_once_per_transition(h: &Harness) {
    let s = &h.storage;
    let step = |firing| async move {
        s.alert_transition(&params("default", "backlog", firing))
            .await
            .expect("transition")
    };
    assert!(!step(false).await, "an unknown alert is not firing");
    assert!(step(true).await, "starts firing");
    assert!(!step(true).await, "still firing: no change");
    assert!(step(false).await, "resolved");
    assert!(!step(false).await, "still resolved");
    assert!(step(true).await, "fires again");
    // Other alerts and queues are separate.
    assert!(s
        .alert_transition(&params("default", "oldest_age", true))
        .await
        .expect("transition"));
    assert!(s
        .alert_transition(&params("mail", "backlog", true))
        .await
        .expect("transition"));
    for bad in [
        params("default", "Backlog!", true),
        params("", "backlog", true),
    ] {
        let err = s.alert_transition(&bad).await.expect_err("invalid");
        assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
    }
    // Concurrent nodes: exactly one of them sees the transition.
    let other = h.reopen().await;
    for round in 0..5 {
        let firing = round % 2 == 0;
        let queue = "race";
        let (pa, pb) = (
            params(queue, "backlog", firing),
            params(queue, "backlog", firing),
        );
        let (a, b) = tokio::join!(h.storage.alert_transition(&pa), other.alert_transition(&pb));
        let changed = [a.expect("a"), b.expect("b")];
        assert_eq!(
            changed.iter().filter(|c| **c).count(),
            1,
            "round {round}: {changed:?}"
        );
    }
}

pub async fn an_alert_change_writes_its_message_to_the_outbox_once(h: &Harness) {
    let s = &h.storage;
    let alerts = || async {
        s.outbox_list(&OutboxListParams {
            kind: Some(OutboxKind::Alert),
            status: None,
            task_id: None,
            limit: 100,
        })
        .await
        .expect("outbox list")
    };
    let with = |firing: bool, text: &str| AlertTransitionParams {
        message: Some(serde_json::json!({ "text": text }).to_string()),
        ..params("default", "backlog", firing)
    };
    assert!(s
        .alert_transition(&with(true, "firing"))
        .await
        .expect("fire"));
    assert!(!s
        .alert_transition(&with(true, "again"))
        .await
        .expect("repeat"));
    assert!(s
        .alert_transition(&with(false, "resolved"))
        .await
        .expect("resolve"));
    assert!(!s
        .alert_transition(&with(false, "still"))
        .await
        .expect("repeat"));
    let rows = alerts().await;
    let bodies: Vec<&str> = rows.iter().map(|r| r.body.as_str()).collect();
    assert_eq!(
        bodies,
        [r#"{"text":"firing"}"#, r#"{"text":"resolved"}"#],
        "one row per recorded change, none for a repeat"
    );
    assert!(rows.iter().all(|r| r.task_id.0 == 0 && r.url.is_none()));
    assert_ne!(rows[0].delivery_id, rows[1].delivery_id);
    // Claimable by the alert sender, and only by it.
    let claim = |kind| OutboxClaimParams {
        kind,
        limit: 10,
        lease: std::time::Duration::from_secs(30),
        now: None,
    };
    assert!(s
        .outbox_claim(&claim(OutboxKind::Death))
        .await
        .expect("claim deaths")
        .is_empty());
    assert_eq!(
        s.outbox_claim(&claim(OutboxKind::Alert))
            .await
            .expect("claim alerts")
            .len(),
        2
    );
    // A message that is not JSON, or too long, changes nothing.
    for bad in [
        Some("not json".to_owned()),
        Some(format!("\"{}\"", "x".repeat(ALERT_MESSAGE_MAX_BYTES))),
    ] {
        let p = AlertTransitionParams {
            message: bad,
            ..params("default", "backlog", true)
        };
        let err = s.alert_transition(&p).await.expect_err("invalid message");
        assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
    }
    assert!(
        s.alert_transition(&params("default", "backlog", true))
            .await
            .expect("fire"),
        "the refused calls recorded nothing"
    );
    assert_eq!(alerts().await.len(), 2, "nor wrote a row");
}
