-- The versions applied, per component (``aqw db migrate``).
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.aqw_migrations (
    component text NOT NULL,
    version integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
);
