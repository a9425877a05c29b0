//! The callback-signature verifier, as a receiver runs it on what arrives: an
//! arbitrary timestamp, header and body. It must never panic, must refuse every header
//! it did not produce, and must accept the one it did within the window.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenax_delivery::sign::{signature, verify};

const SECRET: &[u8] = b"fuzz-callback-secret";
const NOW: i64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let (head, rest) = data.split_at(16);
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&head[..8]);
    let timestamp = i64::from_le_bytes(ts);
    let mut tol = [0u8; 8];
    tol.copy_from_slice(&head[8..16]);
    let tolerance = i64::from_le_bytes(tol);
    let split = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let (header, body) = rest.split_at(split);
    let header = String::from_utf8_lossy(header);
    let genuine = signature(SECRET, timestamp, body);
    let accepted = verify(SECRET, timestamp, body, &header, NOW, tolerance);
    if accepted {
        assert!(
            header
                .split(',')
                .any(|part| part.trim().to_ascii_lowercase() == genuine),
            "a header without the genuine signature was accepted: {header:?}"
        );
    }
    // Its own signature verifies exactly when the timestamp is within the window.
    let within = u128::try_from(tolerance)
        .is_ok_and(|tolerance| i128::from(NOW).abs_diff(i128::from(timestamp)) <= tolerance);
    assert_eq!(
        verify(SECRET, timestamp, body, &genuine, NOW, tolerance),
        within,
        "timestamp {timestamp}, tolerance {tolerance}"
    );
});
