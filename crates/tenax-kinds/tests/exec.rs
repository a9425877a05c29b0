//! The `exec` kind's containment of the programs it runs: a timed-out or abandoned run
//! takes its whole process group down, the output kept is bounded, and the program sees
//! only the environment variables the configuration names.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tenax_core::{Command, TaskContext, TaskId, TaskKind, TaskNo};
use tenax_kinds::exec::{ExecKind, ExecPayload};
use tenax_kinds::ExecConfig;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn context() -> TaskContext {
    TaskContext::new(
        TaskId(1),
        TaskNo::new("exec-test").unwrap(),
        TaskKind::Execute,
        1,
        1,
        1,
        "exec-test".to_owned(),
        None,
        CancellationToken::new(),
    )
}

fn kind(
    programs: &[(&str, &str)],
    timeout: Duration,
    configure: impl FnOnce(&mut ExecConfig),
) -> ExecKind {
    let mut config = ExecConfig {
        allow: programs
            .iter()
            .map(|(name, path)| ((*name).to_owned(), PathBuf::from(path)))
            .collect::<BTreeMap<_, _>>(),
        timeout: Some(timeout),
        ..ExecConfig::default()
    };
    configure(&mut config);
    ExecKind::new(config).unwrap()
}

fn payload(program: &str, args: &[&str]) -> ExecPayload {
    ExecPayload {
        program: program.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// Whether a process is still running (a zombie waiting for its parent counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: `pid (comm) S ...`.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

async fn wait_until_gone(pids: &[u32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| alive(pid)) {
        assert!(
            Instant::now() < deadline,
            "{what}: processes {:?} still run 10 s later",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pids a shell script wrote (its own, then its background child's), once written.
async fn read_pids(file: &Path) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            let pids: Vec<u32> = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if pids.len() == 2 && text.ends_with('\n') {
                return pids;
            }
        }
        assert!(Instant::now() < deadline, "the script never wrote its pids");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shell that starts a long `sleep` in the background, writes both pids, and waits.
fn spawner(pid_file: &Path) -> String {
    format!(
        "sleep 300 & echo \"$$ $!\" > {}.tmp && mv {}.tmp {}; wait",
        pid_file.display(),
        pid_file.display(),
        pid_file.display()
    )
}

#[tokio::test]
async fn a_timed_out_program_takes_its_whole_process_group_down() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let exec = kind(&[("sh", "/bin/sh")], Duration::from_millis(700), |_| {});
    let script = spawner(&pid_file);
    let err = exec
        .execute(payload("sh", &["-c", &script]), &context())
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    let pids = read_pids(&pid_file).await;
    // The shell and the sleep it left in the background: both must be gone.
    wait_until_gone(&pids, "after the timeout").await;
}

#[tokio::test]
async fn an_abandoned_run_takes_its_whole_process_group_down() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let exec = kind(&[("sh", "/bin/sh")], Duration::from_secs(600), |_| {});
    let script = spawner(&pid_file);
    // The worker drops a run's future when it stops or loses the lease.
    let run = tokio::spawn(async move {
        exec.execute(payload("sh", &["-c", &script]), &context())
            .await
            .map_err(|e| e.to_string())
    });
    let pids = read_pids(&pid_file).await;
    assert!(
        pids.iter().all(|&p| alive(p)),
        "the program runs before it is abandoned"
    );
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    wait_until_gone(&pids, "after the run was dropped").await;
}

#[tokio::test]
async fn a_program_leaving_a_detached_child_behind_does_not_outlive_its_run() {
    // The child closes the pipes, so the run ends when the shell exits; the group is
    // killed then all the same.
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let exec = kind(&[("sh", "/bin/sh")], Duration::from_secs(60), |_| {});
    let script = format!(
        "sleep 300 >/dev/null 2>&1 </dev/null & echo \"$$ $!\" > {}",
        pid_file.display()
    );
    let out: Value = exec
        .execute(payload("sh", &["-c", &script]), &context())
        .await
        .unwrap();
    assert_eq!(out["exit_code"], 0);
    let pids = read_pids(&pid_file).await;
    wait_until_gone(&pids, "after the program exited").await;
}

#[tokio::test]
async fn output_beyond_max_output_is_cut_at_the_limit_and_flagged() {
    let limit = ExecConfig::MAX_OUTPUT_LIMIT;
    let exec = kind(&[("head", "/usr/bin/head")], Duration::from_secs(60), |c| {
        c.max_output = Some(limit);
    });
    // 3 MiB on standard output: the first MiB is kept, the rest read and dropped.
    let out: Value = exec
        .execute(payload("head", &["-c", "3145728", "/dev/zero"]), &context())
        .await
        .unwrap();
    assert_eq!(out["stdout"].as_str().unwrap().len(), limit);
    assert_eq!(out["truncated"], true);

    // A limit above 1 MiB is refused.
    let too_large = ExecConfig {
        allow: BTreeMap::from([("head".to_owned(), PathBuf::from("/usr/bin/head"))]),
        max_output: Some(limit + 1),
        ..ExecConfig::default()
    };
    let err = ExecKind::new(too_large)
        .err()
        .expect("a 1 MiB + 1 limit is refused");
    assert!(err.to_string().contains("exec.max_output"), "{err}");
}

#[tokio::test]
async fn a_program_sees_only_the_environment_variables_named_in_env() {
    let exec = kind(&[("env", "/usr/bin/env")], Duration::from_secs(60), |c| {
        c.env = vec!["PATH".to_owned(), "TENAX_SURELY_UNSET_VARIABLE".to_owned()];
    });
    let out: Value = exec.execute(payload("env", &[]), &context()).await.unwrap();
    let stdout = out["stdout"].as_str().unwrap();
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    let expected: Vec<&str> = if std::env::var_os("PATH").is_some() {
        vec!["PATH"]
    } else {
        Vec::new()
    };
    assert_eq!(names, expected, "the program's environment: {stdout}");

    // Without `env`, the program gets no variable at all.
    let bare = kind(&[("env", "/usr/bin/env")], Duration::from_secs(60), |_| {});
    let out: Value = bare.execute(payload("env", &[]), &context()).await.unwrap();
    assert_eq!(out["stdout"], "");

    // A name that is not a variable name is refused when the configuration is read.
    for bad in ["", "1PATH", "PATH=x", "A B", "Ä"] {
        let config = ExecConfig {
            allow: BTreeMap::from([("env".to_owned(), PathBuf::from("/usr/bin/env"))]),
            env: vec![bad.to_owned()],
            ..ExecConfig::default()
        };
        let err = ExecKind::new(config)
            .err()
            .expect("a bad variable name is refused");
        assert!(err.to_string().contains("exec.env"), "{bad:?}: {err}");
    }
}
