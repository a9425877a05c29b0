//! Retry policies: how long to wait after a failed attempt.
//!
//! A policy has a [`Backoff`] shape that gives the *ceiling* for attempt `n` (1-based,
//! the attempt that just failed), capped at [`RetryPolicy::cap`]:
//!
//! - [`Backoff::Exponential`] (default): `base × 2^(n−1)`; with the defaults 5 s, 10 s,
//!   20 s, ... up to one hour;
//! - [`Backoff::Fixed`]: `base` for every attempt;
//! - [`Backoff::Linear`]: `base + step × (n−1)`;
//! - [`Backoff::Custom`]: a function of the attempt number.
//!
//! Jitter spreads retries of tasks that failed together (a downstream outage) so they do
//! not return together:
//!
//! - [`Jitter::Full`] (default): uniform in `[0, ceiling]`;
//! - [`Jitter::Equal`]: uniform in `[ceiling/2, ceiling]`;
//! - [`Jitter::None`]: exactly the ceiling.
//!
//! A [load-aware](LoadAware) policy stretches the drawn delay with the backlog of the
//! task's queue: `delay × 2 × (1 + load_factor)`, where `load_factor = due backlog /
//! capacity`, capped at [`LoadAware::max_load_factor`]. A busy queue retries its
//! failures later, so retries do not crowd out fresh work.
//!
//! A handler's [`CommandError::RetryAfter`](crate::CommandError::RetryAfter) wins over
//! the policy, clamped to [`RetryPolicy::max_retry_after`].
//!
//! All arithmetic saturates: no attempt number or backlog overflows or panics.
use std::fmt;
use std::sync::Arc;
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

/// A user-supplied backoff: the ceiling for a failed attempt number (1-based). The
/// policy still caps it at [`RetryPolicy::cap`] and applies its jitter.
pub type BackoffFn = Arc<dyn Fn(u32) -> Duration + Send + Sync>;

/// The shape of the backoff ceiling as attempts fail.
#[derive(Clone, Default)]
pub enum Backoff {
    /// `base × 2^(n−1)`.
    #[default]
    Exponential,
    /// `base` for every attempt.
    Fixed,
    /// `base + step × (n−1)`.
    Linear {
        /// Added per failed attempt after the first.
        step: Duration,
    },
    /// A function of the failed attempt number.
    Custom(BackoffFn),
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backoff::Exponential => f.write_str("Exponential"),
            Backoff::Fixed => f.write_str("Fixed"),
            Backoff::Linear { step } => f.debug_struct("Linear").field("step", step).finish(),
            Backoff::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// Stretch retries with the backlog of the task's queue (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAware {
    /// Due tasks the queue is expected to absorb without strain (at least 1): the
    /// backlog at which the load factor is 1.
    pub capacity: u64,
    /// The largest load factor (defaults to 4): a delay is stretched at most
    /// `2 × (1 + max_load_factor)` times.
    pub max_load_factor: f64,
}

impl LoadAware {
    /// Default for [`LoadAware::max_load_factor`].
    pub const MAX_LOAD_FACTOR_DEFAULT: f64 = 4.0;

    /// Load factor 1 at a backlog of `capacity` due tasks, capped at 4.
    pub const fn new(capacity: u64) -> Self {
        Self {
            capacity,
            max_load_factor: Self::MAX_LOAD_FACTOR_DEFAULT,
        }
    }

    /// `backlog / capacity`, capped at [`LoadAware::max_load_factor`] (a NaN or
    /// negative cap counts as 0).
    pub fn load_factor(&self, backlog: u64) -> f64 {
        let max = if self.max_load_factor.is_finite() {
            self.max_load_factor.max(0.0)
        } else if self.max_load_factor == f64::INFINITY {
            f64::MAX
        } else {
            0.0
        };
        (backlog as f64 / self.capacity.max(1) as f64).min(max)
    }

    /// `delay × 2 × (1 + load_factor)`, saturating at [`Duration::MAX`].
    pub fn stretch(&self, delay: Duration, backlog: u64) -> Duration {
        let factor = 2.0 * (1.0 + self.load_factor(backlog));
        Duration::try_from_secs_f64(delay.as_secs_f64() * factor).unwrap_or(Duration::MAX)
    }
}

/// Backoff with jitter and a cap; optionally load-aware.
#[derive(Debug, Clone)]
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
    /// How the ceiling grows with failed attempts. Defaults to
    /// [`Backoff::Exponential`].
    pub backoff: Backoff,
    /// Stretch delays with the queue's due backlog. Defaults to `None`.
    pub load: Option<LoadAware>,
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
            backoff: Backoff::Exponential,
            load: None,
        }
    }

    /// The same `interval` after every failed attempt, no jitter.
    pub const fn fixed(interval: Duration) -> Self {
        Self {
            base: interval,
            cap: interval,
            jitter: Jitter::None,
            max_retry_after: Self::MAX_RETRY_AFTER_DEFAULT,
            backoff: Backoff::Fixed,
            load: None,
        }
    }

    /// `base + step × (n−1)` after failed attempt `n`, capped at `cap`, full jitter.
    pub const fn linear(base: Duration, step: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Full,
            max_retry_after: Self::MAX_RETRY_AFTER_DEFAULT,
            backoff: Backoff::Linear { step },
            load: None,
        }
    }

    /// `ceiling(n)` after failed attempt `n`, capped at `cap`, full jitter.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tenax_core::{Jitter, RetryPolicy};
    /// // 1 s, 4 s, 9 s, ... (quadratic), at most 10 minutes.
    /// let policy = RetryPolicy::custom(|n| Duration::from_secs(u64::from(n).saturating_pow(2)),
    ///                                  Duration::from_secs(600))
    ///     .with_jitter(Jitter::None);
    /// assert_eq!(policy.ceiling(3), Duration::from_secs(9));
    /// assert_eq!(policy.ceiling(100), Duration::from_secs(600));
    /// ```
    pub fn custom(
        ceiling: impl Fn(u32) -> Duration + Send + Sync + 'static,
        cap: Duration,
    ) -> Self {
        let mut policy = Self::exponential(Duration::ZERO, cap);
        policy.backoff = Backoff::Custom(Arc::new(ceiling));
        policy
    }

    /// The same policy with another jitter.
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The same policy, stretched with the queue's backlog.
    pub const fn with_load(mut self, load: LoadAware) -> Self {
        self.load = Some(load);
        self
    }

    /// The same policy with another longest retry-after.
    pub const fn with_max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// The largest delay after failed attempt `attempt` (1-based), before any load
    /// stretch: the backoff shape's value, at most [`RetryPolicy::cap`].
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let n = attempt.max(1);
        let raw = match &self.backoff {
            Backoff::Exponential => {
                let exponent = (n - 1).min(63);
                let factor = 1u64 << exponent;
                let base_ms = u64::try_from(self.base.as_millis()).unwrap_or(u64::MAX);
                Duration::from_millis(base_ms.saturating_mul(factor))
            }
            Backoff::Fixed => self.base,
            Backoff::Linear { step } => self.base.saturating_add(step.saturating_mul(n - 1)),
            Backoff::Custom(ceiling) => ceiling(n),
        };
        let cap_ms = u64::try_from(self.cap.as_millis()).unwrap_or(u64::MAX);
        let raw_ms = u64::try_from(raw.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(raw_ms.min(cap_ms))
    }

    /// The delay before the next attempt after failed attempt `attempt`, drawn with
    /// `rng` (inject a seeded generator in tests), without load stretch.
    pub fn delay<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Duration {
        let ceiling = u64::try_from(self.ceiling(attempt).as_millis()).unwrap_or(u64::MAX);
        let ms = match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => rng.random_range(0..=ceiling),
            Jitter::Equal => rng.random_range(ceiling / 2..=ceiling),
        };
        Duration::from_millis(ms)
    }

    /// [`RetryPolicy::delay`], stretched by the [load-aware](LoadAware) variant with
    /// `backlog` (the due backlog of the task's queue) when the policy has one.
    pub fn delay_under_load<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        backlog: u64,
        rng: &mut R,
    ) -> Duration {
        let delay = self.delay(attempt, rng);
        match &self.load {
            Some(load) => load.stretch(delay, backlog),
            None => delay,
        }
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
    fn fixed_linear_and_custom_shapes() {
        let fixed = RetryPolicy::fixed(Duration::from_secs(30));
        let mut rng = StdRng::seed_from_u64(1);
        assert!((1..=5).all(|n| fixed.delay(n, &mut rng) == Duration::from_secs(30)));
        let linear = RetryPolicy::linear(
            Duration::from_secs(10),
            Duration::from_secs(5),
            Duration::from_secs(22),
        )
        .with_jitter(Jitter::None);
        let secs: Vec<u64> = (1..=5).map(|n| linear.ceiling(n).as_secs()).collect();
        assert_eq!(secs, [10, 15, 20, 22, 22]);
        let custom = RetryPolicy::custom(|n| Duration::from_secs(u64::from(n) * 7), Duration::MAX)
            .with_jitter(Jitter::None);
        assert_eq!(custom.delay(3, &mut rng), Duration::from_secs(21));
    }

    #[test]
    fn load_aware_follows_interval_times_two_times_one_plus_load() {
        let policy = RetryPolicy::fixed(Duration::from_secs(10)).with_load(LoadAware::new(100));
        let mut rng = StdRng::seed_from_u64(1);
        // Idle queue: 10 s × 2 × (1 + 0) = 20 s.
        assert_eq!(
            policy.delay_under_load(1, 0, &mut rng),
            Duration::from_secs(20)
        );
        // Backlog 50 of capacity 100: 10 s × 2 × 1.5 = 30 s.
        assert_eq!(
            policy.delay_under_load(1, 50, &mut rng),
            Duration::from_secs(30)
        );
        // The load factor is capped at 4: 10 s × 2 × 5 = 100 s, however deep the backlog.
        assert_eq!(
            policy.delay_under_load(1, u64::MAX, &mut rng),
            Duration::from_secs(100)
        );
        // Without a load-aware variant the backlog is ignored.
        let plain = RetryPolicy::fixed(Duration::from_secs(10));
        assert_eq!(
            plain.delay_under_load(1, 1_000, &mut rng),
            Duration::from_secs(10)
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
        fn every_shape_stays_within_its_bounds(attempt in 1u32..=u32::MAX, seed in any::<u64>(),
                                               shape in 0u8..4, jitter in 0u8..3,
                                               base_ms in 0u64..u64::MAX, step_ms in any::<u64>(),
                                               cap_ms in any::<u64>(), backlog in any::<u64>(),
                                               capacity in any::<u64>()) {
            let base = Duration::from_millis(base_ms);
            let cap = Duration::from_millis(cap_ms);
            let policy = match shape {
                0 => RetryPolicy::exponential(base, cap),
                1 => RetryPolicy { cap, ..RetryPolicy::fixed(base) },
                2 => RetryPolicy::linear(base, Duration::from_millis(step_ms), cap),
                _ => RetryPolicy::custom(move |n| Duration::from_millis(step_ms).saturating_mul(n), cap),
            };
            let jitter = [Jitter::None, Jitter::Full, Jitter::Equal][usize::from(jitter)];
            let policy = policy.with_jitter(jitter).with_load(LoadAware::new(capacity));
            let mut rng = StdRng::seed_from_u64(seed);
            let ceiling = policy.ceiling(attempt);
            prop_assert!(ceiling <= cap);
            let delay = policy.delay(attempt, &mut rng);
            prop_assert!(delay <= ceiling);
            if jitter == Jitter::Equal {
                prop_assert!(delay.as_millis() >= ceiling.as_millis() / 2);
            }
            let stretched = policy.delay_under_load(attempt, backlog, &mut StdRng::seed_from_u64(seed));
            prop_assert!(stretched >= delay);
            // The stretch is bounded by 2 × (1 + max_load_factor) = 10 times the delay.
            prop_assert!(stretched.as_secs_f64() <= delay.as_secs_f64() * 10.0 * (1.0 + 1e-9) + 1e-6);
        }

        #[test]
        fn linear_grows_by_its_step(attempt in 1u32..10_000, base_s in 0u64..1_000, step_s in 0u64..1_000) {
            let policy = RetryPolicy::linear(Duration::from_secs(base_s), Duration::from_secs(step_s), Duration::MAX)
                .with_jitter(Jitter::None);
            prop_assert_eq!(policy.ceiling(attempt), Duration::from_secs(base_s + step_s * u64::from(attempt - 1)));
            prop_assert!(policy.ceiling(attempt) <= policy.ceiling(attempt + 1));
        }

        #[test]
        fn load_aware_interval_is_monotone_in_backlog(a in any::<u64>(), b in any::<u64>(),
                                                      capacity in any::<u64>(), delay_ms in any::<u64>(),
                                                      max_factor in 0.0f64..1e6) {
            let load = LoadAware { capacity, max_load_factor: max_factor };
            let delay = Duration::from_millis(delay_ms);
            let (low, high) = (a.min(b), a.max(b));
            prop_assert!(load.load_factor(low) <= load.load_factor(high));
            prop_assert!(load.load_factor(high) <= max_factor);
            prop_assert!(load.stretch(delay, low) <= load.stretch(delay, high));
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
