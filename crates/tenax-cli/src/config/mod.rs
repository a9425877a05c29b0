//! Configuration: a `tenax.toml` file, then environment variables, then flags, each
//! overriding the one before, validated at start with messages that name the key.
//!
//! The file is the one `--config` (or `TENAX_CONFIG`) names, else `tenax.toml` in the
//! current folder when there is one. Unknown keys are errors, so a misspelt key is
//! reported instead of silently ignored.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use chrono::NaiveTime;
use serde::{Deserialize, Deserializer};
use tenax::{BackgroundQueue, OffPeak, Tz, WorkerConfig};

mod reference;
mod retry;

pub(crate) use reference::reference;
pub(crate) use retry::{max_attempts_of, retry_policies, CommandRetry, RetryFile};

/// The file looked for when no `--config` is given.
pub(crate) const DEFAULT_FILE: &str = "tenax.toml";
/// The database used when neither file, environment nor flag names one.
pub(crate) const DATABASE_URL_DEFAULT: &str = "sqlite://tenax.db";

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    text.map(|t| {
        humantime::parse_duration(&t).map_err(|e| {
            serde::de::Error::custom(format!(
                "{t:?} is not a duration ({e}; examples: 250ms, 30s, 5m)"
            ))
        })
    })
    .transpose()
}

/// The contents of `tenax.toml`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    /// `database_url`.
    pub(crate) database_url: Option<String>,
    /// `log_format`.
    pub(crate) log_format: Option<crate::observe::LogFormat>,
    /// `[worker]`.
    #[serde(default)]
    pub(crate) worker: WorkerFile,
    /// `[server]`.
    #[serde(default)]
    pub(crate) server: ServerFile,
    /// `[http]`: targets of the `http` kind.
    pub(crate) http: Option<tenax_kinds::HttpConfig>,
    /// `[exec]`: the `exec` kind's allow-list.
    pub(crate) exec: Option<tenax_kinds::ExecConfig>,
    /// `[callbacks]`: completion callbacks.
    pub(crate) callbacks: Option<tenax_delivery::CallbacksConfig>,
    /// `[alerts]`: the alert webhook.
    pub(crate) alerts: Option<tenax_delivery::AlertsConfig>,
    /// `[events]`: the task-event sequencer and retention.
    pub(crate) events: Option<tenax_delivery::events::EventsConfig>,
    /// `[secrets]`: secret payload fields per command type.
    #[serde(default)]
    pub(crate) secrets: std::collections::BTreeMap<String, Vec<String>>,
    /// `[retry."TYPE"]`: the retry policy and attempt budget of a command type.
    #[serde(default)]
    pub(crate) retry: std::collections::BTreeMap<String, RetryFile>,
}

impl FileConfig {
    /// The secret payload fields: `[secrets]`, and `[server.secrets]` (their earlier
    /// place, still read) merged into it.
    pub(crate) fn secrets(&self) -> anyhow::Result<tenax::Secrets> {
        let all = self.secrets.iter().chain(&self.server.secrets);
        tenax::Secrets::new(all.map(|(t, fields)| (t.clone(), fields.clone())))
            .map_err(|e| anyhow::anyhow!("secrets.{}", e.reason))
    }
}

/// The `[server]` table (`tenax serve`).
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerFile {
    pub(crate) listen: Option<std::net::SocketAddr>,
    pub(crate) body_limit: Option<usize>,
    pub(crate) command_types: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) tokens: Vec<tenax_server::TokenConfig>,
    #[serde(default)]
    pub(crate) queues: std::collections::BTreeMap<String, tenax_server::QueueLimit>,
    #[serde(default)]
    pub(crate) secrets: std::collections::BTreeMap<String, Vec<String>>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) wait_max: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) db_timeout: Option<Duration>,
    pub(crate) batch_max: Option<usize>,
}

/// The `[worker]` table.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerFile {
    pub(crate) queues: Option<Vec<String>>,
    pub(crate) concurrency: Option<u32>,
    pub(crate) claim_batch: Option<u32>,
    pub(crate) prefetch: Option<u32>,
    pub(crate) complete_batch: Option<u32>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) batch_linger: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) poll_interval: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) lease_ttl: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) heartbeat_interval: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) fence_margin: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) shutdown_grace: Option<Duration>,
    pub(crate) reaper: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) reaper_interval: Option<Duration>,
    pub(crate) pruner: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) pruner_interval: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) retention: Option<Duration>,
    pub(crate) prune_batch: Option<u32>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) audit_retention: Option<Duration>,
    pub(crate) scheduler: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) scheduler_interval: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) missed_tick_grace: Option<Duration>,
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    pub(crate) metrics_require_token: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) metrics_sample_interval: Option<Duration>,
    /// `[[worker.background]]`: queues of `queues` claimed only in quiet periods.
    #[serde(default)]
    pub(crate) background: Vec<BackgroundFile>,
}

/// One `[[worker.background]]` table; its values are checked by [`worker_config`] so
/// that each error names its key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackgroundFile {
    pub(crate) queue: String,
    pub(crate) threshold: u64,
    pub(crate) max_deferral: String,
    pub(crate) off_peak: Option<OffPeakFile>,
}

/// The `off_peak` table of a background queue.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OffPeakFile {
    pub(crate) start: String,
    pub(crate) end: String,
    pub(crate) time_zone: String,
}

/// One documented key, for the generated configuration reference.
pub(crate) struct Key {
    pub(crate) key: &'static str,
    pub(crate) env: &'static str,
    pub(crate) flag: &'static str,
    pub(crate) default: String,
    pub(crate) doc: &'static str,
}

fn secs(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A whole number of days as `Ndays` (humantime would say `2months 29days …`).
fn days(d: Duration) -> String {
    match d.as_secs() {
        s if s % 86_400 == 0 => format!("{}days", s / 86_400),
        _ => secs(d),
    }
}

/// Load the file `explicit` names, else `tenax.toml` here if present, else nothing.
pub(crate) fn load(explicit: Option<&Path>) -> anyhow::Result<(FileConfig, Option<PathBuf>)> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None if Path::new(DEFAULT_FILE).exists() => PathBuf::from(DEFAULT_FILE),
        None => return Ok((FileConfig::default(), None)),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
    let config =
        parse(&text).with_context(|| format!("invalid configuration file {}", path.display()))?;
    Ok((config, Some(path)))
}

/// Parse the text of a configuration file.
pub(crate) fn parse(text: &str) -> anyhow::Result<FileConfig> {
    Ok(toml::from_str(text)?)
}

/// The worker settings, from flags or environment (`args`), else the file, else the
/// defaults; then validated.
pub(crate) fn worker_config(
    file: &WorkerFile,
    queues: Option<Vec<String>>,
    concurrency: Option<u32>,
    lease_ttl: Option<Duration>,
    poll_interval: Option<Duration>,
    shutdown_grace: Option<Duration>,
    retention: Option<Duration>,
) -> anyhow::Result<WorkerConfig> {
    let d = WorkerConfig::default();
    let lease_ttl = lease_ttl.or(file.lease_ttl).unwrap_or(d.lease_ttl);
    let concurrency = concurrency.or(file.concurrency).unwrap_or(d.concurrency);
    let config = WorkerConfig {
        queues: queues.or_else(|| file.queues.clone()).unwrap_or(d.queues),
        concurrency,
        claim_batch: file.claim_batch.unwrap_or(d.claim_batch),
        prefetch: file.prefetch.or(d.prefetch),
        complete_batch: file.complete_batch.unwrap_or(d.complete_batch),
        batch_linger: file.batch_linger.unwrap_or(d.batch_linger),
        poll_interval: poll_interval
            .or(file.poll_interval)
            .unwrap_or(d.poll_interval),
        lease_ttl,
        heartbeat_interval: file.heartbeat_interval.unwrap_or(lease_ttl / 3),
        fence_margin: file.fence_margin.unwrap_or(lease_ttl / 6),
        shutdown_grace: shutdown_grace
            .or(file.shutdown_grace)
            .unwrap_or(d.shutdown_grace),
        reaper: file.reaper.unwrap_or(d.reaper),
        reaper_interval: file.reaper_interval.unwrap_or(lease_ttl / 6),
        pruner: file.pruner.unwrap_or(d.pruner),
        pruner_interval: file.pruner_interval.unwrap_or(d.pruner_interval),
        retention: retention.or(file.retention).unwrap_or(d.retention),
        prune_batch: file.prune_batch.unwrap_or(d.prune_batch),
        audit_retention: file.audit_retention.unwrap_or(d.audit_retention),
        background: Vec::new(),
        scheduler: file.scheduler.unwrap_or(d.scheduler),
        scheduler_interval: file.scheduler_interval.unwrap_or(d.scheduler_interval),
        missed_tick_grace: file.missed_tick_grace.unwrap_or(d.missed_tick_grace),
        // Read from the top-level `[secrets]` (`FileConfig::secrets`).
        secrets: d.secrets,
    };
    let config = WorkerConfig {
        background: background_queues(&file.background, &config.queues)?,
        ..config
    };
    config.validate()?;
    Ok(config)
}

/// The `[[worker.background]]` tables as [`BackgroundQueue`]s, each checked against
/// the worker's resolved `queues`; an error names the key.
fn background_queues(
    tables: &[BackgroundFile],
    queues: &[String],
) -> anyhow::Result<Vec<BackgroundQueue>> {
    let mut resolved: Vec<BackgroundQueue> = Vec::with_capacity(tables.len());
    for (i, table) in tables.iter().enumerate() {
        let key = format!("worker.background[{i}]");
        let queue = &table.queue;
        if !queues.contains(queue) {
            anyhow::bail!(
                "{key}.queue: {queue:?} is not one of the worker's queues {queues:?} (worker.queues)"
            );
        }
        if resolved.iter().any(|b| &b.queue == queue) {
            anyhow::bail!("{key}.queue: background queue {queue:?} is listed twice");
        }
        let max_deferral = humantime::parse_duration(&table.max_deferral).map_err(|e| {
            anyhow::anyhow!(
                "{key}.max_deferral: {:?} is not a duration ({e}; examples: 30m, 6h)",
                table.max_deferral
            )
        })?;
        if max_deferral < Duration::from_secs(1) {
            anyhow::bail!(
                "{key}.max_deferral: {:?} is too short: background queue {queue:?} must be deferred at least 1s",
                table.max_deferral
            );
        }
        let off_peak = table
            .off_peak
            .as_ref()
            .map(|hours| off_peak(hours, &format!("{key}.off_peak"), queue))
            .transpose()?;
        resolved.push(BackgroundQueue {
            queue: queue.clone(),
            threshold: table.threshold,
            off_peak,
            max_deferral,
        });
    }
    Ok(resolved)
}

fn off_peak(hours: &OffPeakFile, key: &str, queue: &str) -> anyhow::Result<OffPeak> {
    let time = |name: &str, text: &str| {
        NaiveTime::parse_from_str(text, "%H:%M").map_err(|_| {
            anyhow::anyhow!("{key}.{name}: {text:?} is not a time of day (HH:MM, 00:00 to 23:59)")
        })
    };
    let start = time("start", &hours.start)?;
    let end = time("end", &hours.end)?;
    if start == end {
        anyhow::bail!(
            "{key}: the off-peak hours of background queue {queue:?} are empty (start = end = {:?})",
            hours.start
        );
    }
    let time_zone: Tz = hours.time_zone.parse().map_err(|_| {
        anyhow::anyhow!(
            "{key}.time_zone: {:?} is not a time zone of the IANA database (examples: UTC, Europe/Paris)",
            hours.time_zone
        )
    })?;
    Ok(OffPeak {
        start,
        end,
        time_zone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve_to_the_documented_worker_defaults() {
        let config =
            worker_config(&WorkerFile::default(), None, None, None, None, None, None).unwrap();
        assert_eq!(config, WorkerConfig::default());
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let file = parse("database_url = \"sqlite://x.db\"\n[worker]\nconcurrency = 4\nlease_ttl = \"12s\"\nqueues = [\"a\", \"b\"]\n").unwrap();
        assert_eq!(file.database_url.as_deref(), Some("sqlite://x.db"));
        let config = worker_config(&file.worker, None, Some(8), None, None, None, None).unwrap();
        assert_eq!(config.concurrency, 8, "flag wins");
        assert_eq!(
            config.lease_ttl,
            Duration::from_secs(12),
            "file wins over default"
        );
        assert_eq!(config.heartbeat_interval, Duration::from_secs(4));
        assert_eq!(config.queues, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn the_audit_retention_is_a_worker_setting() {
        let file = parse("[worker]\naudit_retention = \"30days\"\n").unwrap();
        let config = worker_config(&file.worker, None, None, None, None, None, None).unwrap();
        assert_eq!(config.audit_retention, Duration::from_secs(30 * 86_400));
        assert_eq!(
            WorkerConfig::default().audit_retention,
            Duration::from_secs(90 * 86_400)
        );
        let err = parse("[server]\naudit_retention = \"30days\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("audit_retention"), "{err}");
    }

    #[test]
    fn secrets_are_read_from_their_table_and_their_earlier_place_under_server() {
        let file = parse(
            "[secrets]\nBILLING = [\"card.number\", \"cards[].number\"]\n\
             [server.secrets]\nBILLING = [\"cvc\"]\nPAYOUT = [\"iban\"]\n",
        )
        .unwrap();
        let secrets = file.secrets().unwrap();
        let fields: Vec<(&str, Vec<&str>)> = secrets.fields().collect();
        assert_eq!(
            fields,
            vec![
                ("BILLING", vec!["card.number", "cards[].number", "cvc"]),
                ("PAYOUT", vec!["iban"]),
            ]
        );
        let bad = parse("[secrets]\nBILLING = [\"card..number\"]\n").unwrap();
        let err = bad.secrets().unwrap_err().to_string();
        assert!(
            err.starts_with("secrets.BILLING") && err.contains("card..number"),
            "{err}"
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_key_named() {
        let err = parse("[worker]\nconcurency = 4\n").unwrap_err().to_string();
        assert!(err.contains("concurency"), "{err}");
        let err = parse("[worker]\nlease_ttl = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon") && err.contains("duration"), "{err}");
        let err = parse("[worker]\nconcurrency = -1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("concurrency"), "{err}");
        let file = parse("[worker]\nlease_ttl = \"2s\"\nfence_margin = \"3s\"\n").unwrap();
        let err = worker_config(&file.worker, None, None, None, None, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("fence margin"), "{err}");
    }

    #[test]
    fn observability_keys_are_read_and_checked() {
        let file = parse("log_format = \"json\"\n[worker]\nmetrics_addr = \"127.0.0.1:9464\"\nmetrics_sample_interval = \"5s\"\n").unwrap();
        assert_eq!(file.log_format, Some(crate::observe::LogFormat::Json));
        assert_eq!(
            file.worker.metrics_addr,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(
            file.worker.metrics_sample_interval,
            Some(Duration::from_secs(5))
        );
        let err = parse("log_format = \"xml\"\n").unwrap_err().to_string();
        assert!(err.contains("log_format") || err.contains("xml"), "{err}");
        let err = parse("[worker]\nmetrics_addr = \"localhost\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics_addr"), "{err}");
    }

    const BACKGROUND: &str = "[worker]\nqueues = [\"default\", \"bulk\", \"reports\"]\n\
        [[worker.background]]\nqueue = \"bulk\"\nthreshold = 100\nmax_deferral = \"6h\"\n\
        off_peak = { start = \"22:00\", end = \"06:30\", time_zone = \"Europe/Paris\" }\n\
        [[worker.background]]\nqueue = \"reports\"\nthreshold = 0\nmax_deferral = \"90s\"\n";

    fn background_error(text: &str) -> String {
        let file = parse(text).unwrap();
        match worker_config(&file.worker, None, None, None, None, None, None) {
            Ok(config) => panic!("accepted {text:?}: {:?}", config.background),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn background_queues_resolve_to_the_worker_config() {
        let file = parse(BACKGROUND).unwrap();
        let config = worker_config(&file.worker, None, None, None, None, None, None).unwrap();
        assert_eq!(
            config.background,
            vec![
                BackgroundQueue {
                    queue: "bulk".into(),
                    threshold: 100,
                    off_peak: Some(OffPeak {
                        start: NaiveTime::from_hms_opt(22, 0, 0).unwrap(),
                        end: NaiveTime::from_hms_opt(6, 30, 0).unwrap(),
                        time_zone: Tz::Europe__Paris,
                    }),
                    max_deferral: Duration::from_secs(6 * 3600),
                },
                BackgroundQueue {
                    queue: "reports".into(),
                    threshold: 0,
                    off_peak: None,
                    max_deferral: Duration::from_secs(90),
                },
            ]
        );
        let none = worker_config(&WorkerFile::default(), None, None, None, None, None, None);
        assert_eq!(none.unwrap().background, Vec::new());
    }

    #[test]
    fn bad_background_queues_are_refused_with_the_key_named() {
        let one = |body: &str| {
            format!("[worker]\nqueues = [\"default\", \"bulk\"]\n[[worker.background]]\n{body}")
        };
        let ok = "queue = \"bulk\"\nthreshold = 10\nmax_deferral = \"1h\"\n";
        let hours = |start: &str, end: &str, zone: &str| {
            one(&format!(
                "{ok}off_peak = {{ start = \"{start}\", end = \"{end}\", time_zone = \"{zone}\" }}\n"
            ))
        };
        for (text, wanted) in [
            (
                one("queue = \"nightly\"\nthreshold = 10\nmax_deferral = \"1h\"\n"),
                ["worker.background[0].queue", "\"nightly\"", "worker.queues"],
            ),
            (
                format!("{}[[worker.background]]\n{ok}", one(ok)),
                ["worker.background[1].queue", "\"bulk\"", "twice"],
            ),
            (
                one("queue = \"bulk\"\nthreshold = 10\nmax_deferral = \"soon\"\n"),
                ["worker.background[0].max_deferral", "\"soon\"", "duration"],
            ),
            (
                one("queue = \"bulk\"\nthreshold = 10\nmax_deferral = \"500ms\"\n"),
                [
                    "worker.background[0].max_deferral",
                    "\"500ms\"",
                    "at least 1s",
                ],
            ),
            (
                hours("25:00", "06:00", "UTC"),
                ["worker.background[0].off_peak.start", "\"25:00\"", "HH:MM"],
            ),
            (
                hours("22:00", "6 am", "UTC"),
                ["worker.background[0].off_peak.end", "\"6 am\"", "HH:MM"],
            ),
            (
                hours("22:00", "22:00", "UTC"),
                ["worker.background[0].off_peak", "empty", "\"bulk\""],
            ),
            (
                hours("22:00", "06:00", "Mars/Olympus_Mons"),
                [
                    "worker.background[0].off_peak.time_zone",
                    "\"Mars/Olympus_Mons\"",
                    "time zone",
                ],
            ),
        ] {
            let err = background_error(&text);
            for part in wanted {
                assert!(err.contains(part), "{part:?} not in {err:?} for {text:?}");
            }
        }
        // Missing, misspelt and mistyped keys are refused when the file is read.
        for (text, wanted) in [
            (
                one("queue = \"bulk\"\nmax_deferral = \"1h\"\n"),
                "threshold",
            ),
            (one("queue = \"bulk\"\nthreshold = 10\n"), "max_deferral"),
            (one(&format!("{ok}treshold = 1\n")), "treshold"),
            (
                one("queue = \"bulk\"\nthreshold = -1\nmax_deferral = \"1h\"\n"),
                "threshold",
            ),
            (
                one(&format!(
                    "{ok}off_peak = {{ start = \"22:00\", end = \"06:00\" }}\n"
                )),
                "time_zone",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.contains(wanted),
                "{wanted:?} not in {err:?} for {text:?}"
            );
        }
    }

    #[test]
    fn the_example_file_in_the_repository_is_valid() {
        let text = include_str!("../../../../deploy/tenax.toml");
        let file = parse(text).unwrap();
        worker_config(&file.worker, None, None, None, None, None, None).unwrap();
        assert_eq!(file.server.tokens.len(), 1);
        assert_eq!(file.server.queues["default"].max_pending, Some(100_000));
        let kinds = crate::kinds::Kinds::from_file(&file).unwrap();
        assert_eq!(kinds.command_types(), ["http", "exec"]);
        assert!(kinds.callbacks.enabled());
        assert!(kinds.alerts.webhook_url.is_some());
    }

    #[test]
    fn the_missed_tick_grace_is_read_and_checked_against_the_scheduler_interval() {
        let worker = |text: &str| {
            let file = parse(text).unwrap();
            worker_config(&file.worker, None, None, None, None, None, None)
        };
        let config = worker("[worker]\nmissed_tick_grace = \"10m\"\n").unwrap();
        assert_eq!(config.missed_tick_grace, Duration::from_secs(600));
        assert_eq!(
            worker("").unwrap().missed_tick_grace,
            tenax::MissedTicks::GRACE
        );
        let err = worker("[worker]\nscheduler_interval = \"5s\"\nmissed_tick_grace = \"2s\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missed tick grace"), "{err}");
    }
}
