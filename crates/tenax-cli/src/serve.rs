//! `tenax serve`: the HTTP API, and unless `--no-workers` a worker in the same process;
//! `tenax token new`: a fresh API token and the configuration lines with its hash.
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use rand::Rng;
use tenax_server::{AppState, Role, ServerConfig};

use crate::config::{FileConfig, Key, ServerFile};
use crate::kinds::Kinds;
use crate::parse_duration;
use crate::worker::{self, WorkerArgs, KNOWN};

#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the bound address is printed as
    /// `listening on http://ADDR`) [default: 127.0.0.1:8080].
    #[arg(long, env = "TENAX_SERVER_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Largest request body in bytes [default: 1048576].
    #[arg(long, env = "TENAX_SERVER_BODY_LIMIT", value_name = "BYTES")]
    body_limit: Option<usize>,
    /// Command types the API accepts (repeat, or separate with commas) [default: the
    /// built-in ones: BANK_OPEN_ACCOUNT, NOOP, echo].
    #[arg(
        long = "command-type",
        env = "TENAX_SERVER_COMMAND_TYPES",
        value_delimiter = ',',
        value_name = "TYPE"
    )]
    command_types: Vec<String>,
    /// Longest a `wait` long-poll holds a request [default: 60s].
    #[arg(long, env = "TENAX_SERVER_WAIT_MAX", value_parser = parse_duration)]
    wait_max: Option<Duration>,
    /// Longest a request waits for the database (a pooled connection, then the call)
    /// before answering 503 with Retry-After [default: 5s].
    #[arg(long, env = "TENAX_SERVER_DB_TIMEOUT", value_parser = parse_duration)]
    db_timeout: Option<Duration>,
    /// Serve only the API; run workers elsewhere with `tenax worker`.
    #[arg(long, env = "TENAX_SERVER_NO_WORKERS")]
    no_workers: bool,
    #[command(flatten)]
    pub(crate) worker: WorkerArgs,
}

impl ServeArgs {
    /// The server settings: flags (or their environment variables), else the file, else
    /// the defaults; validated. Returns the warnings to show.
    pub(crate) fn server_config(
        &self,
        file: &ServerFile,
        kinds: &Kinds,
    ) -> anyhow::Result<(ServerConfig, Vec<String>)> {
        let d = ServerConfig::default();
        let command_types = if !self.command_types.is_empty() {
            self.command_types.clone()
        } else {
            file.command_types.clone().unwrap_or_else(|| {
                KNOWN
                    .iter()
                    .chain(kinds.command_types().iter())
                    .map(|s| (*s).to_owned())
                    .collect()
            })
        };
        let config = ServerConfig {
            listen: self.listen.or(file.listen).unwrap_or(d.listen),
            body_limit: self.body_limit.or(file.body_limit).unwrap_or(d.body_limit),
            command_types: command_types
                .into_iter()
                .map(|t| t.trim().to_owned())
                .collect(),
            tokens: file.tokens.clone(),
            queues: file.queues.clone(),
            secrets: kinds.secrets.clone(),
            wait_max: self.wait_max.or(file.wait_max).unwrap_or(d.wait_max),
            db_timeout: self.db_timeout.or(file.db_timeout).unwrap_or(d.db_timeout),
            batch_max: file.batch_max.unwrap_or(d.batch_max),
            callback_allow_hosts: kinds.callbacks.allow_hosts.clone(),
            http_targets: kinds.http.targets.keys().cloned().collect(),
            exec_programs: kinds.exec.allow.keys().cloned().collect(),
            max_attempts: kinds
                .retry
                .iter()
                .filter_map(|(t, r)| Some((t.clone(), r.max_attempts?)))
                .collect(),
        };
        let warnings = config.validate()?;
        Ok((config, warnings))
    }
}

/// Run the API (and a worker) until Ctrl-C or SIGTERM, then stop both gracefully. On
/// SIGHUP, the tokens are read again from the configuration file at `file_path`.
pub(crate) async fn run(
    database_url: &str,
    file: &FileConfig,
    file_path: Option<&std::path::Path>,
    args: ServeArgs,
) -> anyhow::Result<()> {
    let kinds = Kinds::from_file(file)?;
    let (config, warnings) = args.server_config(&file.server, &kinds)?;
    // Check the worker settings before binding, so a bad file fails fast.
    args.worker.config(&file.worker)?;
    let metrics_tokens = worker::metrics_tokens(file)?;
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let storage = tenax::storage::connect(database_url).await?;
    let shutdown = worker::shutdown_on_signal();
    // Listened for before the address is printed: a SIGHUP that comes before the
    // handler would end the process.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot listen for SIGHUP")?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    tracing::info!(%addr, workers = !args.no_workers, "serving the HTTP API");
    let state = AppState::with_shutdown(storage.clone(), config, shutdown.clone());
    tokio::spawn(reload_tokens_on_hangup(
        hangups,
        state.clone(),
        file_path.map(ToOwned::to_owned),
        shutdown.clone(),
    ));
    let mut api = tokio::spawn(tenax_server::serve(listener, state, shutdown.clone()));
    if args.no_workers {
        // The stream needs positions given somewhere: this node takes part in that.
        let sequencer = tokio::spawn(
            kinds
                .deliveries_of_events()?
                .run_until(storage.clone(), shutdown.clone()),
        );
        let served = api.await;
        shutdown.cancel();
        let _ = sequencer.await;
        return Ok(served??);
    }
    let worker_file = file.worker.clone();
    let worker_shutdown = shutdown.clone();
    let mut worker = tokio::spawn(async move {
        worker::run_on(
            storage,
            &worker_file,
            metrics_tokens,
            &kinds,
            args.worker,
            worker_shutdown,
        )
        .await
    });
    // Whichever stops first (a signal stops both) stops the other.
    let (api_result, worker_result) = tokio::select! {
        api_result = &mut api => {
            shutdown.cancel();
            (api_result, worker.await)
        }
        worker_result = &mut worker => {
            shutdown.cancel();
            (api.await, worker_result)
        }
    };
    worker_result??;
    api_result??;
    Ok(())
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Print a fresh random API token and the `[[server.tokens]]` lines with its SHA-256
    /// for tenax.toml (the server stores only the hash).
    New {
        /// Who will use it; recorded as the actor of its operator actions.
        #[arg(long)]
        name: String,
        /// admin, enqueue or read.
        #[arg(long)]
        role: Role,
    },
}

/// A fresh token: `tnx_` and 64 hex digits (256 random bits).
fn fresh_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("tnx_{hex}")
}

/// The configuration lines of a token.
fn token_lines(name: &str, role: Role, token: &str) -> String {
    format!(
        "[[server.tokens]]\nname = {name:?}\nrole = \"{}\"\nsha256 = \"{}\"\n",
        role.as_str(),
        tenax_server::hash_token(token)
    )
}

pub(crate) fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::New { name, role } => {
            if name.trim().is_empty() || name.len() > 100 {
                anyhow::bail!("--name must be 1 to 100 characters");
            }
            let token = fresh_token();
            println!("token: {token}");
            println!("# Give the token to its user; it is shown only now. Add to tenax.toml:");
            print!("{}", token_lines(&name, role, &token));
            Ok(())
        }
    }
}

/// The `[server]` keys, for the configuration reference.
pub(crate) fn reference() -> Vec<Key> {
    let d = ServerConfig::default();
    let key = |key, env, flag, default: String, doc| Key {
        key,
        env,
        flag,
        default,
        doc,
    };
    let secs = |d: Duration| humantime::format_duration(d).to_string();
    vec![
        key("server.listen", "TENAX_SERVER_LISTEN", "--listen", d.listen.to_string(),
            "Address `tenax serve` listens on (port 0: any free port). Without tokens only a loopback address is allowed."),
        key("server.body_limit", "TENAX_SERVER_BODY_LIMIT", "--body-limit", d.body_limit.to_string(),
            "Largest request body in bytes, refused from its Content-Length before it is read (413)."),
        key("server.command_types", "TENAX_SERVER_COMMAND_TYPES (comma-separated)", "--command-type",
            KNOWN.join(", "), "Command types the API accepts; any other is refused at enqueue (422). A type without a handler in this process waits for a worker that has one."),
        key("server.tokens", "", "", "none".into(),
            "`[[server.tokens]]` tables: `name` (the audit actor), `role` (`admin`, `enqueue` or `read`), `sha256` (hex of the token, from `tenax token new`). Several per role for rotation."),
        key("server.queues.<name>.max_pending", "", "", "none".into(),
            "Enqueues into the queue answer 429 with Retry-After while it has this many waiting tasks (counted about once a second)."),
        key("server.secrets.<type>", "", "", "none".into(),
            "The earlier place of `secrets.<type>`, still read and merged into it."),
        key("server.wait_max", "TENAX_SERVER_WAIT_MAX", "--wait-max", secs(d.wait_max),
            "Longest a `GET /v1/tasks/{id}/wait` long-poll holds a request."),
        key("server.db_timeout", "TENAX_SERVER_DB_TIMEOUT", "--db-timeout", secs(d.db_timeout),
            "Longest a request waits for the database (a pooled connection, then the call) before 503 with Retry-After."),
        key("server.batch_max", "", "", d.batch_max.to_string(),
            "Most tasks in one `POST /v1/tasks/batch` (inserted in one transaction) and in one `POST /v1/workflows`: 1 to 10000. A full batch must also fit in `server.body_limit`."),
    ]
}

/// On each SIGHUP, read `[[server.tokens]]` from the configuration file again and
/// accept exactly those from the next request on. A file that cannot be read or
/// parsed, or tokens that do not pass the checks, change nothing: the error is logged
/// and the tokens in force stay.
async fn reload_tokens_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    state: AppState,
    path: Option<std::path::PathBuf>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            received = hangups.recv() => if received.is_none() { return },
        }
        let Some(path) = &path else {
            tracing::warn!("SIGHUP: no configuration file to read tokens from; nothing changed");
            continue;
        };
        let reloaded = crate::config::load(Some(path)).and_then(|(file, _)| {
            state
                .reload_tokens(&file.server.tokens)
                .map_err(anyhow::Error::from)
        });
        match reloaded {
            Ok(n) => tracing::info!(tokens = n, file = %path.display(), "SIGHUP: tokens reloaded"),
            Err(e) => tracing::error!(
                error = format!("{e:#}"),
                file = %path.display(),
                "SIGHUP: tokens not reloaded; the previous ones stay in force"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::parse;
    use crate::{Cli, Commands};

    fn args(argv: &[&str]) -> ServeArgs {
        match Cli::try_parse_from(argv).unwrap().command {
            Commands::Serve(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn server_settings_come_from_flags_then_the_file_then_defaults() {
        let file = parse(
            "[server]\nlisten = \"127.0.0.1:9000\"\ncommand_types = [\"echo\", \"BILLING\"]\nwait_max = \"20s\"\n\
             [[server.tokens]]\nname = \"ci\"\nrole = \"enqueue\"\nsha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\n\
             [server.queues.reports]\nmax_pending = 100\n[server.secrets]\nBILLING = [\"card.number\"]\n",
        )
        .unwrap();
        let (config, warnings) = args(&["tenax", "serve"])
            .server_config(&file.server, &Kinds::default())
            .unwrap();
        assert!(warnings.is_empty());
        assert_eq!(config.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(config.wait_max, Duration::from_secs(20));
        assert!(config.command_types.contains("BILLING"));
        assert_eq!(config.queues["reports"].max_pending, Some(100));
        assert_eq!(config.tokens[0].role, Role::Enqueue);
        let (config, _) = args(&[
            "tenax",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--command-type",
            "a,b",
        ])
        .server_config(&file.server, &Kinds::default())
        .unwrap();
        assert_eq!(config.listen.port(), 0);
        assert_eq!(config.command_types.len(), 2);
        let (config, warnings) = args(&["tenax", "serve"])
            .server_config(&ServerFile::default(), &Kinds::default())
            .unwrap();
        assert_eq!(config.body_limit, 1024 * 1024);
        assert!(config.command_types.contains("echo"));
        assert!(warnings[0].contains("without authentication"));
    }

    #[test]
    fn bad_server_settings_are_refused_with_the_key_named() {
        let err =
            parse("[server]\ntokens = [{ name = \"x\", role = \"root\", sha256 = \"00\" }]\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("root"), "{err}");
        let err = parse("[server]\nlisten = \"everywhere\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen"), "{err}");
        let open = args(&["tenax", "serve", "--listen", "0.0.0.0:8080"])
            .server_config(&ServerFile::default(), &Kinds::default())
            .unwrap_err()
            .to_string();
        assert!(
            open.contains("server.tokens") && open.contains("loopback"),
            "{open}"
        );
        let file = parse("[server]\n[server.queues.q]\nmax_pending = 0\n").unwrap();
        let err = args(&["tenax", "serve"])
            .server_config(&file.server, &Kinds::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.queues.q.max_pending"), "{err}");
    }

    #[test]
    fn a_new_token_verifies_against_the_printed_hash() {
        let token = fresh_token();
        assert_eq!(token.len(), 4 + 64);
        assert_ne!(token, fresh_token());
        let lines = token_lines("ci", Role::Admin, &token);
        let file = parse(&lines).unwrap();
        let entry = &file.server.tokens[0];
        assert_eq!(entry.sha256, tenax_server::hash_token(&token));
        assert_eq!(entry.role, Role::Admin);
        assert_eq!(entry.name, "ci");
    }
}
