//! Retry policies: exponential backoff with jitter, capped.
//!
//! The ceiling for attempt `n` (1-based, the attempt that just failed) is
//! `min(cap, base × 2^(n−1))`: with the defaults 5 s, 10 s, 20 s, ... up to one hour.
//! Jitter spreads retries of tasks that failed together (a downstream outage) so they do
//! not return together:
//!
//! - [`Jitter::Full`] (default): uniform in `[0, ceiling]`;
//! - [`Jitter::Equal`]: uniform in `[ceiling/2, ceiling]`;
//! - [`Jitter::None`]: exactly the ceiling.
//!
//! All arithmetic saturates: no attempt number overflows or panics.
use std::time::Duration;

use rand::Rng;

/// How a random delay is drawn below the backoff ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// Exactly the ceiling (deterministic; useful in tests).
    None,
    /// Uniform in `[0, ceiling]`.
    #[default]
    Full,
    /// Uniform in `[ceiling / 2, ceiling]`.
    Equal,
}

/// Exponential backoff with jitter and a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The ceiling after the first failed attempt. Defaults to 5 seconds.
    pub base: Duration,
    /// The largest ceiling. Defaults to 1 hour.
    pub cap: Duration,
    /// How the delay is drawn below the ceiling. Defaults to [`Jitter::Full`].
    pub jitter: Jitter,
    /// The longest delay a [`CommandError::RetryAfter`](crate::CommandError::RetryAfter)
    /// may ask for. Defaults to 24 hours.
    pub max_retry_after: Duration,
}

impl RetryPolicy {
    /// Default for [`RetryPolicy::base`].
    pub const BASE_DEFAULT: Duration = Duration::from_secs(5);
    /// Default for [`RetryPolicy::cap`].
    pub const CAP_DEFAULT: Duration = Duration::from_secs(3600);
    /// Default for [`RetryPolicy::max_retry_after`].
    pub const MAX_RETRY_AFTER_DEFAULT: Duration = Duration::from_secs(24 * 3600);

    /// Exponential backoff from `base`, capped at `cap`, full jitter.
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Full,
            max_retry_after: Self::MAX_RETRY_AFTER_DEFAULT,
        }
    }

    /// The same policy with another jitter.
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The largest delay after failed attempt `attempt` (1-based):
    /// `min(cap, base × 2^(attempt−1))`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << exponent;
        let base_ms = u64::try_from(self.base.as_millis()).unwrap_or(u64::MAX);
        let cap_ms = u64::try_from(self.cap.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(base_ms.saturating_mul(factor).min(cap_ms))
    }

    /// The delay before the next attempt after failed attempt `attempt`, drawn with
    /// `rng` (inject a seeded generator in tests).
    pub fn delay<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Duration {
        let ceiling = u64::try_from(self.ceiling(attempt).as_millis()).unwrap_or(u64::MAX);
        let ms = match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => rng.random_range(0..=ceiling),
            Jitter::Equal => rng.random_range(ceiling / 2..=ceiling),
        };
        Duration::from_millis(ms)
    }

    /// A handler's "retry after" request, clamped to [`RetryPolicy::max_retry_after`].
    pub fn clamp_retry_after(&self, after: Duration) -> Duration {
        after.min(self.max_retry_after)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::exponential(Self::BASE_DEFAULT, Self::CAP_DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn default_schedule_doubles_from_five_seconds_and_caps_at_one_hour() {
        let policy = RetryPolicy::default();
        let secs: Vec<u64> = (1..=12).map(|n| policy.ceiling(n).as_secs()).collect();
        assert_eq!(
            secs,
            [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]
        );
    }

    #[test]
    fn full_jitter_spreads_retries_of_one_attempt() {
        // Herd check: 10,000 delays for the same attempt are spread out.
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<f64> = (0..10_000)
            .map(|_| policy.delay(10, &mut rng).as_millis() as f64)
            .collect();
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        let var = delays.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / delays.len() as f64;
        let cv = var.sqrt() / mean;
        assert!(cv >= 0.25, "coefficient of variation {cv}");
        let mut sorted = delays.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        assert!(sorted.len() >= 9_900, "{} distinct delays", sorted.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn delay_never_exceeds_the_cap(attempt in any::<u32>(), seed in any::<u64>(),
                                       base_ms in 0u64..10_000_000, cap_ms in 0u64..100_000_000) {
            let policy = RetryPolicy::exponential(Duration::from_millis(base_ms), Duration::from_millis(cap_ms));
            let mut rng = StdRng::seed_from_u64(seed);
            let delay = policy.delay(attempt, &mut rng);
            prop_assert!(delay <= policy.cap);
            prop_assert!(delay <= policy.ceiling(attempt));
        }

        #[test]
        fn full_jitter_lies_in_zero_to_ceiling(attempt in 1u32..80, seed in any::<u64>()) {
            let policy = RetryPolicy::default();
            let mut rng = StdRng::seed_from_u64(seed);
            let ceiling = policy.ceiling(attempt);
            let expected = std::cmp::min(policy.cap, policy.base.saturating_mul(1u32 << (attempt - 1).min(31)));
            prop_assert_eq!(ceiling, expected);
            prop_assert!(policy.delay(attempt, &mut rng) <= ceiling);
        }

        #[test]
        fn equal_jitter_lies_in_half_to_ceiling(attempt in 1u32..80, seed in any::<u64>()) {
            let policy = RetryPolicy::default().with_jitter(Jitter::Equal);
            let mut rng = StdRng::seed_from_u64(seed);
            let ceiling = policy.ceiling(attempt);
            let delay = policy.delay(attempt, &mut rng);
            prop_assert!(delay <= ceiling);
            prop_assert!(delay.as_millis() >= ceiling.as_millis() / 2);
        }

        #[test]
        fn ceiling_is_monotone(attempt in 1u32..u32::MAX) {
            let policy = RetryPolicy::default();
            prop_assert!(policy.ceiling(attempt) <= policy.ceiling(attempt + 1));
        }

        #[test]
        fn retry_after_is_clamped(secs in any::<u64>()) {
            let policy = RetryPolicy::default();
            let clamped = policy.clamp_retry_after(Duration::from_secs(secs));
            prop_assert!(clamped <= policy.max_retry_after);
            prop_assert!(clamped <= Duration::from_secs(secs));
        }
    }
}
