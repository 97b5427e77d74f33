-- One row the store's health probe rewrites while writes fail: a small committed write that
-- says when the database takes writes again.
CREATE TABLE fabric_health (
    id INTEGER PRIMARY KEY,
    beat INTEGER NOT NULL
);
INSERT INTO fabric_health (id, beat) VALUES (1, 0);
