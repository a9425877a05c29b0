//! `tenax rate-limits`: what an operator types, end to end on SQLite.
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

/// The rows of `tenax rate-limits list`, as their cells.
fn rows(url: &str) -> Vec<Vec<String>> {
    let list = ok(url, &["rate-limits", "list"]);
    list.lines()
        .filter(|l| l.starts_with('|') && !l.contains("command type") && !l.contains("-+-"))
        .map(|line| {
            line.split('|')
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect()
}

fn failure(url: &str, args: &[&str]) -> String {
    let out = tenax(url, args);
    assert!(!out.status.success(), "tenax {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn rate_limits_are_set_listed_and_removed_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    assert!(rows(&url).is_empty());

    let set = ok(
        &url,
        &[
            "rate-limits",
            "set",
            "SEND_MAIL",
            "--per-second",
            "20",
            "--burst",
            "5",
        ],
    );
    assert!(set.contains("SEND_MAIL: 20/s, burst 5"), "{set}");
    // Without --burst, one second's worth.
    ok(
        &url,
        &["rate-limits", "set", "CHARGE", "--per-second", "2.5"],
    );
    assert_eq!(
        rows(&url),
        [["CHARGE", "2.5", "3"], ["SEND_MAIL", "20", "5"]]
    );

    // Bad input: a clear error, and nothing changed.
    for (args, word) in [
        (
            &["rate-limits", "set", "SEND_MAIL", "--per-second", "0"][..],
            "per_second",
        ),
        (
            &["rate-limits", "set", "SEND_MAIL", "--per-second", "2000000"][..],
            "per_second",
        ),
        (
            &[
                "rate-limits",
                "set",
                "SEND_MAIL",
                "--per-second",
                "1",
                "--burst",
                "0",
            ][..],
            "burst",
        ),
        (
            &["rate-limits", "set", "has space", "--per-second", "1"][..],
            "command type",
        ),
        (&["rate-limits", "set", "SEND_MAIL"][..], "--per-second"),
        (&["rate-limits", "remove", "MISSING"][..], "MISSING"),
    ] {
        let stderr = failure(&url, args);
        assert!(stderr.contains(word), "{args:?}: {stderr}");
    }
    assert_eq!(
        rows(&url),
        [["CHARGE", "2.5", "3"], ["SEND_MAIL", "20", "5"]]
    );

    ok(&url, &["rate-limits", "remove", "CHARGE"]);
    assert_eq!(rows(&url), [["SEND_MAIL", "20", "5"]]);
}
