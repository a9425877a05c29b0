//! Every key of `tenax.toml` with its environment variable, flag, default and meaning:
//! the generated configuration reference.
use tenax::WorkerConfig;

use super::{days, secs, Key, DATABASE_URL_DEFAULT};

/// Every key of `tenax.toml`, with its default taken from the code.
pub(crate) fn reference() -> Vec<Key> {
    let mut keys = worker_reference();
    keys.extend(crate::serve::reference());
    keys.extend(crate::kinds::reference());
    keys
}

fn worker_reference() -> Vec<Key> {
    let d = WorkerConfig::default();
    let key = |key, env, flag, default: String, doc| Key {
        key,
        env,
        flag,
        default,
        doc,
    };
    vec![
        key(
            "database_url",
            "TENAX_DATABASE_URL",
            "--database-url",
            DATABASE_URL_DEFAULT.into(),
            "`sqlite://PATH`, `postgres://...[?schema=NAME]` or `mysql://...` / `mariadb://...`.",
        ),
        key(
            "log_format",
            "TENAX_LOG_FORMAT",
            "--log-format",
            crate::observe::LogFormat::default().to_string(),
            "`text` or `json`; inside a task every line carries the task's id, number, command type and attempt. The level comes from `TENAX_LOG` (an env-filter, e.g. `info,tenax_runtime=debug`).",
        ),
        key(
            "worker.queues",
            "TENAX_WORKER_QUEUES (comma-separated)",
            "--queue",
            format!("{:?}", d.queues),
            "Queues to claim from.",
        ),
        key(
            "worker.concurrency",
            "TENAX_WORKER_CONCURRENCY",
            "--concurrency",
            d.concurrency.to_string(),
            "Tasks run at once.",
        ),
        key(
            "worker.claim_batch",
            "",
            "",
            d.claim_batch.to_string(),
            "Most tasks claimed in one statement.",
        ),
        key(
            "worker.prefetch",
            "",
            "",
            "follows the handlers' pace, from concurrency up to claim_batch".to_owned(),
            "Claimed tasks held ready beyond the running ones (leased, renewed and counted by every limit as running; handed back at once on a graceful stop). Unset, the buffer starts at `concurrency` and doubles, up to `claim_batch`, while handlers empty it faster than a claim returns; a number fixes its size; `0` turns it off.",
        ),
        key(
            "worker.complete_batch",
            "",
            "",
            d.complete_batch.to_string(),
            "Most successes written in one completion transaction, and the most outcomes a worker holds decided but not yet committed: a handler that returns frees its slot at once while fewer wait.",
        ),
        key(
            "worker.batch_linger",
            "",
            "",
            humantime::format_duration(d.batch_linger).to_string(),
            "How long a success may wait for others to share its completion transaction, and, with the buffer off, how long a busy worker waits for half its slots to free before it claims; `0s` turns both off. An outcome is reported only after its completion committed.",
        ),
        key(
            "worker.poll_interval",
            "TENAX_WORKER_POLL_INTERVAL",
            "--poll-interval",
            secs(d.poll_interval),
            "Wait between claims when idle (a wake-up ends it sooner).",
        ),
        key(
            "worker.lease_ttl",
            "TENAX_WORKER_LEASE_TTL",
            "--lease-ttl",
            secs(d.lease_ttl),
            "Lease granted at each claim and heartbeat.",
        ),
        key(
            "worker.heartbeat_interval",
            "",
            "",
            "lease_ttl / 3".into(),
            "Time between lease renewals.",
        ),
        key(
            "worker.fence_margin",
            "",
            "",
            "lease_ttl / 6".into(),
            "A handler whose lease was not renewed by its expiry minus this margin is stopped.",
        ),
        key(
            "worker.shutdown_grace",
            "TENAX_WORKER_SHUTDOWN_GRACE",
            "--shutdown-grace",
            secs(d.shutdown_grace),
            "On stop, time running tasks get to finish before they are handed back.",
        ),
        key(
            "worker.reaper",
            "",
            "",
            d.reaper.to_string(),
            "Run the reaper (expired leases) in this worker.",
        ),
        key(
            "worker.reaper_interval",
            "",
            "",
            "lease_ttl / 6".into(),
            "Time between reaper passes.",
        ),
        key(
            "worker.pruner",
            "",
            "",
            d.pruner.to_string(),
            "Run the pruner (finished tasks) in this worker.",
        ),
        key(
            "worker.pruner_interval",
            "",
            "",
            secs(d.pruner_interval),
            "Time between pruner passes.",
        ),
        key(
            "worker.retention",
            "TENAX_WORKER_RETENTION",
            "--retention",
            secs(d.retention),
            "Finished tasks are deleted after this.",
        ),
        key(
            "worker.prune_batch",
            "",
            "",
            d.prune_batch.to_string(),
            "Most tasks deleted per pruner statement, and most rows per side table (dependencies, workflows, concurrency keys, audit entries) per sweep.",
        ),
        key(
            "worker.audit_retention",
            "",
            "",
            days(d.audit_retention),
            "Audit entries older than this are deleted by the pruner. A worker setting, as the pruner runs in the worker (`tenax serve` runs one too).",
        ),
        key(
            "worker.scheduler",
            "",
            "",
            d.scheduler.to_string(),
            "Fire the due ticks of periodic schedules in this worker (the database makes each tick fire once across nodes).",
        ),
        key(
            "worker.scheduler_interval",
            "",
            "",
            secs(d.scheduler_interval),
            "Time between scheduler passes: a tick fires at most about this late.",

        ),
        key(
            "worker.missed_tick_grace",
            "",
            "",
            secs(d.missed_tick_grace),
            "How late a tick of a schedule that skips missed ticks (the default; not `--catch-up`) may be and still fire: after an outage or a deploy longer than this, its missed ticks are skipped and the schedule goes on from the next one. At least `scheduler_interval`.",
        ),
        key(
            "worker.metrics_addr",
            "TENAX_WORKER_METRICS_ADDR",
            "--metrics-addr",
            "none (no metrics)".into(),
            "Serve Prometheus metrics on this address (for example `127.0.0.1:9464`); see `docs/reference/metrics.md`.",
        ),
        key(
            "worker.metrics_require_token",
            "",
            "",
            "false".into(),
            "Answer a scrape of `metrics_addr` only with `Authorization: Bearer <token>`, a token of `[[server.tokens]]` with role `read` or `admin` (401 without one, 403 for role `enqueue`).",
        ),
        key(
            "worker.metrics_sample_interval",
            "TENAX_WORKER_METRICS_SAMPLE_INTERVAL",
            "--metrics-sample-interval",
            secs(tenax::metrics::SAMPLE_INTERVAL_DEFAULT),
            "Time between two reads of the counts by queue and status from the database (only with `metrics_addr`).",
        ),
        key(
            "worker.background[].queue",
            "",
            "",
            "none (no background queue)".into(),
            "A `[[worker.background]]` table marks one of `worker.queues` background: it is claimed only while the due backlog of the worker's other queues is under `threshold`, or within `off_peak` hours, or once its oldest due task has waited `max_deferral`. Each queue at most once.",
        ),
        key(
            "worker.background[].threshold",
            "",
            "",
            "required".into(),
            "Claimed while fewer than this many tasks are due in the worker's other queues.",
        ),
        key(
            "worker.background[].max_deferral",
            "",
            "",
            "required".into(),
            "Claimed anyway once its oldest due task has waited this long (at least `1s`).",
        ),
        key(
            "worker.background[].off_peak",
            "",
            "",
            "none".into(),
            "Also claimed within these daily hours, whatever the backlog: `{ start = \"22:00\", end = \"06:00\", time_zone = \"Europe/Paris\" }` (`HH:MM`, end excluded; an end before the start spans midnight; an IANA time zone, daylight saving time applies).",
        ),
        key(
            "retry.<type>.backoff",
            "",
            "",
            "exponential".into(),
            "How long a worker running this command type waits after a failed attempt, instead of the command's own policy (the `http` kind's `backoff_base` and `backoff_cap` included): `exponential` (`base × 2^(n−1)`), `fixed` (`base` every time) or `linear` (`base + step × (n−1)`); capped at `cap`, then jittered. A `[retry.\"TYPE\"]` table needs none of its keys: the others keep their defaults.",
        ),
        key(
            "retry.<type>.base",
            "",
            "",
            secs(tenax::RetryPolicy::BASE_DEFAULT),
            "The delay after the first failed attempt.",
        ),
        key(
            "retry.<type>.cap",
            "",
            "",
            secs(tenax::RetryPolicy::CAP_DEFAULT),
            "The longest delay (not with `fixed`); at least `base`.",
        ),
        key(
            "retry.<type>.step",
            "",
            "",
            "none (required with `linear`)".into(),
            "Added to the delay per failed attempt after the first (only with `linear`).",
        ),
        key(
            "retry.<type>.jitter",
            "",
            "",
            "full (none with `fixed`)".into(),
            "`full` (uniform in 0 to the delay), `equal` (uniform in half the delay to the delay) or `none`: spreads the retries of tasks that failed together.",
        ),
        key(
            "retry.<type>.max_retry_after",
            "",
            "",
            secs(tenax::RetryPolicy::MAX_RETRY_AFTER_DEFAULT),
            "The longest delay a handler's \"retry after\" (an `http` target's `Retry-After`) may ask for.",
        ),
        key(
            "retry.<type>.max_attempts",
            "",
            "",
            tenax::CommandDefaults::STANDARD.max_attempts.to_string(),
            "Attempt budget (1 to 1000) of a task of this type enqueued without one: through the HTTP API, `tenax enqueue`, and schedules added by either. A task keeps the budget it was enqueued with; Rust enqueues take the command's `MAX_ATTEMPTS`.",
        ),
    ]
}
