//! The `exec` kind: a task runs a program of the allow-list.
//!
//! Payload: `{"program": "report", "args": ["--day", "2026-12-01"]}`. The program is a
//! name from `[exec] allow`, which maps it to an absolute path; the arguments are
//! passed as an array, never through a shell. The run gets a clean environment (only
//! the worker's variables named in `env`), no standard input, the configured working
//! directory, and a process group of its own. At the timeout, or when the task's run
//! is abandoned (the worker stops, the lease is lost), the whole group is killed:
//! children the program started die with it. Standard output and error are kept up
//! to `max_output` bytes each (at most 1 MiB; the rest is read and dropped).
//!
//! Exit code 0: success, the result is `{"exit_code": 0, "stdout": ..., "stderr": ...}`.
//! A code listed in `permanent_exit_codes`: permanent. Any other code, a signal, or
//! the timeout: retried.
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tenax_core::{Command, CommandError, RetryPolicy, TaskContext};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::config::{ConfigError, ExecConfig};

/// The `exec` kind's command type.
pub const TYPE: &str = "exec";

/// Most arguments one task may pass.
const ARGS_MAX: usize = 256;

/// A task of the `exec` kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecPayload {
    /// A name from `[exec] allow`.
    pub program: String,
    /// The arguments.
    #[serde(default)]
    pub args: Vec<String>,
}

/// The `exec` command: register it only when an allow-list is configured.
#[derive(Clone)]
pub struct ExecKind {
    config: Arc<ExecConfig>,
}

impl ExecKind {
    /// A handler for this allow-list (validated here; an empty list is refused).
    pub fn new(config: ExecConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        if config.allow.is_empty() {
            return Err(crate::config::config_err(
                "exec.allow",
                "the exec kind needs at least one allowed program",
            ));
        }
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

/// The process group of a started program (its own: the program leads it). Dropped
/// while armed, it kills every process of the group, so that neither a timeout nor
/// an abandoned run leaves the program's children running.
struct ProcessGroup {
    leader: Option<rustix::process::Pid>,
}

impl ProcessGroup {
    fn of(child: &tokio::process::Child) -> Self {
        let leader = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        Self { leader }
    }

    /// Send SIGKILL to every process of the group (once). A group already empty is
    /// not an error.
    fn kill(&mut self) {
        if let Some(leader) = self.leader.take() {
            if let Err(e) =
                rustix::process::kill_process_group(leader, rustix::process::Signal::KILL)
            {
                if e != rustix::io::Errno::SRCH {
                    tracing::warn!(error = %e, group = leader.as_raw_nonzero().get(), "killing an exec process group failed");
                }
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Read all of `reader`, keeping the first `max` bytes; says whether more came.
async fn bounded(mut reader: impl AsyncRead + Unpin, max: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, truncated)
}

impl Command for ExecKind {
    const TYPE: &'static str = TYPE;
    type Context = ExecPayload;
    type Output = Value;

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::exponential(
            self.config.backoff_base.unwrap_or(Duration::from_secs(1)),
            self.config.backoff_cap.unwrap_or(Duration::from_secs(600)),
        )
    }

    async fn execute(&self, ctx: ExecPayload, _task: &TaskContext) -> Result<Value, CommandError> {
        let Some(path) = self.config.allow.get(&ctx.program) else {
            return Err(CommandError::permanent(format!(
                "program {:?} is not in the exec allow-list",
                ctx.program.chars().take(100).collect::<String>()
            )));
        };
        if ctx.args.len() > ARGS_MAX || ctx.args.iter().any(|a| a.contains('\0')) {
            return Err(CommandError::permanent(format!(
                "at most {ARGS_MAX} arguments, without NUL characters"
            )));
        }
        let timeout = self.config.timeout.unwrap_or(ExecConfig::TIMEOUT_DEFAULT);
        let max = self
            .config
            .max_output
            .unwrap_or(ExecConfig::MAX_OUTPUT_DEFAULT);
        let dir = self
            .config
            .working_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let mut command = tokio::process::Command::new(path);
        command.args(&ctx.args).env_clear();
        for name in &self.config.env {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        let mut child = command
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                // A missing program will not appear by itself; a busy system might recover.
                let message = format!("cannot start {}: {e}", path.display());
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::PermissionDenied
                {
                    CommandError::permanent(message)
                } else {
                    CommandError::retryable(message)
                }
            })?;
        // From here on, returning or being dropped kills the program's whole group.
        let mut group = ProcessGroup::of(&child);
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(CommandError::retryable(
                "the program's output pipes are missing",
            ));
        };
        let run = async {
            let (out, err, status) =
                tokio::join!(bounded(stdout, max), bounded(stderr, max), child.wait());
            (out, err, status)
        };
        let finished = tokio::time::timeout(timeout, run).await;
        let ((out, out_cut), (err, err_cut), status) = match finished {
            Ok(done) => done,
            Err(_) => {
                // The whole group (children holding the pipes included), then reap the
                // program so no zombie is left.
                group.kill();
                let _ = child.kill().await;
                return Err(CommandError::retryable(format!(
                    "{} timed out after {timeout:?} and was killed",
                    ctx.program
                )));
            }
        };
        // The program has exited and its output is closed; processes it left behind in
        // its group (detached from the pipes) end with it.
        group.kill();
        let status = status.map_err(|e| CommandError::retryable(format!("waiting: {e}")))?;
        let stdout = String::from_utf8_lossy(&out).into_owned();
        let stderr = String::from_utf8_lossy(&err).into_owned();
        let result = serde_json::json!({
            "exit_code": status.code(),
            "stdout": stdout,
            "stderr": stderr,
            "truncated": out_cut || err_cut,
        });
        match status.code() {
            Some(0) => Ok(result),
            Some(code) => {
                let tail: String = stderr
                    .chars()
                    .rev()
                    .take(500)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                let message = if tail.trim().is_empty() {
                    format!("{} exited with code {code}", ctx.program)
                } else {
                    format!(
                        "{} exited with code {code}: {}",
                        ctx.program,
                        tail.trim_end()
                    )
                };
                if self.config.permanent_exit_codes.contains(&code) {
                    Err(CommandError::permanent(message))
                } else {
                    Err(CommandError::retryable(message))
                }
            }
            None => Err(CommandError::retryable(format!(
                "{} was stopped by a signal",
                ctx.program
            ))),
        }
    }
}
