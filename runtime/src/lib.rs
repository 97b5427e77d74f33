//! Fabric Runtime: a workflow-graph runtime for staged LLM routes.
//!
//! Modules in the order data flows; each imports only modules above it (a test checks):
//!
//! - leaves: [`diag`] (located problems), [`textfile`] (bounded reads), [`source`] (catalogue
//!   files), [`yaml`] (located YAML trees), [`redact`] (URLs without secrets), [`cancel`],
//!   [`failure`] (reason classes), [`events`], [`otel`], [`structured`] (Python-parity replies),
//!   [`decision`] (the decision loop's replies);
//! - [`llm`]: the model port, its decorators, the stub and the providers, and [`llm::model`]
//!   (provider kinds, model strings, targets); [`config`]: settings from the environment;
//! - [`defs`] → [`prompt`] → [`loader`] → [`hydrate`] → [`svg`] → [`catalogue`]: files become
//!   definitions, prompts resolve, routes become graphs (and their SVG pictures);
//! - [`tools`]: the tool port (HTTP and in-process tools); [`exec`]: the walker and the decision
//!   loop;
//! - [`runtime`]: the facade every front end (`fabric`, `fabric serve`, Python) is a shell over.

pub mod api;
pub mod cancel;
pub mod catalogue;
pub mod config;
pub mod decision;
pub mod defs;
pub mod diag;
pub mod events;
pub mod exec;
pub mod failure;
pub mod hydrate;
pub mod llm;
pub mod loader;
pub mod otel;
pub mod prompt;
pub mod redact;
pub mod runtime;
pub mod source;
pub mod store;
pub mod structured;
pub mod svg;
pub mod textfile;
pub mod tools;
pub mod yaml;
