-- Tenax schema, version 7: rate limits per command type. Additive: nodes of earlier
-- versions keep running but know nothing of the limits (they claim limited types
-- unthrottled): finish the deploy before setting a rate limit.
--
-- One token bucket per limited command type. A claim locks the buckets of its limited
-- types (FOR UPDATE, in type order), refills each by the database time elapsed since
-- refilled_ms (at most burst), takes one token per task it may claim and gives the
-- unused ones back. Times are milliseconds since the Unix epoch (UTC).
CREATE TABLE tenax_rate_limits (
    command_type VARCHAR(100) NOT NULL,
    per_second DOUBLE NOT NULL CHECK (per_second > 0 AND per_second <= 1000000),
    burst INT NOT NULL CHECK (burst BETWEEN 1 AND 1000000),
    tokens DOUBLE NOT NULL,
    refilled_ms BIGINT NOT NULL,
    PRIMARY KEY (command_type)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
