-- Tenax schema, version 11: the state of threshold alerts (a queue's backlog or
-- oldest due age), so that an alert is sent when it starts firing and when it
-- resolves, once across all nodes, not at every check. Additive: nodes of earlier
-- versions never read it. Times are DATETIME(6) holding UTC.
CREATE TABLE tenax_alert_state (
    queue  VARCHAR(255) NOT NULL,
    alert  VARCHAR(64)  NOT NULL,
    firing TINYINT      NOT NULL CHECK (firing IN (0, 1)),
    since  DATETIME(6)  NOT NULL,
    PRIMARY KEY (queue, alert)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
