//! TLS to PostgreSQL through the URL: against a private server that accepts TCP
//! connections only over TLS (self-signed certificate), `sslmode=require` works and
//! `sslmode=disable` is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Output};

use tenax_torture::private_pg::{find_bindir, PrivatePostgres};

fn tenax(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env("TENAX_LOG", "warn")
        .output()
        .expect("run tenax")
}

#[test]
fn postgres_over_tls_is_chosen_by_the_url() {
    if find_bindir().is_none() {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "no PostgreSQL server binaries, but TENAX_REQUIRE_ALL_BACKENDS=1: every backend must be tested"
        );
        eprintln!("SKIP: no PostgreSQL server binaries (initdb, pg_ctl) found");
        return;
    }
    let pg = PrivatePostgres::start_with_tls().expect("start a private TLS-only PostgreSQL");
    let plain = tenax(&format!("{}?sslmode=disable", pg.url()), &["migrate"]);
    assert!(
        !plain.status.success(),
        "a plain connection should be rejected by the TLS-only server"
    );
    let url = format!("{}?sslmode=require", pg.url());
    let migrate = tenax(&url, &["migrate"]);
    assert!(
        migrate.status.success(),
        "migrate over TLS: {}\nserver log:\n{}",
        String::from_utf8_lossy(&migrate.stderr),
        pg.log()
    );
    let enqueue = tenax(&url, &["enqueue", "NOOP", "{}", "--no", "over-tls"]);
    assert!(
        enqueue.status.success(),
        "{}",
        String::from_utf8_lossy(&enqueue.stderr)
    );
    let show = tenax(&url, &["tasks", "show", "--no", "over-tls"]);
    assert!(show.status.success());
    assert!(String::from_utf8_lossy(&show.stdout).contains("over-tls"));
}
