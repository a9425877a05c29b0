//! The outbound HTTP client and what every outbound request shares: the `http` kind and
//! the senders of callbacks and alerts build their clients here, read a receiver's
//! `Retry-After` and report an error with its causes the same way.
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// An HTTP client for outbound requests: no redirects followed (a redirect could lead
/// anywhere), rustls with the ring provider, the given overall timeout.
pub fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    install_tls_provider();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("tenax/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Make rustls with the ring provider the process's TLS provider, unless one is
/// installed already. reqwest is built without a provider of its own (so the build
/// needs no second crypto library), so a process must call this before any HTTP client
/// is built, including the ones other libraries build (the OTLP exporter's).
pub fn install_tls_provider() {
    // Installing twice is harmless: the first provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A `Retry-After` header as a delay: seconds, or an HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// An error and its causes, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers), None);
    }
}
