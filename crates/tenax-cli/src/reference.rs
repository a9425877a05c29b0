//! The command-line and configuration references, generated from the code: the clap
//! definitions and the configuration key list. `docs/reference/*.md` hold their output;
//! a test keeps them up to date (`TENAX_BLESS=1 cargo test -p tenax-cli references`
//! rewrites them).
use std::fmt::Write;

use clap::CommandFactory;

use crate::Cli;

fn command_markdown(out: &mut String, command: &clap::Command, path: &str) {
    let _ = writeln!(out, "## `{path}`\n");
    let mut command = command
        .clone()
        .term_width(100)
        .mut_args(|arg| arg.hide_env_values(true));
    let help = command.render_long_help().to_string();
    let _ = writeln!(out, "```text\n{}\n```\n", help.trim_end());
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_markdown(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

/// Every command and flag, as `--help` shows them.
pub(crate) fn cli_markdown() -> String {
    let mut out = String::from(
        "# Command-line reference\n\nGenerated from the code by `tenax reference cli`; do not edit.\n\n",
    );
    let mut root = Cli::command();
    root.build();
    command_markdown(&mut out, &root, "tenax");
    out
}

/// Every key of `tenax.toml`, with its environment variable, flag and default.
pub(crate) fn config_markdown() -> String {
    let mut out = String::from(
        "# Configuration reference\n\nGenerated from the code by `tenax reference config`; do not edit.\n\n\
         Settings come from `tenax.toml` (the file `--config` or `TENAX_CONFIG` names, else \
         `tenax.toml` in the current folder when present), then environment variables, then \
         flags, each overriding the one before. Unknown keys are errors. Durations are written \
         like `250ms`, `30s`, `5m`, `7days`. Check a configuration with `tenax config check`.\n\n\
         | key | environment | flag | default | meaning |\n|---|---|---|---|---|\n",
    );
    for key in crate::config::reference() {
        let cell = |s: &str| {
            if s.is_empty() {
                "—".to_owned()
            } else {
                format!("`{s}`")
            }
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | `{}` | {} |",
            key.key,
            cell(key.env),
            cell(key.flag),
            key.default,
            key.doc
        );
    }
    out
}

/// Every metric, from the runtime's catalogue.
pub(crate) fn metrics_markdown() -> String {
    format!(
        "# Metrics reference\n\nGenerated from the code by `tenax reference metrics`; do not edit.\n\n\
         `tenax worker --metrics-addr 127.0.0.1:9464` (or `worker.metrics_addr` in `tenax.toml`, \
         or `TENAX_WORKER_METRICS_ADDR`) serves these in the Prometheus text format. A library \
         user installs a recorder (for example `tenax::metrics::prometheus_builder()`, feature \
         `prometheus`), wraps the storage with `tenax::metrics::instrument` and runs \
         `tenax::metrics::sampler_loop`.\n\n\
         - **source `sampler`**: read from the database every `metrics_sample_interval` \
         (default 10 s) by every node that serves metrics. The values are the whole \
         cluster's, identical on every node: aggregate them with `max by (...)`, never `sum`.\n\
         - **source `worker`** and **`storage`**: this process only; aggregate with `sum`.\n\
         - **source `delivery`**: the callback and alert senders of this process (only where \
         `[callbacks]` or `[alerts]` is configured); aggregate with `sum`.\n\
         - Histograms in seconds have buckets {seconds:?}; the claim batch histogram has \
         buckets {batch:?}.\n\n{table}",
        seconds = tenax::metrics::SECONDS_BUCKETS,
        batch = tenax::metrics::BATCH_BUCKETS,
        table = tenax::metrics::reference_markdown(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, generated: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/reference")
            .join(name);
        if std::env::var("TENAX_BLESS").as_deref() == Ok("1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/reference/{name} is out of date: run `TENAX_BLESS=1 cargo test -p tenax-cli references`"
        );
    }

    #[test]
    fn references_are_up_to_date() {
        check("cli.md", &cli_markdown());
        check("configuration.md", &config_markdown());
        check("metrics.md", &metrics_markdown());
    }
}
