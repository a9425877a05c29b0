//! MariaDB with binary logging on, as a replicated production server runs it: creating
//! the outbox trigger then needs SUPER or `log_bin_trust_function_creators`. A user
//! without either gets a clear error before anything is migrated; once the server
//! trusts function creators, the same user migrates and the trigger writes the outbox.
//! On a private server (the test changes a global setting).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::Duration;

use tenax::storage::{OutboxKind, OutboxListParams, StorageError, TaskRef};
use tenax::Client;
use tenax_torture::private_mariadb::{self, PrivateMariadb};

fn as_root(db: &PrivateMariadb, sql: &str) {
    let out = Command::new("mariadb")
        .args([
            "-h",
            "127.0.0.1",
            "-P",
            &db.port().to_string(),
            "-u",
            "root",
        ])
        .args(["-e", sql])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tables(db: &PrivateMariadb) -> String {
    let out = Command::new("mariadb")
        .args([
            "-h",
            "127.0.0.1",
            "-P",
            &db.port().to_string(),
            "-u",
            "root",
        ])
        .args(["-N", "-e", "SHOW TABLES FROM tenax"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_binary_logging_a_user_without_super_is_told_what_to_set_and_nothing_is_migrated() {
    if !private_mariadb::available() {
        assert!(
            std::env::var_os("TENAX_REQUIRE_ALL_BACKENDS").is_none(),
            "the MariaDB server tools are required"
        );
        eprintln!("skipped: no MariaDB server tools");
        return;
    }
    let db = PrivateMariadb::start_with_binlog().unwrap();
    as_root(
        &db,
        "CREATE USER 'app'@'127.0.0.1'; GRANT ALL PRIVILEGES ON tenax.* TO 'app'@'127.0.0.1';",
    );
    let url = format!("mysql://app@127.0.0.1:{}/tenax", db.port());

    let refused = tenax::storage::connect(&url)
        .await
        .err()
        .expect("refused without SUPER or trust");
    let StorageError::Migration(message) = &refused else {
        panic!("not a migration error: {refused:?}");
    };
    assert!(
        message.contains("log_bin_trust_function_creators = 1") && message.contains("SUPER"),
        "the error says what to set: {message}"
    );
    assert_eq!(tables(&db), "", "nothing was migrated");

    as_root(&db, "SET GLOBAL log_bin_trust_function_creators = 1");
    let storage = tenax::storage::connect(&url).await.expect("migrates");
    // The trigger runs under binary logging: a cancelled task with a callback URL
    // writes its outbox row.
    let client = Client::new(storage.clone());
    let task = client
        .enqueue_raw("anything", &serde_json::json!({}))
        .callback_url("https://hooks.example/done")
        .await
        .expect("enqueue")
        .task;
    client.cancel(TaskRef::Id(task.id)).await.expect("cancel");
    let rows = tokio::time::timeout(
        Duration::from_secs(10),
        storage.outbox_list(&OutboxListParams {
            kind: Some(OutboxKind::Callback),
            status: None,
            task_id: Some(task.id),
            limit: 10,
        }),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(tables(&db).contains("tenax_outbox"));
}
