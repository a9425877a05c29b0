//! `http` task paths: arbitrary text appended to a base URL (the first byte picks
//! which). Whatever the shared check (`check_task_path`, run at enqueue and before
//! sending) accepts must, as the URL library itself resolves it, stay on the base's
//! origin and at or under its path; and `resolve_url` must accept exactly what the
//! check accepts, giving that URL.
#![no_main]
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tenax_kinds::config::HttpTarget;

const BASES: &[&str] = &[
    "http://127.0.0.1:9/api",
    "https://h.example/a/b/",
    "http://h.example",
    "http://[::1]:8080/v1/x%20y",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(rest) else {
        return;
    };
    let base = BASES[usize::from(pick) % BASES.len()];
    let target = HttpTarget {
        base_url: base.to_owned(),
        method: "POST".to_owned(),
        headers: Default::default(),
        timeout: Duration::from_secs(1),
        compensate: None,
    };
    let resolved = tenax_kinds::http::resolve_url(&target, Some(path)).map(String::from);
    if tenax_core::outbound::check_task_path(path).is_err() {
        assert!(
            resolved.is_err(),
            "{path:?} refused by the check but resolved"
        );
        return;
    }
    // The oracle: the URL library's own reading of the base followed by the path.
    let joined = format!("{}{path}", base.trim_end_matches('/'));
    let url = url::Url::parse(&joined)
        .unwrap_or_else(|e| panic!("{path:?} accepted, but {joined:?} is no URL: {e}"));
    let base_url = url::Url::parse(base).expect("the base parses");
    assert_eq!(
        url.origin(),
        base_url.origin(),
        "{path:?} left the origin: {url}"
    );
    let prefix = base_url.path().trim_end_matches('/');
    let under = url
        .path()
        .strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    assert!(under, "{path:?} left the base path: {url}");
    assert_eq!(resolved, Ok(url.to_string()), "{path:?}");
});
