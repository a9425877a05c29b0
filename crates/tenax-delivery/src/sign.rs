//! Signing of outbound deliveries: `Tenax-Signature: v1=<hex>` where `<hex>` is
//! HMAC-SHA256 with the shared secret over `<Tenax-Timestamp>.<body>`. The timestamp
//! (Unix seconds when the attempt was sent) lets a receiver refuse replays of old
//! deliveries; the delivery id (`Tenax-Delivery-Id`) lets it ignore a delivery it
//! already processed.
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the delivery's stable id.
pub const DELIVERY_ID_HEADER: &str = "Tenax-Delivery-Id";
/// The header carrying the attempt's Unix time in seconds.
pub const TIMESTAMP_HEADER: &str = "Tenax-Timestamp";
/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Tenax-Signature";

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable_key(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cold]
fn unreachable_key() -> ! {
    // `InvalidLength` is never returned for HMAC, whatever the key length.
    #[allow(clippy::panic)]
    {
        panic!("HMAC accepts keys of any length")
    }
}

/// The `Tenax-Signature` value of a body sent at `timestamp`: `v1=<hex>`.
pub fn signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!(
        "v1={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// Whether `header` (a `Tenax-Signature` value, possibly listing several
/// comma-separated `v1=` entries during a key rotation) signs `body` sent at
/// `timestamp`, and the timestamp is within `tolerance_secs` of `now`. Compares in
/// constant time.
pub fn verify(
    secret: &[u8],
    timestamp: i64,
    body: &[u8],
    header: &str,
    now: i64,
    tolerance_secs: i64,
) -> bool {
    // `abs_diff`: a timestamp from the request may be anything, and `now - timestamp`
    // overflows for one far enough away.
    let Ok(tolerance) = u64::try_from(tolerance_secs) else {
        return false;
    };
    if now.abs_diff(timestamp) > tolerance {
        return false;
    }
    header
        .split(',')
        .filter_map(|part| part.trim().strip_prefix("v1="))
        .filter_map(|h| hex::decode(h).ok())
        .any(|expected| mac(secret, timestamp, body).verify_slice(&expected).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `callback_signature` fuzz target: a timestamp far from now made
    /// the window check overflow (a panic in a receiver fed a hostile header).
    #[test]
    fn fuzz_regression_extreme_timestamps_are_refused_without_overflow() {
        // Far apart at both ends of the range: refused, without overflowing.
        for (timestamp, now) in [
            (i64::MIN, 1_800_000_000),
            (i64::MIN + 1, 1_800_000_000),
            (-1, 1_800_000_000),
            (i64::MAX, 1_800_000_000),
            (i64::MAX, i64::MIN),
            (i64::MIN, i64::MAX),
            (0, i64::MIN),
        ] {
            let sig = signature(b"k", timestamp, b"{}");
            assert!(
                !verify(b"k", timestamp, b"{}", &sig, now, 300),
                "{timestamp} at {now}"
            );
        }
        // Close together at the ends of the range: accepted.
        for (timestamp, now) in [(i64::MIN, i64::MIN + 1), (i64::MAX, i64::MAX - 1)] {
            let sig = signature(b"k", timestamp, b"{}");
            assert!(verify(b"k", timestamp, b"{}", &sig, now, 300));
        }
        // A negative tolerance accepts nothing; the widest accepts up to 2^63 - 1 apart.
        let sig = signature(b"k", 7, b"{}");
        assert!(!verify(b"k", 7, b"{}", &sig, 7, -1));
        let sig = signature(b"k", i64::MIN + 1, b"{}");
        assert!(verify(b"k", i64::MIN + 1, b"{}", &sig, 0, i64::MAX));
    }

    #[test]
    fn a_signature_verifies_only_for_its_body_time_and_secret() {
        let sig = signature(b"0123456789abcdef", 1_700_000_000, b"{\"a\":1}");
        assert!(sig.starts_with("v1=") && sig.len() == 67, "{sig}");
        let ok = |secret: &[u8], t, body: &[u8], now| verify(secret, t, body, &sig, now, 300);
        assert!(ok(
            b"0123456789abcdef",
            1_700_000_000,
            b"{\"a\":1}",
            1_700_000_100
        ));
        assert!(!ok(
            b"0123456789abcdeX",
            1_700_000_000,
            b"{\"a\":1}",
            1_700_000_100
        ));
        assert!(!ok(
            b"0123456789abcdef",
            1_700_000_001,
            b"{\"a\":1}",
            1_700_000_100
        ));
        assert!(!ok(
            b"0123456789abcdef",
            1_700_000_000,
            b"{\"a\":2}",
            1_700_000_100
        ));
        assert!(!ok(
            b"0123456789abcdef",
            1_700_000_000,
            b"{\"a\":1}",
            1_700_000_400
        ));
        // A known vector, so other languages can check their implementation.
        assert_eq!(
            signature(b"key", 0, b""),
            format!("v1={}", {
                let mut m = Hmac::<Sha256>::new_from_slice(b"key").expect("key");
                m.update(b"0.");
                hex::encode(m.finalize().into_bytes())
            })
        );
    }
}
