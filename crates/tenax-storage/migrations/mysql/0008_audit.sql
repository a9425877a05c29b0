-- Tenax schema, version 8: the audit log of operator actions (who did what to which
-- object, and when, by the database clock, UTC). Additive: a node of the previous
-- version never reads it. Listed newest first by id (the primary key); the filtered
-- listings walk (actor, id) and (action, id). The pruner leaves it alone. Details are
-- JSON text, written and checked by Tenax.
CREATE TABLE tenax_audit (
    id      BIGINT       NOT NULL AUTO_INCREMENT,
    at      DATETIME(6)  NOT NULL,
    actor   VARCHAR(255) NOT NULL,
    action  VARCHAR(100) NOT NULL,
    target  TEXT         NOT NULL,
    details MEDIUMTEXT   NOT NULL,
    PRIMARY KEY (id),
    KEY tenax_audit_actor (actor, id),
    KEY tenax_audit_action (action, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
