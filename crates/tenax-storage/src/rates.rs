//! Rate limits per command type: a token bucket per type in `tenax_rate_limits`, shared
//! by every node.
//!
//! The claim first learns which of its command types are limited: on PostgreSQL the
//! claim statement itself skips them and names them (no extra round trip); elsewhere,
//! and after a claim that saw limited types, a primary-key probe of the buckets comes
//! first (without limits the claim then runs exactly as before). For limited types it
//! takes tokens in one transaction that locks their bucket rows (in type order, so
//! claimers never deadlock), refills each by the database time elapsed since its last
//! refill (at most `burst`), and takes at most `floor(tokens)` per type, at most the
//! batch in all. It then claims at most the taken number of tasks of each type and
//! gives the unused tokens back (never above `burst`). A token is therefore spent
//! before its task can be claimed: concurrent claimers together never start more tasks
//! than the bucket allows, and a crash between the two steps only loses tokens (the
//! type runs slower for a moment, never faster). A task without a token stays waiting,
//! spends no attempt, and the types without limits are claimed as usual.
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tenax_core::{InvalidInput, TaskRecord};

use crate::common::sort_in_claim_order;
use crate::error::{Result, StorageError};
use crate::params::{RateLimit, RateLimitSetParams, TaskClaimParams};

/// Highest rate, in tokens per second.
pub(crate) const PER_SECOND_MAX: f64 = RateLimit::PER_SECOND_MAX;
/// Largest bucket.
pub(crate) const BURST_MAX: u32 = RateLimit::BURST_MAX;

/// Refuse settings outside the documented bounds.
pub(crate) fn validate(params: &RateLimitSetParams) -> Result<()> {
    tenax_core::validate_command_type(&params.command_type)?;
    if !(params.per_second.is_finite()
        && params.per_second > 0.0
        && params.per_second <= PER_SECOND_MAX)
    {
        return Err(InvalidInput::new(
            "per_second",
            format!("{} must be above 0 and at most 1e6", params.per_second),
        )
        .into());
    }
    if !(1..=BURST_MAX).contains(&params.burst) {
        return Err(InvalidInput::new(
            "burst",
            format!("{} must be between 1 and 1000000", params.burst),
        )
        .into());
    }
    Ok(())
}

/// A bucket row as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bucket {
    pub(crate) command_type: String,
    pub(crate) per_second: f64,
    pub(crate) burst: i64,
    pub(crate) tokens: f64,
    pub(crate) refilled_ms: i64,
}

impl Bucket {
    /// The tokens held at `now_ms` (refilled by the time elapsed, at most `burst`) and
    /// the new refill time; a clock that reads earlier than the last refill adds nothing.
    pub(crate) fn refilled(&self, now_ms: i64) -> (f64, i64) {
        let elapsed = now_ms.saturating_sub(self.refilled_ms).max(0) as f64 / 1000.0;
        let tokens = (self.tokens + self.per_second * elapsed).min(self.burst as f64);
        (tokens.max(0.0), now_ms.max(self.refilled_ms))
    }

    /// Refill to `now_ms` and take at most `want` whole tokens: (taken, tokens left,
    /// new refill time).
    pub(crate) fn take(&self, now_ms: i64, want: u32) -> (u32, f64, i64) {
        let (tokens, at) = self.refilled(now_ms);
        let whole = tokens.floor().min(f64::from(want)).max(0.0);
        let taken = whole as u32;
        (taken, tokens - whole, at)
    }

    /// As the list reports it.
    pub(crate) fn record(&self) -> Result<RateLimit> {
        Ok(RateLimit {
            command_type: self.command_type.clone(),
            per_second: self.per_second,
            burst: u32::try_from(self.burst)
                .map_err(|_| StorageError::Corrupt(format!("burst = {}", self.burst)))?,
            tokens: self.tokens,
            refilled_at: DateTime::<Utc>::from_timestamp_millis(self.refilled_ms).ok_or_else(
                || StorageError::Corrupt(format!("refilled_at = {}", self.refilled_ms)),
            )?,
        })
    }
}

/// What a backend provides for rate-limited claims.
#[async_trait]
pub(crate) trait RatedBackend: Send + Sync {
    /// The limited types among these (no lock).
    async fn rated_types(&self, types: &[String]) -> Result<Vec<String>>;
    /// The database clock in ms since the epoch (or the override).
    async fn clock_ms(&self, now: Option<DateTime<Utc>>) -> Result<i64>;
    /// In one transaction: lock the buckets of these types in type order, refill each to
    /// `now_ms` and take at most `want` tokens in all; returns what each type got.
    async fn take_tokens(
        &self,
        types: &[String],
        want: u32,
        now_ms: i64,
    ) -> Result<Vec<(String, u32)>>;
    /// Return unused tokens (each bucket at most `burst`).
    async fn give_back(&self, back: &[(String, u32)]) -> Result<()>;
    /// The claim without rate limits.
    async fn claim_unrated(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>>;
    /// The claim of the types without a limit, in the statement that also names the
    /// limited types among `params.commands` (claiming none of their tasks). `None`
    /// where the backend has no such statement, or where an earlier claim saw limited
    /// types: those then take their tokens first, so a full batch of unlimited tasks
    /// cannot starve them.
    async fn claim_skipping_rated(
        &self,
        _params: &TaskClaimParams,
    ) -> Result<Option<(Vec<TaskRecord>, Vec<String>)>> {
        Ok(None)
    }
}

/// Take tokens from the locked buckets in order, at most `want` in all; returns what
/// each type got and each bucket's new (tokens, refilled_ms).
pub(crate) fn take_from(
    buckets: &[Bucket],
    want: u32,
    now_ms: i64,
) -> Vec<(String, u32, f64, i64)> {
    let mut left = want;
    buckets
        .iter()
        .map(|bucket| {
            let (taken, tokens, at) = bucket.take(now_ms, left);
            left -= taken;
            (bucket.command_type.clone(), taken, tokens, at)
        })
        .collect()
}

/// The claim, honouring the rate limits of its command types.
pub(crate) async fn claim<B: RatedBackend + ?Sized>(
    backend: &B,
    params: &TaskClaimParams,
) -> Result<Vec<TaskRecord>> {
    if let Some((mut tasks, rated)) = backend.claim_skipping_rated(params).await? {
        let left = params
            .limit
            .saturating_sub(u32::try_from(tasks.len()).unwrap_or(u32::MAX));
        if rated.is_empty() || left == 0 {
            return Ok(tasks);
        }
        // Limited types found by the statement: they take tokens for the room left.
        let of_rated = TaskClaimParams {
            commands: params
                .commands
                .iter()
                .filter(|(t, _)| rated.contains(t))
                .cloned()
                .collect(),
            limit: left,
            ..params.clone()
        };
        match claim_with_tokens(backend, &of_rated, rated).await {
            Ok(more) => tasks.extend(more),
            Err(err) if tasks.is_empty() => return Err(err),
            Err(err) => {
                tracing::warn!(error = %err, "a rate-limited claim failed; returning the unlimited tasks claimed");
            }
        }
        sort_in_claim_order(&mut tasks);
        return Ok(tasks);
    }
    let types: Vec<String> = params.commands.iter().map(|(t, _)| t.clone()).collect();
    let rated = backend.rated_types(&types).await?;
    if rated.is_empty() {
        return backend.claim_unrated(params).await;
    }
    claim_with_tokens(backend, params, rated).await
}

/// Take tokens for the limited types `rated` (in one transaction), claim at most that
/// many tasks of each, give the unused tokens back, then fill the room left with the
/// other types of `params`.
async fn claim_with_tokens<B: RatedBackend + ?Sized>(
    backend: &B,
    params: &TaskClaimParams,
    rated: Vec<String>,
) -> Result<Vec<TaskRecord>> {
    let now_ms = backend.clock_ms(params.now).await?;
    let taken = backend.take_tokens(&rated, params.limit, now_ms).await?;
    let mut tasks = Vec::new();
    let mut back = Vec::new();
    let mut failure = None;
    for (command_type, n) in taken {
        if n == 0 {
            continue;
        }
        if failure.is_some() {
            back.push((command_type, n));
            continue;
        }
        let of_type = TaskClaimParams {
            commands: params
                .commands
                .iter()
                .filter(|(t, _)| *t == command_type)
                .cloned()
                .collect(),
            limit: n,
            ..params.clone()
        };
        match backend.claim_unrated(&of_type).await {
            Ok(got) => {
                let unused = n.saturating_sub(u32::try_from(got.len()).unwrap_or(u32::MAX));
                if unused > 0 {
                    back.push((command_type, unused));
                }
                tasks.extend(got);
            }
            Err(err) => {
                back.push((command_type, n));
                failure = Some(err);
            }
        }
    }
    if !back.is_empty() {
        // Tokens not given back are lost, never double-spent: the type runs slower for
        // a moment. The claimed tasks are still returned.
        if let Err(err) = backend.give_back(&back).await {
            tracing::warn!(error = %err, "could not give unused rate-limit tokens back");
        }
    }
    if let Some(err) = failure {
        if tasks.is_empty() {
            return Err(err);
        }
        tracing::warn!(error = %err, "a rate-limited claim failed; returning the tasks claimed");
        sort_in_claim_order(&mut tasks);
        return Ok(tasks);
    }
    let left = params
        .limit
        .saturating_sub(u32::try_from(tasks.len()).unwrap_or(u32::MAX));
    let unrated: Vec<(String, u32)> = params
        .commands
        .iter()
        .filter(|(t, _)| !rated.contains(t))
        .cloned()
        .collect();
    if left > 0 && !unrated.is_empty() {
        let more = backend
            .claim_unrated(&TaskClaimParams {
                commands: unrated,
                limit: left,
                ..params.clone()
            })
            .await;
        match more {
            Ok(more) => tasks.extend(more),
            Err(err) if tasks.is_empty() => return Err(err),
            Err(err) => {
                tracing::warn!(error = %err, "claim of unlimited types failed; returning the rate-limited tasks claimed");
            }
        }
    }
    sort_in_claim_order(&mut tasks);
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_burst_is_one_second_of_tokens() {
        use crate::params::RateLimit;
        assert_eq!(RateLimit::default_burst(0.5), 1);
        assert_eq!(RateLimit::default_burst(1.0), 1);
        assert_eq!(RateLimit::default_burst(20.0), 20);
        assert_eq!(RateLimit::default_burst(2.5), 3);
        assert_eq!(RateLimit::default_burst(1_000_000.0), 1_000_000);
        assert_eq!(RateLimit::default_burst(f64::INFINITY), 1);
        assert_eq!(RateLimit::default_burst(f64::NAN), 1);
    }

    use super::*;

    fn bucket(per_second: f64, burst: i64, tokens: f64, refilled_ms: i64) -> Bucket {
        Bucket {
            command_type: "T".into(),
            per_second,
            burst,
            tokens,
            refilled_ms,
        }
    }

    #[test]
    fn refill_is_capped_by_burst_and_never_goes_back_in_time() {
        let b = bucket(2.0, 5, 0.5, 1_000);
        assert_eq!(b.refilled(1_500), (1.5, 1_500));
        assert_eq!(b.refilled(100_000), (5.0, 100_000));
        assert_eq!(b.refilled(500), (0.5, 1_000));
        assert_eq!(b.take(2_000, 10), (2, 0.5, 2_000));
        assert_eq!(b.take(2_000, 1), (1, 1.5, 2_000));
    }

    #[test]
    fn takes_at_most_the_batch_across_types() {
        let buckets = [bucket(1.0, 5, 5.0, 0), bucket(1.0, 5, 5.0, 0)];
        let taken: Vec<u32> = take_from(&buckets, 7, 0).iter().map(|t| t.1).collect();
        assert_eq!(taken, vec![5, 2]);
    }
}
