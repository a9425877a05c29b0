//! `tenax enqueue --concurrency-key`: what an operator types, end to end on SQLite.
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

#[test]
fn a_concurrency_key_is_stored_shown_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    ok(&url, &["migrate"]);
    ok(
        &url,
        &[
            "enqueue",
            "NOOP",
            "--no",
            "K1",
            "--concurrency-key",
            "order-7",
            "--concurrency-limit",
            "3",
        ],
    );
    let shown = ok(&url, &["tasks", "show", "--no", "K1"]);
    assert!(
        shown.contains("order-7 (at most 3 at once)"),
        "no key in:\n{shown}"
    );
    // Refusals: a limit out of range, an empty key, a limit without a key.
    for args in [
        &[
            "enqueue",
            "NOOP",
            "--concurrency-key",
            "k",
            "--concurrency-limit",
            "0",
        ][..],
        &["enqueue", "NOOP", "--concurrency-key", ""][..],
        &["enqueue", "NOOP", "--concurrency-limit", "2"][..],
    ] {
        let out = tenax(&url, args);
        assert!(!out.status.success(), "{args:?} was accepted");
    }
    let list = ok(&url, &["tasks", "list"]);
    assert_eq!(
        list.matches("NOOP").count(),
        1,
        "a refused enqueue stored a task:\n{list}"
    );
}
