//! The outbox of outbound deliveries on PostgreSQL (see [`crate::outbox`]): the
//! statements are [`crate::shared::outbox`]'s, but for the claim and the settle, each one
//! statement here (with the clock inside it: the caller's override, else `now()`).
use super::{map_err, PgStorage, NOW};
use crate::common::duration_ms;
use crate::error::Result;
use crate::outbox::{
    settle_parts, validate_claim, validate_settle, OutboxClaimParams, OutboxRecord,
    OutboxSettleParams, OutboxStatus,
};

crate::shared::outbox::outbox_statements!(crate::postgres::PgStorage, sqlx::Postgres);

impl PgStorage {
    pub(super) async fn outbox_claim_impl(
        &self,
        params: &OutboxClaimParams,
    ) -> Result<Vec<OutboxRecord>> {
        validate_claim(params)?;
        let rows = sqlx::query(&format!(
            "WITH due AS (
                 SELECT id FROM tenax_outbox
                 WHERE status = 'pending' AND kind = $2 AND next_attempt_at <= {NOW}
                 ORDER BY next_attempt_at, id LIMIT $3
                 FOR UPDATE SKIP LOCKED)
             UPDATE tenax_outbox o
             SET attempts = o.attempts + 1,
                 next_attempt_at = {NOW} + $4::float8 * interval '1 millisecond'
             FROM due WHERE o.id = due.id
             RETURNING o.id, o.delivery_id, o.kind, o.task_id, o.url, o.body, o.status,
                       o.attempts, o.next_attempt_at, o.last_error, o.created_at, o.settled_at"
        ))
        .bind(params.now)
        .bind(params.kind.as_str())
        .bind(i64::from(params.limit))
        .bind(duration_ms(params.lease) as f64)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        let mut records = rows
            .iter()
            .map(shared::record_from_row)
            .collect::<Result<Vec<_>>>()?;
        records.sort_by_key(|r| r.id);
        Ok(records)
    }

    pub(super) async fn outbox_settle_impl(&self, params: &OutboxSettleParams) -> Result<u64> {
        if !validate_settle(params)? {
            return Ok(0);
        }
        let (status, delay, max_age, error) = settle_parts(&params.outcome);
        let ids: Vec<i64> = params.claims.iter().map(|c| c.id).collect();
        let attempts: Vec<i32> = params
            .claims
            .iter()
            .map(|c| i32::try_from(c.attempts).unwrap_or(i32::MAX))
            .collect();
        // $2: the new status, or NULL for a retry, which stays pending unless the next
        // attempt would come after the row's maximum age.
        let done = sqlx::query(&format!(
            "WITH c AS (SELECT * FROM UNNEST($6::int8[], $7::int4[]) AS c(id, attempts)),
                  s AS (SELECT o.id,
                               COALESCE($2::text,
                                        CASE WHEN {NOW} + $3::float8 * interval '1 millisecond'
                                                  > o.created_at + $4::float8 * interval '1 millisecond'
                                             THEN 'expired' ELSE 'pending' END) AS status
                        FROM tenax_outbox o JOIN c ON c.id = o.id AND c.attempts = o.attempts
                        WHERE o.status = 'pending')
             UPDATE tenax_outbox o
             SET status = s.status,
                 settled_at = CASE WHEN s.status = 'pending' THEN NULL ELSE {NOW} END,
                 next_attempt_at = {NOW} + $3::float8 * interval '1 millisecond',
                 last_error = COALESCE($5, o.last_error)
             FROM s WHERE o.id = s.id AND o.status = 'pending'"
        ))
        .bind(params.now)
        .bind((status != OutboxStatus::Pending).then(|| status.as_str()))
        .bind(duration_ms(delay) as f64)
        .bind(duration_ms(max_age) as f64)
        .bind(error)
        .bind(&ids)
        .bind(&attempts)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
