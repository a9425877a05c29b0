//! Query strings and path parameters: the input, percent-encoded where a client would
//! have to, as the query of every listing route and as each path parameter.
#![no_main]
use axum::http::Method;
use libfuzzer_sys::fuzz_target;
use tenax_fuzz::Api;

/// Percent-encode what may not appear raw in a URI, keep the rest (so `&`, `=`, `%`
/// and `+` reach the query parser as the fuzzer wrote them).
fn encode(input: &[u8], keep: &[u8]) -> String {
    let mut out = String::with_capacity(input.len() * 3);
    for &b in input {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

const LISTS: &[&str] = &[
    "/v1/tasks",
    "/v1/audit",
    "/v1/workflows",
    "/v1/tasks/1/wait",
    "/ui/tasks",
    "/ui/dead",
    "/ui/audit",
];

const PATHS: &[(&str, Method)] = &[
    ("/v1/tasks/{}", Method::GET),
    ("/v1/tasks/by-no/{}", Method::GET),
    ("/v1/tasks/{}/attempts", Method::GET),
    ("/v1/workflows/{}", Method::GET),
    ("/v1/schedules/{}", Method::DELETE),
    ("/v1/queues/{}/pause", Method::POST),
    ("/ui/tasks/{}", Method::GET),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let api = Api::get();
    if pick % 2 == 0 {
        let mut query = encode(rest, b"&=%+");
        // A long-poll must not hold the fuzzer: cap any wait.
        let list = LISTS[usize::from(pick / 2) % LISTS.len()];
        if list.ends_with("/wait") {
            query = format!("timeout_ms=0&{query}");
        }
        api.check(Method::GET, &format!("{list}?{query}"), None, Vec::new());
    } else {
        let (template, method) = &PATHS[usize::from(pick / 2) % PATHS.len()];
        let param = encode(rest, b"%");
        api.check(
            method.clone(),
            &template.replace("{}", &param),
            None,
            Vec::new(),
        );
    }
});
