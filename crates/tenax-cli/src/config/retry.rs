//! `[retry."TYPE"]`: the retry policy and attempt budget of a command type, checked
//! with each error naming its key.
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::secs;

/// One `[retry."TYPE"]` table; its values are checked by [`retry_policies`] so that
/// each error names its key.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryFile {
    pub(crate) backoff: Option<String>,
    pub(crate) base: Option<String>,
    pub(crate) cap: Option<String>,
    pub(crate) step: Option<String>,
    pub(crate) jitter: Option<String>,
    pub(crate) max_retry_after: Option<String>,
    pub(crate) max_attempts: Option<u32>,
}

/// What `[retry."TYPE"]` sets for one command type.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandRetry {
    /// The backoff the worker uses instead of the command's own; `None` when the table
    /// sets only `max_attempts`.
    pub(crate) policy: Option<tenax::RetryPolicy>,
    /// The attempt budget of a task enqueued without one (HTTP API, `tenax enqueue`,
    /// `tenax schedules create`).
    pub(crate) max_attempts: Option<u32>,
}

/// The attempt budget `retry` (the resolved `[retry."TYPE"]` tables) gives a task of
/// `command_type` enqueued without one, else the standard default.
pub(crate) fn max_attempts_of(retry: &BTreeMap<String, CommandRetry>, command_type: &str) -> u32 {
    retry
        .get(command_type)
        .and_then(|r| r.max_attempts)
        .unwrap_or(tenax::CommandDefaults::STANDARD.max_attempts)
}

/// The most attempts a task may be given, as the HTTP API accepts.
const MAX_ATTEMPTS_LIMIT: u32 = 1000;

/// The `[retry."TYPE"]` tables, each checked; an error names the key.
pub(crate) fn retry_policies(
    tables: &BTreeMap<String, RetryFile>,
) -> anyhow::Result<BTreeMap<String, CommandRetry>> {
    let mut resolved = BTreeMap::new();
    for (command_type, table) in tables {
        let key = format!("retry.{command_type:?}");
        tenax::validate_command_type(command_type)
            .map_err(|e| anyhow::anyhow!("{key}: {:?} is not a command type: {e}", command_type))?;
        resolved.insert(command_type.clone(), retry_policy(table, &key)?);
    }
    Ok(resolved)
}

fn retry_policy(table: &RetryFile, key: &str) -> anyhow::Result<CommandRetry> {
    use tenax::{Jitter, RetryPolicy};
    let span = |name: &str, text: &Option<String>| -> anyhow::Result<Option<Duration>> {
        text.as_ref()
            .map(|t| {
                humantime::parse_duration(t).map_err(|e| {
                    anyhow::anyhow!(
                        "{key}.{name}: {t:?} is not a duration ({e}; examples: 500ms, 5s, 1h)"
                    )
                })
            })
            .transpose()
    };
    let max_attempts = match table.max_attempts {
        Some(n) if n == 0 || n > MAX_ATTEMPTS_LIMIT => {
            anyhow::bail!("{key}.max_attempts: {n} is out of range (1 to {MAX_ATTEMPTS_LIMIT})")
        }
        other => other,
    };
    let base = span("base", &table.base)?;
    let cap = span("cap", &table.cap)?;
    let step = span("step", &table.step)?;
    let max_retry_after = span("max_retry_after", &table.max_retry_after)?;
    let sets_policy = table.backoff.is_some()
        || base.is_some()
        || cap.is_some()
        || step.is_some()
        || table.jitter.is_some()
        || max_retry_after.is_some();
    if !sets_policy {
        return Ok(CommandRetry {
            policy: None,
            max_attempts,
        });
    }
    let base = base.unwrap_or(RetryPolicy::BASE_DEFAULT);
    let backoff = table.backoff.as_deref().unwrap_or("exponential");
    if step.is_some() && backoff != "linear" {
        anyhow::bail!("{key}.step: only a linear backoff has a step (backoff = {backoff:?})");
    }
    let mut policy = match backoff {
        "exponential" => RetryPolicy::exponential(base, cap.unwrap_or(RetryPolicy::CAP_DEFAULT)),
        "fixed" => {
            if cap.is_some() {
                anyhow::bail!("{key}.cap: a fixed backoff waits `base` every time and has no cap");
            }
            RetryPolicy::fixed(base)
        }
        "linear" => {
            let Some(step) = step else {
                anyhow::bail!("{key}.step: a linear backoff needs its step (for example \"30s\")");
            };
            RetryPolicy::linear(base, step, cap.unwrap_or(RetryPolicy::CAP_DEFAULT))
        }
        other => anyhow::bail!(
            "{key}.backoff: {other:?} is not a backoff (exponential, fixed or linear)"
        ),
    };
    if policy.base > policy.cap {
        anyhow::bail!(
            "{key}.cap: {} is below the base {}: every delay would be the cap",
            secs(policy.cap),
            secs(policy.base)
        );
    }
    if let Some(jitter) = &table.jitter {
        policy = policy.with_jitter(match jitter.as_str() {
            "full" => Jitter::Full,
            "equal" => Jitter::Equal,
            "none" => Jitter::None,
            other => anyhow::bail!("{key}.jitter: {other:?} is not a jitter (full, equal or none)"),
        });
    }
    if let Some(max) = max_retry_after {
        policy = policy.with_max_retry_after(max);
    }
    Ok(CommandRetry {
        policy: Some(policy),
        max_attempts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn retry_of(text: &str) -> anyhow::Result<BTreeMap<String, CommandRetry>> {
        retry_policies(&parse(text)?.retry)
    }

    #[test]
    fn retry_tables_resolve_to_policies_and_attempt_budgets() {
        let retry = retry_of(
            "[retry.\"SEND_EMAIL\"]\nbackoff = \"linear\"\nbase = \"2s\"\nstep = \"3s\"\ncap = \"20s\"\n\
             jitter = \"none\"\nmax_attempts = 9\n\
             [retry.http]\nbackoff = \"fixed\"\nbase = \"750ms\"\nmax_retry_after = \"10m\"\n\
             [retry.\"billing.charge\"]\nmax_attempts = 2\n",
        )
        .unwrap();
        let linear = retry["SEND_EMAIL"].policy.clone().unwrap();
        let secs: Vec<u64> = (1..=8).map(|n| linear.ceiling(n).as_secs()).collect();
        assert_eq!(secs, [2, 5, 8, 11, 14, 17, 20, 20]);
        assert_eq!(linear.jitter, tenax::Jitter::None);
        assert_eq!(max_attempts_of(&retry, "SEND_EMAIL"), 9);
        let fixed = retry["http"].policy.clone().unwrap();
        assert_eq!(fixed.ceiling(5), Duration::from_millis(750));
        assert_eq!(fixed.jitter, tenax::Jitter::None);
        assert_eq!(
            fixed.clamp_retry_after(Duration::from_secs(3600)),
            Duration::from_secs(600)
        );
        assert_eq!(max_attempts_of(&retry, "http"), 5, "the standard budget");
        // Only a budget: the command keeps its own backoff.
        assert!(retry["billing.charge"].policy.is_none());
        assert_eq!(max_attempts_of(&retry, "billing.charge"), 2);
        assert_eq!(max_attempts_of(&retry, "OTHER"), 5);
        // Defaults: exponential from 5 s to an hour, full jitter.
        let default = retry_of("[retry.X]\njitter = \"equal\"\n").unwrap()["X"]
            .policy
            .clone()
            .unwrap();
        assert_eq!(
            (default.ceiling(1), default.ceiling(30), default.jitter),
            (
                Duration::from_secs(5),
                Duration::from_secs(3600),
                tenax::Jitter::Equal
            )
        );
    }

    #[test]
    fn bad_retry_tables_are_refused_with_the_key_named() {
        for (text, wanted) in [
            (
                "[retry.X]\nbackoff = \"quadratic\"\n",
                [
                    "retry.\"X\".backoff",
                    "\"quadratic\"",
                    "exponential, fixed or linear",
                ],
            ),
            (
                "[retry.X]\nbase = \"soon\"\n",
                ["retry.\"X\".base", "\"soon\"", "duration"],
            ),
            (
                "[retry.X]\nbase = \"1m\"\ncap = \"10s\"\n",
                ["retry.\"X\".cap", "10s", "below the base"],
            ),
            (
                "[retry.X]\nbackoff = \"linear\"\n",
                ["retry.\"X\".step", "linear", "needs"],
            ),
            (
                "[retry.X]\nstep = \"1s\"\n",
                ["retry.\"X\".step", "only a linear", "exponential"],
            ),
            (
                "[retry.X]\nbackoff = \"fixed\"\ncap = \"1m\"\n",
                ["retry.\"X\".cap", "fixed", "no cap"],
            ),
            (
                "[retry.X]\njitter = \"some\"\n",
                ["retry.\"X\".jitter", "\"some\"", "full, equal or none"],
            ),
            (
                "[retry.X]\nmax_attempts = 0\n",
                ["retry.\"X\".max_attempts", "0", "1 to 1000"],
            ),
            (
                "[retry.X]\nmax_attempts = 1001\n",
                ["retry.\"X\".max_attempts", "1001", "1 to 1000"],
            ),
            (
                "[retry.\"has space\"]\nmax_attempts = 3\n",
                ["retry.\"has space\"", "not a command type", ""],
            ),
        ] {
            let err = match retry_of(text) {
                Ok(r) => panic!("accepted {text:?}: {r:?}"),
                Err(e) => format!("{e:#}"),
            };
            for part in wanted {
                assert!(err.contains(part), "{text:?}: {err:?} lacks {part:?}");
            }
        }
        // Unknown keys are refused by name.
        let err = format!(
            "{:#}",
            retry_of("[retry.X]\nbase_delay = \"1s\"\n").unwrap_err()
        );
        assert!(err.contains("base_delay"), "{err}");
    }
}
