//! The configuration parser: arbitrary text read as `tenax.toml` by the command line's
//! own parser and validated as `tenax config check` validates it (every table: the
//! worker, the server, the kinds, the event relays), then by the library's types alone
//! (`[server]` tokens and queue limits, `[http]`, `[exec]`, `[callbacks]`, `[alerts]`),
//! each validated and, where valid, built. Refusing is fine; a panic is a finding.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    server: Option<Server>,
    http: Option<tenax_kinds::HttpConfig>,
    exec: Option<tenax_kinds::ExecConfig>,
    callbacks: Option<tenax_delivery::CallbacksConfig>,
    alerts: Option<tenax_delivery::AlertsConfig>,
}

#[derive(Deserialize)]
struct Server {
    #[serde(default)]
    tokens: Vec<tenax_server::TokenConfig>,
    #[serde(default)]
    queues: BTreeMap<String, tenax_server::QueueLimit>,
    #[serde(default)]
    secrets: BTreeMap<String, Vec<String>>,
    command_types: Option<Vec<String>>,
    listen: Option<std::net::SocketAddr>,
    body_limit: Option<usize>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = tenax_cli::check_config(text);
    let Ok(file) = toml::from_str::<File>(text) else {
        return;
    };
    if let Some(server) = file.server {
        let mut config = tenax_server::ServerConfig {
            tokens: server.tokens,
            queues: server.queues,
            // A path the parser refuses leaves the secrets empty; the rest is checked.
            secrets: tenax::Secrets::new(server.secrets).unwrap_or_default(),
            ..tenax_server::ServerConfig::default()
        };
        if let Some(types) = server.command_types {
            config.command_types = types.into_iter().collect();
        }
        if let Some(listen) = server.listen {
            config.listen = listen;
        }
        if let Some(limit) = server.body_limit {
            config.body_limit = limit;
        }
        let _ = config.validate();
    }
    if let Some(http) = file.http {
        if http.validate().is_ok() {
            let _ = tenax_kinds::http::HttpKind::new(http);
        }
    }
    if let Some(exec) = file.exec {
        if exec.validate().is_ok() {
            let _ = tenax_kinds::exec::ExecKind::new(exec);
        }
    }
    if let Some(callbacks) = file.callbacks {
        let _ = callbacks.validate();
    }
    if let Some(alerts) = file.alerts {
        let _ = alerts.validate();
    }
});
