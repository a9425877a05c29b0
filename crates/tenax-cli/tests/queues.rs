//! `tenax queues`: what an operator types, end to end on SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Output};

fn tenax(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url])
        .args(args)
        .env("TENAX_LOG", "warn")
        .output()
        .expect("run tenax")
}

fn ok(url: &str, args: &[&str]) -> String {
    let out = tenax(url, args);
    assert!(
        out.status.success(),
        "tenax {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `mail` row of `tenax queues list`, as its cells.
fn mail_row(url: &str) -> Vec<String> {
    let list = ok(url, &["queues", "list"]);
    let line = list
        .lines()
        .find(|l| l.contains(" mail "))
        .unwrap_or_else(|| panic!("no mail queue in:\n{list}"));
    line.split('|')
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn queues_are_paused_limited_and_listed_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    for _ in 0..2 {
        ok(&url, &["enqueue", "NOOP", "--queue", "mail"]);
    }
    // queue, pending, running, paused, limit
    assert_eq!(mail_row(&url), ["mail", "2", "0", "no", "unlimited"]);

    assert!(ok(&url, &["queues", "pause", "mail"]).contains("paused"));
    ok(&url, &["queues", "limit", "mail", "--max-running", "3"]);
    assert_eq!(mail_row(&url), ["mail", "2", "0", "yes", "3"]);

    // Bad input: a clear error, and nothing changed.
    let zero = tenax(&url, &["queues", "limit", "mail", "--max-running", "0"]);
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("max_running"));
    let neither = tenax(&url, &["queues", "limit", "mail"]);
    assert!(!neither.status.success());
    let both = tenax(
        &url,
        &[
            "queues",
            "limit",
            "mail",
            "--max-running",
            "2",
            "--unlimited",
        ],
    );
    assert!(!both.status.success());
    assert!(!tenax(&url, &["queues", "pause", "has space"])
        .status
        .success());
    assert_eq!(mail_row(&url), ["mail", "2", "0", "yes", "3"]);

    ok(&url, &["queues", "resume", "mail"]);
    ok(&url, &["queues", "limit", "mail", "--unlimited"]);
    assert_eq!(mail_row(&url), ["mail", "2", "0", "no", "unlimited"]);
}
