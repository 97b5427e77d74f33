-- Catalogue versions (runtime/src/version.rs): each version's sources (route files, prompt packs,
-- stub scripts) stored once under their SHA-256, so any replica can rebuild the catalogue a run
-- started on; `body` is the sources as JSON. Every run records the version it started on (NULL for
-- a run accepted before this migration: it runs on the catalogue loaded).
CREATE TABLE catalogue_versions (
    version TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL
);
ALTER TABLE runs ADD COLUMN catalogue_version TEXT;
