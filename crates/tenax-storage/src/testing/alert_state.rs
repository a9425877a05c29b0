//! Conformance cases for the state of threshold alerts.
use crate::{AlertTransitionParams, StorageError};

use super::Harness;

fn params(queue: &str, alert: &str, firing: bool) -> AlertTransitionParams {
    AlertTransitionParams {
        queue: queue.into(),
        alert: alert.into(),
        firing,
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
