//! `tenax tasks bulk ...` and `tenax audit list`: what an operator types, end to end on
//! SQLite, and the audit entry each acting command records.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Output};

fn tenax(url: &str, user: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tenax"));
    command
        .args(["--database-url", url])
        .args(args)
        .env("TENAX_LOG", "warn");
    match user {
        Some(user) => command.env("USER", user),
        None => command.env_remove("USER"),
    };
    command.output().expect("run tenax")
}

fn ok(url: &str, args: &[&str]) -> String {
    let out = tenax(url, Some("alice"), args);
    assert!(
        out.status.success(),
        "tenax {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The audit log, oldest first, as JSON objects.
fn audit(url: &str) -> Vec<serde_json::Value> {
    let mut entries: Vec<serde_json::Value> =
        ok(url, &["audit", "list", "--json", "--limit", "1000"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    entries.reverse();
    entries
}

/// The id of the task `tenax enqueue` printed.
fn enqueue(url: &str, command_type: &str, queue: &str) -> String {
    let out = ok(url, &["enqueue", command_type, "--queue", queue]);
    out.split_whitespace().nth(2).unwrap().to_owned()
}

fn status_and_priority(url: &str, id: &str) -> (String, String) {
    let show = ok(url, &["tasks", "show", id]);
    let cell = |name: &str| {
        show.lines()
            .find(|l| l.contains(&format!(" {name} ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{show}"))
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .nth(1)
            .unwrap_or("")
            .to_owned()
    };
    (cell("status"), cell("queue / priority"))
}

#[test]
fn bulk_actions_and_single_actions_are_recorded_in_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let a: Vec<String> = (0..3).map(|_| enqueue(&url, "A_TYPE", "mail")).collect();
    let b = enqueue(&url, "B_TYPE", "mail");
    let other = enqueue(&url, "A_TYPE", "other");

    let out = ok(
        &url,
        &[
            "tasks",
            "bulk",
            "reprioritise",
            "--priority",
            "9",
            "--type",
            "A_TYPE",
            "--queue",
            "mail",
        ],
    );
    assert!(out.contains("set priority 9 on 3 task(s)"), "{out}");
    for id in &a {
        assert_eq!(status_and_priority(&url, id).1, "mail / 9");
    }
    assert_eq!(status_and_priority(&url, &b).1, "mail / 5");
    assert_eq!(status_and_priority(&url, &other).1, "other / 5");

    let out = ok(
        &url,
        &[
            "tasks", "bulk", "cancel", "--queue", "mail", "--limit", "2", "--status", "pending",
        ],
    );
    assert!(out.contains("cancelled 2 task(s)"), "{out}");
    assert!(out.contains("limit (2) was reached"), "{out}");
    assert_eq!(status_and_priority(&url, &a[0]).0, "cancelled");
    assert_eq!(status_and_priority(&url, &a[1]).0, "cancelled");
    assert_eq!(status_and_priority(&url, &a[2]).0, "pending");

    // Nothing is dead: a bulk retry changes nothing, and is still recorded.
    let out = ok(&url, &["tasks", "bulk", "retry", "--created-after", "1h"]);
    assert!(out.contains("retried 0 dead task(s)"), "{out}");

    // A quoted value is a value: it matches nothing.
    let out = ok(&url, &["tasks", "bulk", "cancel", "--type", "x' OR '1'='1"]);
    assert!(out.contains("cancelled 0 task(s)"), "{out}");
    assert_eq!(status_and_priority(&url, &b).0, "pending");

    // Refused input: an error, nothing changed, nothing recorded.
    let before = audit(&url).len();
    let refused = tenax(
        &url,
        Some("alice"),
        &["tasks", "bulk", "cancel", "--limit", "0"],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("limit"));
    assert_eq!(audit(&url).len(), before);
    assert_eq!(status_and_priority(&url, &b).0, "pending");

    ok(&url, &["tasks", "cancel", &b]);
    ok(&url, &["queues", "pause", "mail"]);
    ok(&url, &["queues", "resume", "mail"]);
    ok(
        &url,
        &["schedules", "add", "nightly", "NOOP", "--every", "1h"],
    );
    ok(&url, &["schedules", "pause", "nightly"]);
    ok(&url, &["schedules", "resume", "nightly"]);
    ok(&url, &["schedules", "remove", "nightly"]);
    ok(
        &url,
        &["rate-limits", "set", "SEND_MAIL", "--per-second", "2.5"],
    );
    ok(&url, &["rate-limits", "remove", "SEND_MAIL"]);
    ok(&url, &["events", "on", "--queue", "mail"]);
    // Already on: nothing changed, nothing recorded.
    ok(&url, &["events", "on", "--queue", "mail"]);
    ok(&url, &["events", "off", "--queue", "mail"]);
    let nobody = tenax(&url, None, &["queues", "pause", "other"]);
    assert!(nobody.status.success());

    let entries = audit(&url);
    let actions: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap(),
                e["action"].as_str().unwrap(),
                e["target"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            (
                "cli:alice",
                "tasks.bulk_reprioritise",
                "type=A_TYPE queue=mail"
            ),
            (
                "cli:alice",
                "tasks.bulk_cancel",
                "status=pending queue=mail"
            ),
            ("cli:alice", "tasks.bulk_retry", actions[2].2),
            ("cli:alice", "tasks.bulk_cancel", "type=x' OR '1'='1"),
            ("cli:alice", "task.cancel", b.as_str()),
            ("cli:alice", "queue.pause", "mail"),
            ("cli:alice", "queue.resume", "mail"),
            ("cli:alice", "schedule.add", "nightly"),
            ("cli:alice", "schedule.pause", "nightly"),
            ("cli:alice", "schedule.resume", "nightly"),
            ("cli:alice", "schedule.remove", "nightly"),
            ("cli:alice", "rate_limit.set", "SEND_MAIL"),
            ("cli:alice", "rate_limit.remove", "SEND_MAIL"),
            ("cli:alice", "events.rule_on", "event_rules"),
            ("cli:alice", "events.rule_off", "event_rules"),
            ("cli:unknown", "queue.pause", "other"),
        ]
    );
    assert!(
        actions[2].2.starts_with("created_after="),
        "{}",
        actions[2].2
    );
    assert_eq!(entries[0]["details"]["changed"], 3);
    assert_eq!(entries[0]["details"]["priority"], 9);
    assert_eq!(entries[1]["details"]["limit"], 2);
    assert_eq!(entries[1]["details"]["cancel_requested"], 0);
    // The same details as the HTTP API records.
    let rate = &entries[entries.len() - 5]["details"];
    assert_eq!(
        (rate["per_second"].as_f64(), rate["burst"].as_u64()),
        (Some(2.5), Some(3))
    );
    let rule = &entries[entries.len() - 3]["details"];
    assert_eq!(rule["queue"], "mail");
    assert!(rule["command_type"].is_null(), "{rule}");

    // Filters and paging of the listing.
    let cancels = ok(&url, &["audit", "list", "--action", "task.cancel"]);
    assert!(cancels.contains("1 entr(ies)"), "{cancels}");
    let page = ok(&url, &["audit", "list", "--limit", "2"]);
    let last = entries[entries.len() - 2]["id"].as_i64().unwrap();
    assert!(page.contains(&format!("--before {last}")), "{page}");
    let unknown = ok(&url, &["audit", "list", "--actor", "cli:unknown"]);
    assert!(unknown.contains("1 entr(ies)"), "{unknown}");
}
