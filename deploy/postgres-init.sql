-- One database per fleet on the shared server: a fleet lists and serves only its own runs.
-- (Run once, when the server's data volume is new; the runtime creates its tables itself.)
CREATE DATABASE fabric_shared OWNER fabric;
CREATE DATABASE fabric_custom OWNER fabric;
