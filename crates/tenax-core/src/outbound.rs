//! Where Tenax may send requests on a task's behalf: a host allow-list for URLs that
//! come from task data (completion callbacks), checked both when a task is enqueued
//! and when its callback is delivered; and the check of a path a task appends to a
//! configured base URL (the `http` kind), likewise run at enqueue and before sending.
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

/// The longest path a task may append to a base URL, in bytes.
pub const TASK_PATH_MAX_BYTES: usize = 2048;

/// Check a path a task appends to a configured base URL (the `http` kind's `path`): empty,
/// or `/...` that can only add segments under the base path.
///
/// The path is percent-decoded again and again until nothing changes (so `%252e`, a
/// double-encoded dot, is seen as a dot), and every form on the way, the raw text
/// included, must hold:
/// - no dot segment: a segment (up to any `;`, `?` or `#`) made only of dots and spaces
///   (`.`, `..`, `...`, `.%2e`, `%2E.`, `..;x`), which a URL library or a server would
///   resolve upwards;
/// - no new segment: exactly as many `/` as the raw text has (so no `%2f`), and no `\`
///   nor `%5c` (read as `/` by URL libraries and some servers);
/// - no control character, and valid UTF-8 (no overlong `%c0%ae` dot).
///
/// The raw text may also hold no white space, `//`, `@`, `#` or `://`, and is at most
/// [`TASK_PATH_MAX_BYTES`]. A query (after `?`) is checked as raw text only.
pub fn check_task_path(path: &str) -> Result<(), UrlRefused> {
    let refuse = |why: &str| {
        Err(UrlRefused(format!(
            "path {:?}: {why}",
            path.chars().take(100).collect::<String>()
        )))
    };
    if path.is_empty() {
        return Ok(());
    }
    if !path.starts_with('/') {
        return refuse("a path starts with /");
    }
    if path.len() > TASK_PATH_MAX_BYTES {
        return refuse(&format!("a path is at most {TASK_PATH_MAX_BYTES} bytes"));
    }
    if path
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '\\' | '@' | '#'))
        || path.contains("//")
        || path.contains("://")
    {
        return refuse("no white space, control characters, \\, @, #, // or scheme in a path");
    }
    let raw = path.split('?').next().unwrap_or("").as_bytes();
    let slashes = raw.iter().filter(|&&b| b == b'/').count();
    let mut form: Vec<u8> = raw.to_vec();
    loop {
        let Ok(text) = std::str::from_utf8(&form) else {
            return refuse("it decodes to text that is not UTF-8");
        };
        if text.chars().any(char::is_control) {
            return refuse("it decodes to a control character");
        }
        if text.contains('\\') || text.bytes().filter(|&b| b == b'/').count() != slashes {
            return refuse("encoded slashes or backslashes may not make new segments");
        }
        if text.split('/').any(is_dot_segment) {
            return refuse("no . or .. segment, in any encoding");
        }
        let decoded: Vec<u8> = percent_encoding::percent_decode(&form).collect();
        if decoded == form {
            return Ok(());
        }
        form = decoded;
    }
}

/// A segment that a URL library or a server may resolve as `.` or `..`: only dots and
/// spaces (Windows drops trailing ones), at least one dot, up to a `;`, `?` or `#`.
fn is_dot_segment(segment: &str) -> bool {
    let name = segment.split([';', '?', '#']).next().unwrap_or("");
    name.contains('.') && name.chars().all(|c| c == '.' || c == ' ')
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

    /// Every way of spelling a dot and a slash: plain, percent-encoded in both cases,
    /// double-encoded, and the backslash forms.
    const DOTS: &[&str] = &[".", "%2e", "%2E", "%252e", "%252E", "%25252e"];
    const SLASHES: &[&str] = &[
        "/", "%2f", "%2F", "%252f", "%252F", "\\", "%5c", "%5C", "%255c",
    ];

    /// Paths that climb out of the base path (or make new segments to), built from
    /// every spelling of dot and slash.
    fn climbing_paths() -> Vec<String> {
        let mut paths = Vec::new();
        for a in DOTS {
            for b in DOTS {
                for s in SLASHES {
                    paths.push(format!("/{a}{b}{s}x"));
                    paths.push(format!("/v{s}{a}{b}{s}{a}{b}{s}etc{s}passwd"));
                    paths.push(format!("/v/{a}{b}"));
                    paths.push(format!("/{a}{s}{b}{b}{s}x"));
                }
                paths.push(format!("/{a}{b}"));
                paths.push(format!("/{a}{b};x/y"));
                paths.push(format!("/{a}{b}?q=1"));
            }
            paths.push(format!("/{a}/x"));
            paths.push(format!("/x/{a}"));
        }
        paths
    }

    #[test]
    fn a_dot_segment_in_any_encoding_is_refused_in_a_task_path() {
        // As reported: each reached a path outside the target's base path.
        for bad in [
            "/.%2e/x",
            "/%2E./x",
            "/.%2e",
            "/.%2e/.%2e/.%2e/etc/passwd",
            "/a/.%2e",
            "/a/%2e./b",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/%252e%252e/x",
            "/%25252e%25252e/x",
            "/..;/x",
            "/.../x",
            "/%c0%ae%c0%ae/x",
            "/a%2fb",
            "/a%5cb",
            "/a%00b",
            "/.\t./x",
            "/.\n./x",
        ] {
            assert!(check_task_path(bad).is_err(), "{bad}");
        }
        let paths = climbing_paths();
        assert!(paths.len() > 1000, "{}", paths.len());
        for bad in &paths {
            assert!(check_task_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ordinary_task_paths_are_accepted() {
        for good in [
            "",
            "/",
            "/charges",
            "/charges?x=1&y=../z",
            "/v1/a.b/c..d/...e",
            "/.well-known/thing",
            "/name%20with%20spaces",
            "/caf%C3%A9",
            "/100%25",
            "/a%",
        ] {
            assert_eq!(check_task_path(good), Ok(()), "{good}");
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
