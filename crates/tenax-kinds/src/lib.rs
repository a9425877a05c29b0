//! Built-in Tenax command kinds that need no Rust code.
//!
//! - [`http::HttpKind`] (`http`): calls an endpoint declared by name in the
//!   configuration; a task names the target and carries the body, never a URL.
//! - [`exec::ExecKind`] (`exec`): runs an allow-listed program with an argument
//!   array, never through a shell.
//! - [`outbound`]: the HTTP client every outbound request of Tenax is built with (no
//!   redirects, rustls with the ring provider), shared with the senders of
//!   `tenax-delivery`.
//! - [`config`]: the `[http]` and `[exec]` tables, and the [`ConfigError`] every
//!   outbound table reports.
#![forbid(unsafe_code)]

pub mod config;
pub mod exec;
pub mod http;
pub mod outbound;

pub use config::{ConfigError, ExecConfig, HttpCompensate, HttpConfig, HttpTarget};
pub use outbound::{client, install_tls_provider};
