-- Tenax schema, version 8: the audit log of operator actions (who did what to which
-- object, and when, by the database clock). Additive: a node of the previous version
-- never reads it. Listed newest first by id (the primary key); the filtered listings
-- walk (actor, id) and (action, id). The pruner leaves it alone.
CREATE TABLE tenax_audit (
    id      BIGSERIAL   PRIMARY KEY,
    at      TIMESTAMPTZ NOT NULL,
    actor   TEXT        NOT NULL,
    action  TEXT        NOT NULL,
    target  TEXT        NOT NULL,
    details JSONB       NOT NULL
);
CREATE INDEX tenax_audit_actor ON tenax_audit (actor, id);
CREATE INDEX tenax_audit_action ON tenax_audit (action, id);
