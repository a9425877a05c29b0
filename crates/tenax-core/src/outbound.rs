//! Where Tenax may send requests on a task's behalf: a host allow-list for URLs that
//! come from task data (completion callbacks), checked both when a task is enqueued
//! and when its callback is delivered.
use std::fmt;

/// A URL's parts that decide where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlOrigin {
    /// `http` or `https`.
    pub scheme: String,
    /// The host, lower case (an IPv6 address keeps its brackets).
    pub host: String,
    /// The port, when written.
    pub port: Option<u16>,
}

/// Why a URL is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlRefused(pub String);

impl fmt::Display for UrlRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UrlRefused {}

/// The scheme, host and port of an absolute `http` or `https` URL. A URL with user
/// information (`user@host`), an empty host, white space or control characters is
/// refused: such URLs are read differently by different parsers.
pub fn url_origin(url: &str) -> Result<UrlOrigin, UrlRefused> {
    let refuse = |why: &str| Err(UrlRefused(format!("{why}: {:?}", shorten(url))));
    if url
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
    {
        return refuse("white space, control characters or backslashes in the URL");
    }
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => return refuse("not an absolute URL"),
    };
    if scheme != "http" && scheme != "https" {
        return refuse("only http and https URLs are allowed");
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return refuse("user information in the URL");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        match v6.split_once(']') {
            Some((addr, tail)) => (format!("[{}]", addr.to_ascii_lowercase()), tail),
            None => return refuse("unclosed IPv6 address"),
        }
    } else {
        match authority.split_once(':') {
            Some((host, _)) => (host.to_ascii_lowercase(), &authority[host.len()..]),
            None => (authority.to_ascii_lowercase(), ""),
        }
    };
    let port = match port {
        "" => None,
        p => match p.strip_prefix(':').and_then(|p| p.parse::<u16>().ok()) {
            Some(port) => Some(port),
            None => return refuse("invalid port"),
        },
    };
    if host.is_empty() || host.ends_with('.') {
        return refuse("no host");
    }
    Ok(UrlOrigin { scheme, host, port })
}

fn shorten(url: &str) -> String {
    url.chars().take(200).collect()
}

/// Hosts a URL from task data may point to: exact names (`hooks.example.com`, or
/// `hooks.example.com:8443` to pin the port) or wildcards for subdomains
/// (`*.example.com`, which does not match `example.com` itself). Empty allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAllowList {
    patterns: Vec<String>,
}

impl HostAllowList {
    /// An allow-list of these patterns (compared without regard to case).
    pub fn new(patterns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            patterns: patterns
                .into_iter()
                .map(|p| p.into().trim().to_ascii_lowercase())
                .filter(|p| !p.is_empty())
                .collect(),
        }
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Accept `url` if its host (and port, for a pattern that names one) is listed.
    pub fn check(&self, url: &str) -> Result<UrlOrigin, UrlRefused> {
        let origin = url_origin(url)?;
        let with_port = origin.port.map(|port| format!("{}:{port}", origin.host));
        let allowed = self.patterns.iter().any(|pattern| {
            if let Some(suffix) = pattern.strip_prefix("*.") {
                origin.host.ends_with(&format!(".{suffix}"))
            } else {
                *pattern == origin.host || with_port.as_deref() == Some(pattern.as_str())
            }
        });
        if allowed {
            Ok(origin)
        } else {
            Err(UrlRefused(format!(
                "host {:?} is not in the allow-list",
                with_port.unwrap_or(origin.host)
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_parsed_and_tricky_urls_refused() {
        let o = url_origin("HTTPS://Hooks.Example.com:8443/a?b#c").expect("valid");
        assert_eq!(
            o,
            UrlOrigin {
                scheme: "https".into(),
                host: "hooks.example.com".into(),
                port: Some(8443)
            }
        );
        assert_eq!(url_origin("http://[::1]:80/x").expect("v6").host, "[::1]");
        for bad in [
            "ftp://example.com/",
            "example.com/x",
            "http://user@evil.com/",
            "http://good.com@evil.com/",
            "http://:80/",
            "http://exa mple.com/",
            "http://example.com:99999/",
            "http://example.com:x/",
            "http:\\\\evil.com",
            "http://evil.com./",
        ] {
            assert!(url_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_allow_list_matches_hosts_ports_and_subdomains() {
        let list = HostAllowList::new(["hooks.example.com", "*.corp.test", "127.0.0.1:9000"]);
        assert!(list.check("https://hooks.example.com/x").is_ok());
        assert!(list.check("https://HOOKS.example.com:444/x").is_ok());
        assert!(list.check("https://a.b.corp.test/").is_ok());
        assert!(list.check("https://corp.test/").is_err());
        assert!(list.check("https://evilcorp.test/").is_err());
        assert!(list.check("http://127.0.0.1:9000/cb").is_ok());
        assert!(list.check("http://127.0.0.1:9001/cb").is_err());
        assert!(list.check("http://127.0.0.1/cb").is_err());
        assert!(list.check("https://hooks.example.com.evil.com/").is_err());
        assert!(HostAllowList::default()
            .check("https://hooks.example.com/")
            .is_err());
    }
}
