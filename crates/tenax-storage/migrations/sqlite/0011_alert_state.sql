-- Tenax schema, version 11: the state of threshold alerts (a queue's backlog or
-- oldest due age), so that an alert is sent when it starts firing and when it
-- resolves, once across all nodes, not at every check. Additive: nodes of earlier
-- versions never read it. Times are UTC milliseconds.
CREATE TABLE tenax_alert_state (
    queue  TEXT    NOT NULL,
    alert  TEXT    NOT NULL,
    firing INTEGER NOT NULL CHECK (firing IN (0, 1)),
    since  INTEGER NOT NULL,
    PRIMARY KEY (queue, alert)
);
