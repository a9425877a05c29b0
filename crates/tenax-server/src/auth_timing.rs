//! Long tier (reliability S2): a dudect-style check that comparing tokens takes no
//! longer when more of the bytes match.
//!
//! Two classes of input, drawn at random and interleaved: a stored hash that differs
//! from the presented one in its first byte, and one that differs only in its last
//! byte. A comparison that stops at the first difference is faster for the first class.
//! Each of 10^6 measurements times a few calls with `std::time::Instant`; the
//! measurements above a percentile are dropped (several percentiles, as dudect does, to
//! see past interrupts and scheduling), and Welch's t between the two classes must stay
//! under 4.5 in absolute value for every crop.
//!
//! Run with:
//!
//! ```sh
//! cargo test -p tenax-server --release --lib auth::timing -- --ignored --nocapture --test-threads 1
//! ```
//!
//! The control, `early_exit_comparison_is_caught`, runs the same measurement on a
//! comparison that returns at the first differing byte; its |t| must be well above 4.5,
//! which shows the method can see a leak of this size.
use std::hint::black_box;
use std::time::Instant;

use sha2::Digest;
use subtle::ConstantTimeEq;

use super::Tokens;
use crate::auth::Role;

/// Measurements per test.
const MEASUREMENTS: usize = 1_000_000;
/// Calls timed together in one measurement (above the clock's resolution).
const CALLS: usize = 8;
/// The bound dudect uses: above it, the classes are told apart.
const T_MAX: f64 = 4.5;

/// xorshift64*: the class sequence only needs to be unpredictable to the code measured.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64);
        Self(nanos | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_le_bytes());
        }
        out
    }
}

/// Welford's running mean and variance.
#[derive(Default, Clone, Copy)]
struct Moments {
    n: f64,
    mean: f64,
    m2: f64,
}

impl Moments {
    fn push(&mut self, x: f64) {
        self.n += 1.0;
        let delta = x - self.mean;
        self.mean += delta / self.n;
        self.m2 += delta * (x - self.mean);
    }

    fn variance(&self) -> f64 {
        if self.n < 2.0 {
            0.0
        } else {
            self.m2 / (self.n - 1.0)
        }
    }
}

/// Welch's t between two samples.
fn welch_t(a: &Moments, b: &Moments) -> f64 {
    let se = (a.variance() / a.n + b.variance() / b.n).sqrt();
    if se == 0.0 {
        0.0
    } else {
        (a.mean - b.mean) / se
    }
}

/// Welch's t for each crop: everything, then only the measurements at or below the
/// 50th, 75th, 90th, 95th and 99th percentile of all measurements.
fn crops(samples: &[(usize, f64)]) -> Vec<(&'static str, f64, usize)> {
    let mut sorted: Vec<f64> = samples.iter().map(|(_, x)| *x).collect();
    sorted.sort_by(f64::total_cmp);
    let at = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize];
    let limits = [
        ("all", f64::INFINITY),
        ("p99", at(0.99)),
        ("p95", at(0.95)),
        ("p90", at(0.90)),
        ("p75", at(0.75)),
        ("p50", at(0.50)),
    ];
    limits
        .iter()
        .map(|(name, limit)| {
            let mut classes = [Moments::default(); 2];
            for (class, x) in samples {
                if *x <= *limit {
                    classes[*class].push(*x);
                }
            }
            let kept = (classes[0].n + classes[1].n) as usize;
            (*name, welch_t(&classes[0], &classes[1]), kept)
        })
        .collect()
}

/// Time `run(class)` (which makes `CALLS` calls) `MEASUREMENTS` times, the class drawn
/// at random each time; print every crop's t and return the largest |t|.
fn measure(what: &str, mut run: impl FnMut(usize)) -> f64 {
    let mut rng = Rng::seeded();
    // Warm caches and the branch predictor on both classes first.
    for i in 0..10_000 {
        run(i % 2);
    }
    let mut samples = Vec::with_capacity(MEASUREMENTS);
    for _ in 0..MEASUREMENTS {
        let class = (rng.next() >> 63) as usize;
        let start = Instant::now();
        run(class);
        let elapsed = start.elapsed().as_nanos() as f64;
        samples.push((class, elapsed));
    }
    let results = crops(&samples);
    let worst = results.iter().map(|(_, t, _)| t.abs()).fold(0.0, f64::max);
    for (name, t, kept) in &results {
        println!("{what}: crop {name:>3}: t = {t:+.3} over {kept} measurements");
    }
    println!("{what}: max |t| = {worst:.3} ({MEASUREMENTS} measurements of {CALLS} calls)");
    worst
}

/// `base` with byte `at` changed.
fn differing(base: &[u8; 32], at: usize) -> [u8; 32] {
    let mut out = *base;
    out[at] ^= 0x5a;
    out
}

/// A comparison that returns at the first differing byte: the leak the test must see.
fn early_exit_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    for i in 0..32 {
        if black_box(a[i]) != black_box(b[i]) {
            return false;
        }
    }
    true
}

#[test]
#[ignore = "long tier (10^6 timed measurements): see the module documentation"]
fn raw_comparison_is_constant_time() {
    let mut rng = Rng::seeded();
    let presented = rng.bytes();
    let stored = [differing(&presented, 0), differing(&presented, 31)];
    let worst = measure("ct_eq on 32-byte hashes", |class| {
        let stored = black_box(&stored[class]);
        for _ in 0..CALLS {
            black_box(bool::from(black_box(&presented).ct_eq(stored)));
        }
    });
    assert!(
        worst < T_MAX,
        "|t| = {worst:.3}: the comparison leaks timing"
    );
}

#[test]
#[ignore = "long tier (10^6 timed measurements): see the module documentation"]
fn token_lookup_is_constant_time() {
    // One presented token; two configurations whose stored hash differs from the
    // token's in the first or only in the last byte. Both lookups fail, after the same
    // hashing; only the comparison sees a difference between them.
    let token = "a-presented-bearer-token-of-usual-length";
    let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
    let configured = |at: usize| Tokens {
        entries: vec![
            (differing(&digest, at), "ops".to_owned(), Role::Admin),
            (differing(&digest, at), "shop".to_owned(), Role::Enqueue),
        ],
    };
    let tokens = [configured(0), configured(31)];
    let worst = measure("Tokens::find", |class| {
        let tokens = black_box(&tokens[class]);
        for _ in 0..CALLS {
            black_box(tokens.find(black_box(token)));
        }
    });
    assert!(
        worst < T_MAX,
        "|t| = {worst:.3}: the token lookup leaks timing"
    );
}

#[test]
#[ignore = "long tier control: shows the measurement catches an early-exit comparison"]
fn early_exit_comparison_is_caught() {
    let mut rng = Rng::seeded();
    let presented = rng.bytes();
    let stored = [differing(&presented, 0), differing(&presented, 31)];
    let worst = measure("early-exit comparison (control)", |class| {
        let stored = black_box(&stored[class]);
        for _ in 0..CALLS {
            black_box(early_exit_eq(black_box(&presented), stored));
        }
    });
    assert!(
        worst > 10.0 * T_MAX,
        "|t| = {worst:.3}: the measurement did not see an early-exit comparison"
    );
}
