-- Tenax schema, version 11: the state of threshold alerts (a queue's backlog or
-- oldest due age), so that an alert is sent when it starts firing and when it
-- resolves, once across all nodes, not at every check. Additive: nodes of earlier
-- versions never read it.
CREATE TABLE tenax_alert_state (
    queue  TEXT        NOT NULL,
    alert  TEXT        NOT NULL,
    firing BOOLEAN     NOT NULL,
    since  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (queue, alert)
);
